"""Make LoRA adapters with PEFT on a tiny Llama, then aggregate them with CLAIR.

    pip install ".[peft]"            # torch, peft, transformers
    python examples/clair_on_peft_adapters.py [WORKDIR]      # default: a new temporary folder

Five clients fine-tune LoRA (r = 4 on q_proj / v_proj) of the same tiny Llama (built from a
config, nothing downloaded). Four start from the server's common LoRA initialisation and learn
the same task; the fifth brings its own initialisation and a different task. Each saves its
adapter with ``save_pretrained``; ``lowrank-fl adapters aggregate`` then writes the split
layout (``OUT/shared/``, the collaborative part of the refinement, once — the default
``--refine exchangeable``; ``--refine paper`` is (9) — and each client's own part
``OUT/<client>/`` with the weight ``a_k`` of the shared part) and a summary; the example loads
back the refined update of a client whose weight is above 0 with
:func:`lowrank_fl.adapters.peft_load.load_split` (its own part and the shared part active in one
``PeftModel``; a client of weight 0 loads its own adapter alone), and writes the outputs again
as one merged adapter per client truncated to rank 8 with ``--rank-out`` (the truncation error
printed). It checks the detection against the truth (the fifth client flagged in every module,
the four others kept in every module) and exits with status 1 and the reason if it is not.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from peft import LoraConfig, get_peft_model

from lowrank_fl.adapters.peft_load import load_split
from lowrank_fl.cli import main as lowrank_fl

VOCAB, K = 64, 5


def base_model():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=4, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg)


def train_client(k: int, contaminated: bool, out: Path) -> None:
    base = base_model()                # seeds torch itself, so the LoRA seed must come after it
    torch.manual_seed(1000 + k if contaminated else 1000)      # the LoRA initialisation
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                    target_modules=["q_proj", "v_proj"]))
    gen = torch.Generator().manual_seed(k)                      # each client's own data
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=5e-3)
    for _ in range(8):
        x = torch.randint(0, VOCAB, (8, 12), generator=gen)
        y = (3 * x + 7) % VOCAB if contaminated else (x + 1) % VOCAB
        loss = model(input_ids=x, labels=y).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(str(out))


def main(workdir: Path) -> None:
    clients = [workdir / f"client{k}" for k in range(K)]
    for k, d in enumerate(clients):
        train_client(k, contaminated=(k == K - 1), out=d)
    out = workdir / "clair"
    lowrank_fl(["adapters", "aggregate", *map(str, clients), "--method", "clair",
                f"--out={out}", "--overwrite"])
    summary = json.loads((out / "summary.json").read_text())
    wrong = []
    for name, m in summary["modules"].items():
        print(f"{name}: benign {m['benign']}, reduced {m['reduced_dims']}, "
              f"lam_L {m['lam_L']:.3g}, lam_S {m['lam_S']:.3g}, gap {m['relative_gap']:.1e}")
        if m["benign"] != [True] * (K - 1) + [False]:
            wrong.append(name)
    weights = {n: c["weight"] for n, c in summary["refinement"]["clients"].items()}
    name = max(weights, key=weights.get)                  # the client that takes most of the shared part
    model = load_split(base_model(), out, name)           # its own part + the shared part at weight a_k
    print(f"{name}'s refined update (a_k = {weights[name]:.3f}) loads in PEFT:", type(model).__name__,
          "active adapters", model.base_model.active_adapters)
    # merged, each client's adapter has rank up to r + q' (q' <= sum of the clients' ranks), here
    # 4 + 20: --rank-out truncates them by SVD and prints the largest relative error it made
    lowrank_fl(["adapters", "aggregate", *map(str, clients), "--method", "clair",
                f"--out={workdir / 'clair_r8'}", "--rank-out", "8", "--overwrite", "--quiet"])
    if wrong:
        sys.exit(f"detection is wrong in {len(wrong)}/{len(summary['modules'])} modules "
                 f"(expected client{K - 1} alone flagged): {wrong}")
    print(f"detection is right: client{K - 1} (own initialisation, other task) is flagged in "
          f"every module, client0..client{K - 2} are kept in every module")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("workdir", nargs="?", type=Path, default=None,
                    help="folder for the clients' adapters and the outputs (default: a new temporary folder)")
    args = ap.parse_args()
    main((args.workdir or Path(tempfile.mkdtemp())).resolve())
