"""Write a comparison to a directory: ``compare.json``, ``compare.md`` and ``compare.png``.

The directory is written through :class:`lowrank_fl.outdir.OutputDir`: locked while the
comparison runs, the three files staged beside it and swapped in together, so a failure (a full
disk included) leaves a previous comparison whole and a new ``--out`` without partial files.
"""
from __future__ import annotations

from pathlib import Path

from ..outdir import OutputDir, check_output_dir
from .figure import plot_comparison

__all__ = ["OUTPUT_FILES", "check_out_dir", "open_out_dir", "write_files", "save"]

OUTPUT_FILES = ("compare.json", "compare.md", "compare.png")


def check_out_dir(out, *, overwrite: bool = False, inputs=()) -> Path:
    """``out`` resolved; ``ValueError`` if it may not be written (checked before any solve runs):
    a file, a non-empty directory without ``overwrite``, one that holds no previous lowrank-fl
    output, one overlapping an input file, the current directory or an empty name."""
    return check_output_dir(out, overwrite=overwrite, inputs=inputs)


def open_out_dir(out, *, problem: str, overwrite: bool = False, inputs=(), option: str = "--out") -> OutputDir:
    """The locked, staged output directory of ``compare <problem>`` (a context manager); ``option``
    is how its errors name ``out`` (:func:`save`, the Python call, passes ``"out"``)."""
    return OutputDir(out, command=f"compare {problem}", overwrite=overwrite, inputs=inputs, option=option)


def write_files(comparison, directory) -> dict:
    """Write the three files into ``directory`` (a staging directory); returns their paths."""
    directory = Path(directory)
    paths = {name: directory / name for name in OUTPUT_FILES}
    paths["compare.json"].write_text(comparison.to_json())
    paths["compare.md"].write_text(f"# lowrank-fl compare {comparison.problem}\n\n"
                                   + comparison.table())
    plot_comparison(comparison, paths["compare.png"])
    return paths


def save(comparison, out, *, overwrite: bool = False, inputs=()) -> dict:
    """Write the three files to ``out`` (staged and swapped in); returns their paths by name."""
    with open_out_dir(out, problem=comparison.problem, overwrite=overwrite, inputs=inputs,
                      option="out") as o:
        write_files(comparison, o.dir)
        o.commit()
    return {name: Path(out) / name for name in OUTPUT_FILES}
