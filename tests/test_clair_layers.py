"""Layers inside lowrank_fl.clair: program (7) below its solvers, no private cross-module names."""
import ast
import pathlib

import lowrank_fl

CLAIR = pathlib.Path(lowrank_fl.__file__).parent / "clair"


def _imports(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            yield node


def test_no_private_names_across_clair_modules():
    bad = []
    for path in sorted(CLAIR.glob("*.py")):
        for node in _imports(path):
            for alias in node.names:
                if alias.name.startswith("_") or (alias.asname or "").startswith("_"):
                    bad.append(f"{path.name}: from {'.' * node.level}{node.module} import "
                               f"{alias.name} as {alias.asname}")
    assert bad == []


def test_penalized_and_programs_have_no_cycle():
    def deps(name):
        mods = set()
        for node in _imports(CLAIR / f"{name}.py"):
            if node.level == 1 and node.module:
                mods.add(node.module.split(".")[0])
        return mods
    assert "penalized" not in deps("programs")
    assert "programs" not in deps("program7") and "penalized" not in deps("program7")
