"""One module per paper; importing this package registers every claim."""
from importlib import import_module

PAPER_MODULES = ("clair", "fedrep", "flute", "rolora", "fedavg_ft")


def load_all() -> None:
    """Import every paper's claim module (registration happens at import)."""
    for name in PAPER_MODULES:
        import_module(f"{__name__}.{name}")
