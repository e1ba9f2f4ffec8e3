"""The dependency floors in pyproject.toml cover the features the code uses.

Each entry of ``FEATURES`` names a feature, the version of its distribution that introduced it and
a source pattern that shows the feature is used; the test fails when the pattern is gone (update
the table) or when pyproject's floor is below the version (raise the floor). ``.ci/run`` also runs
the verifier-infrastructure tests with the pure-Python dependencies at their floors.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: (distribution, minimum version, file, pattern, what needs it)
FEATURES = [
    ("joblib", "1.4", "verify/sweep.py", r'return_as="generator_unordered"',
     "Parallel(return_as='generator_unordered') (joblib 1.3 raises ValueError)"),
    ("joblib", "1.3", "verify/sweep.py", r"joblib\.parallel_config\(", "joblib.parallel_config"),
    ("joblib", "1.5", "verify/sweep.py", r"initializer=exit_with_parent",
     "parallel_config(backend='loky', initializer=...) handed on to loky's executor (joblib 1.4 "
     "passes it to the backend's constructor: TypeError)"),
    ("threadpoolctl", "3.5", "verify/sweep.py", r"ThreadpoolController\(",
     "ThreadpoolController that sees numpy>=2's scipy-openblas (3.1 sees no BLAS at all)"),
    ("tqdm", "4.60", "verify/sweep.py", r"delay=", "tqdm(delay=...)"),
    ("numpy", "1.24", "verify/cache.py", r"np\.lib\.npyio\.NpzFile", "NpzFile context manager"),
]


def _floors() -> dict[str, tuple[int, ...]]:
    text = (ROOT / "pyproject.toml").read_text()
    deps = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
    out = {}
    for name, version in re.findall(r'"([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?>=([0-9.]+)"', deps):
        out[name.lower()] = tuple(int(p) for p in version.split("."))
    return out


def test_every_runtime_dependency_has_a_floor():
    floors = _floors()
    for name in ("numpy", "scipy", "cvxpy", "joblib", "tqdm", "threadpoolctl", "matplotlib"):
        assert name in floors, f"{name} needs a '>=' floor in pyproject.toml's dependencies"


@pytest.mark.parametrize("dist, version, path, pattern, why", FEATURES,
                         ids=[f"{f[0]}-{f[1]}-{f[4].split()[0]}" for f in FEATURES])
def test_floor_covers_the_feature(dist, version, path, pattern, why):
    assert re.search(pattern, (ROOT / path).read_text()), \
        f"{path} no longer uses {why}: update FEATURES"
    need = tuple(int(p) for p in version.split("."))
    have = _floors()[dist]
    assert have >= need, f"pyproject.toml says {dist}>={'.'.join(map(str, have))} but " \
                         f"{path} uses {why}, new in {version}"
