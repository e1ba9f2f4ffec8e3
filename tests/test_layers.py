"""The layers of the README hold: ``verify -> lowrank_fl``, no import cycles, no private imports.

The import graph is built from the sources with ``ast`` (every ``import``/``from ... import``,
at module level or inside functions: a lazy import that closes a cycle is still a cycle).
``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``;
a module's implicit import of its parent packages is not an edge.

``KNOWN_VIOLATIONS_TO_FIX`` lists the violations found today in files other work is fixing; each
test asserts the set it finds is exactly that list, so fixing one forces deleting its entry.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("lowrank_fl", "verify")

#: Violations found in files owned by other work in progress; empty this as they are fixed.
#: Entries: ("cycle", "a -> b -> a") with the cycle rotated to start at its smallest module,
#: ("private", "importer: module._name") for a private name used across modules.
KNOWN_VIOLATIONS_TO_FIX: set[tuple[str, str]] = set()


# ----------------------------------------------------------------------------- the graph
def _modules() -> dict[str, Path]:
    """``{dotted name: source file}`` of every module of :data:`PACKAGES`."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _resolve(importer: str, module: str | None, level: int) -> str:
    """Absolute name of ``from <level dots><module> import ...`` written in ``importer``."""
    if level == 0:
        return module or ""
    base = importer.split(".")
    if not _is_package(importer):
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


class _Import:
    """One imported thing: the module it loads and, for ``from m import x``, the name ``x``."""

    def __init__(self, module: str, name: str | None, line: int):
        self.module, self.name, self.line = module, name, line


