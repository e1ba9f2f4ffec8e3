"""Write a comparison to a directory: ``compare.json``, ``compare.md`` and ``compare.png``."""
from __future__ import annotations

from pathlib import Path

from .figure import plot_comparison

__all__ = ["OUTPUT_FILES", "check_out_dir", "save"]

OUTPUT_FILES = ("compare.json", "compare.md", "compare.png")


def check_out_dir(out, *, overwrite: bool = False) -> Path:
    """``out`` as a Path; ``ValueError`` if it is a file, or a non-empty directory without
    ``overwrite`` (checked before any solve runs); an empty name is refused (it would be the
    current directory)."""
    if out is None or str(out) == "":
        raise ValueError("--out must name a directory, got ''")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ValueError(f"--out {out} is not empty; pass --overwrite to replace its "
                         f"{', '.join(OUTPUT_FILES)}")
    return out


def save(comparison, out, *, overwrite: bool = False) -> dict:
    """Write the three files; returns their paths by name."""
    out = check_out_dir(out, overwrite=overwrite)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / name for name in OUTPUT_FILES}
    paths["compare.json"].write_text(comparison.to_json())
    paths["compare.md"].write_text(f"# lowrank-fl compare {comparison.problem}\n\n"
                                   + comparison.table())
    plot_comparison(comparison, paths["compare.png"])
    return paths
