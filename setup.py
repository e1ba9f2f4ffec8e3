"""Build hook (the metadata is in pyproject.toml): record the git commit the package is built from.

A non-editable install (``pip install .``) has no ``.git`` beside ``verify/``, so the report's
provenance could not name its commit. Building a wheel writes ``verify/_build_commit.json`` into
the build tree (never into the checkout); an sdist carries the record of the checkout it was made
from, and a wheel built from that sdist copies it. Without git the record says why there is no
commit. :func:`verify.report.provenance.build_record` reads it.
"""
import importlib.util
import json
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = Path(__file__).resolve().parent


def _provenance():
    """verify/report/provenance.py loaded on its own (stdlib only at import: no numpy needed here)."""
    spec = importlib.util.spec_from_file_location("_lowrank_fl_provenance", ROOT / "verify" / "report" / "provenance.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write_record(package_dir: Path) -> None:
    prov = _provenance()
    state = prov.git_state(root=ROOT)     # the checkout's git, else the record an sdist carries
    record = {"commit": state.get("commit"), "dirty": state.get("dirty")}
    if state.get("reason") and state.get("source") != "build":
        record["reason"] = ("the package was built without the commit: " + state["reason"]
                            if record["commit"] is None else state["reason"])
    elif state.get("reason"):
        record["reason"] = state["reason"]
    package_dir.mkdir(parents=True, exist_ok=True)
    (package_dir / prov.BUILD_RECORD).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


class BuildPyWithCommit(build_py):
    def run(self):
        super().run()
        if not getattr(self, "editable_mode", False):   # an editable install reads the checkout's .git
            _write_record(Path(self.build_lib) / "verify")


class SdistWithCommit(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        _write_record(Path(base_dir) / "verify")


setup(cmdclass={"build_py": BuildPyWithCommit, "sdist": SdistWithCommit})