def _imports(name: str) -> list[_Import]:
    """Every import in module ``name`` that targets one of our packages."""
    tree = ast.parse(MODULES[name].read_text(), filename=str(MODULES[name]))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES:
                    found.append(_Import(alias.name, None, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(name, node.module, node.level)
            if target.split(".")[0] not in PACKAGES:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in MODULES:  # ``from pkg import module``
                    found.append(_Import(sub, None, node.lineno))
                else:
                    found.append(_Import(target, alias.name, node.lineno))
    return found


def _graph() -> dict[str, set[str]]:
    graph = {m: set() for m in MODULES}
    for m in MODULES:
        for imp in _imports(m):
            target = imp.module
            while target not in MODULES and "." in target:  # ``import a.b.c`` of a name in a.b
                target = target.rsplit(".", 1)[0]
            if target in MODULES and target != m:
                graph[m].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> set[str]:
    """One shortest cycle per strongly connected component, as ``"a -> b -> a"``."""
    index, low, stack, on_stack, sccs = {}, {}, [], set(), []

    def strong(v):  # Tarjan (the graph has ~100 nodes: recursion depth is fine)
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(comp)

    for v in sorted(graph):
        if v not in index:
            strong(v)
    out = set()
    for comp in sccs:
        start = min(comp)
        # breadth-first search for the shortest way back to ``start`` inside the component
        paths, seen, cycle = [[start]], {start}, None
        while paths and cycle is None:
            nxt = []
            for path in paths:
                for w in sorted(graph[path[-1]] & comp):
                    if w == start:
                        cycle = path + [start]
                        break
                    if w not in seen:
                        seen.add(w)
                        nxt.append(path + [w])
                if cycle:
                    break
            paths = nxt
        out.add(" -> ".join(cycle))
    return out


def _private_uses() -> set[str]:
    """``"importer: module._name"`` for each private name one module takes from another.

    ``from m import _x`` and ``alias._x`` where ``alias`` is a module imported by name. Private
    modules (``verify.claims.clair._sec7``) may be imported inside their own package, its
    ``__init__`` included.
    """
    out = set()
    for m in MODULES:
        tree = ast.parse(MODULES[m].read_text())
        module_aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in MODULES:
                        module_aliases[alias.asname or alias.name.split(".")[0]] = alias.name
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(m, node.module, node.level)
                if target.split(".")[0] not in PACKAGES:
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    if sub in MODULES:
                        module_aliases[alias.asname or alias.name] = sub
                        private_module = alias.name.startswith("_") and not alias.name.startswith("__")
                        if private_module and not (m == target or m.startswith(target + ".")):
                            out.add(f"{m}: {sub}")
                    elif alias.name.startswith("_") and not alias.name.startswith("__"):
                        out.add(f"{m}: {target}.{alias.name}")
                # a private module on the path, from outside its package
                parts = target.split(".")
                for k, part in enumerate(parts):
                    if part.startswith("_") and not part.startswith("__"):
                        owner = ".".join(parts[:k])
                        if not (m == owner or m.startswith(owner + ".")):
                            out.add(f"{m}: {'.'.join(parts[:k + 1])}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in module_aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                out.add(f"{m}: {module_aliases[node.value.id]}.{node.attr}")
    return out


def _known(kind: str) -> set[str]:
    return {text for k, text in KNOWN_VIOLATIONS_TO_FIX if k == kind}


# ----------------------------------------------------------------------------- tests
def test_importing_every_library_module_loads_no_verify_module():
    code = """
import importlib, json, pkgutil, sys
import lowrank_fl
names = [m.name for m in pkgutil.walk_packages(lowrank_fl.__path__, "lowrank_fl.")]
for name in names:
    importlib.import_module(name)
print(json.dumps({"imported": names,
                  "verify": sorted(m for m in sys.modules if m == "verify" or m.startswith("verify."))}))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "lowrank_fl.cli" in doc["imported"] and "lowrank_fl.clair.cli" in doc["imported"]
    assert len(doc["imported"]) >= 30
    assert doc["verify"] == []


def test_the_library_source_never_names_verify():
    offenders = [f"{m}:{imp.line}" for m in MODULES if m.startswith("lowrank_fl")
                 for imp in _imports(m) if imp.module.split(".")[0] == "verify"]
    assert offenders == []


def test_the_graph_sees_real_edges():
    """Guard against a parser that finds nothing (and so no cycle)."""
    graph = _graph()
    assert "lowrank_fl.clair.program7" in graph["lowrank_fl.clair.penalized"]
    assert "lowrank_fl.clair.cli" in graph["lowrank_fl.cli"]
    assert "verify.claim" in graph["verify.runner"]
    assert "verify.sweep" in graph["verify.claim"]  # a lazy import inside a method counts
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}) == {"a -> b -> c -> a"}


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package):
    graph = _graph()
    inside = {m: {w for w in ws if w.split(".")[0] == package}
              for m, ws in graph.items() if m.split(".")[0] == package}
    found = _cycles(inside)
    assert found == {c for c in _known("cycle") if c.startswith(package + ".")}, (
        f"import cycles in {package} (fix them, or update KNOWN_VIOLATIONS_TO_FIX): "
        + "; ".join(sorted(found)))


def test_no_private_name_is_imported_across_modules():
    found = _private_uses()
    assert found == _known("private"), (
        "private names used across modules (make them public, or update KNOWN_VIOLATIONS_TO_FIX):\n"
        + "\n".join(sorted(found ^ _known("private"))))


def test_verify_uses_only_public_library_api():
    """Every name ``verify`` takes from ``lowrank_fl`` is public: no ``_x``, no private module,
    and in the module's ``__all__`` when it declares one."""
    bad = set()
    for m in MODULES:
        if not m.startswith("verify"):
            continue
        for imp in _imports(m):
            if imp.module.split(".")[0] != "lowrank_fl":
                continue
            parts = imp.module.split(".") + ([imp.name] if imp.name else [])
            if any(p.startswith("_") and not p.startswith("__") for p in parts):
                bad.add(f"{m}: {'.'.join(parts)}")
            elif imp.name and imp.module in MODULES:
                exported = _declared_all(imp.module)
                if exported is not None and imp.name not in exported and \
                        f"{imp.module}.{imp.name}" not in MODULES:
                    bad.add(f"{m}: {imp.module}.{imp.name} (not in __all__)")
    assert bad <= _known("private"), sorted(bad - _known("private"))


def _declared_all(module: str) -> list[str] | None:
    tree = ast.parse(MODULES[module].read_text())
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                try:
                    return list(ast.literal_eval(node.value))
                except ValueError:
                    return None
    return None
