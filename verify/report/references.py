"""The five papers the claims come from, as BibTeX-style entries (titles and authors as printed on
each paper's first page)."""
from __future__ import annotations

__all__ = ["REFERENCES", "SHORT_NAMES", "bibtex", "citation"]

SHORT_NAMES = {"clair": "CLAIR", "fedrep": "FedRep", "flute": "FLUTE", "rolora": "RoLoRA",
               "fedavg_ft": "FedAvg-FT"}

#: paper key -> BibTeX fields (``type`` is the entry type, ``key`` the citation key).
REFERENCES = {
    "clair": {
        "type": "misc", "key": "he2026clair",
        "title": "Federated LoRA Fine-Tuning for LLMs via Collaborative Alignment",
        "author": "Shuaida He and Liwen Chen and Long Feng",
        "howpublished": "arXiv:2605.21217 [stat.ML]", "year": "2026",
    },
    "fedrep": {
        "type": "inproceedings", "key": "collins2021fedrep",
        "title": "Exploiting Shared Representations for Personalized Federated Learning",
        "author": "Liam Collins and Hamed Hassani and Aryan Mokhtari and Sanjay Shakkottai",
        "booktitle": "Proceedings of the 38th International Conference on Machine Learning (ICML)",
        "year": "2021",
        "note": "venue not printed on the first page of the copy used",
    },
    "flute": {
        "type": "inproceedings", "key": "liu2024flute",
        "title": "Federated Representation Learning in the Under-Parameterized Regime",
        "author": "Renpu Liu and Cong Shen and Jing Yang",
        "booktitle": "Proceedings of the 41st International Conference on Machine Learning (ICML)",
        "year": "2024",
    },
    "rolora": {
        "type": "misc", "key": "chen2025rolora",
        "title": "Robust Federated Finetuning of LLMs via Alternating Optimization of LoRA",
        "author": "Shuangyi Chen and Yuanxin Guo and Yue Ju and Hardik Dalal and Ashish Khisti",
        "howpublished": "preprint in ICML format", "year": "2025",
    },
    "fedavg_ft": {
        "type": "inproceedings", "key": "collins2022fedavg",
        "title": "FedAvg with Fine Tuning: Local Updates Lead to Representation Learning",
        "author": "Liam Collins and Hamed Hassani and Aryan Mokhtari and Sanjay Shakkottai",
        "booktitle": "Advances in Neural Information Processing Systems 35 (NeurIPS)",
        "year": "2022",
        "note": "venue not printed on the first page of the copy used",
    },
}


def bibtex(paper: str) -> str:
    """The BibTeX entry of ``paper``."""
    ref = REFERENCES[paper]
    fields = [(k, v) for k, v in ref.items() if k not in ("type", "key")]
    body = ",\n".join(f"  {k} = {{{v}}}" for k, v in fields)
    return f"@{ref['type']}{{{ref['key']},\n{body}\n}}"


def citation(paper: str) -> str:
    """Short citation: ``Collins et al. (2021)``."""
    ref = REFERENCES.get(paper)
    if ref is None:
        return paper
    authors = ref["author"].split(" and ")
    last = authors[0].split()[-1]
    who = last if len(authors) == 1 else (f"{last} and {authors[1].split()[-1]}" if len(authors) == 2
                                         else f"{last} et al.")
    return f"{who} ({ref['year']})"
