"""One module per paper; importing a module registers its claims in ``verify.claim.REGISTRY``."""
PAPER_MODULES = ("clair", "fedrep", "flute", "rolora", "fedavg_ft", "adapters")

from . import adapters, clair_sec8, rolora_sec5_2  # noqa: E402,F401  torch-only claims (torch imported in their tasks)


def load_all(papers=None) -> dict:
    """Import the claim modules of ``papers`` (default: all five).

    Returns ``{"loaded": [...], "missing": [...]}``; a module that exists but fails to import
    raises (see :func:`verify.runner.load_modules`).
    """
    from ..runner import load_modules

    return load_modules(__name__, papers)
