"""One package per paper (``verify.claims.<paper>``); importing a package registers its claims in
``verify.claim.REGISTRY``, in the order its ``__init__`` imports its topic modules (the report's
order). Torch-only topics import torch inside their tasks, so every package imports without it."""
PAPER_MODULES = ("clair", "fedrep", "flute", "rolora", "fedavg_ft", "adapters")


def load_all(papers=None) -> dict:
    """Import the claim packages of ``papers`` (default: all six).

    Returns ``{"loaded": [...], "missing": [...]}``; a package that exists but fails to import
    raises (see :func:`verify.runner.load_modules`).
    """
    from ..runner import load_modules

    return load_modules(__name__, papers)
