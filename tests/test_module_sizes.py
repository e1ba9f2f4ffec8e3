"""Small modules with one job: no module of ``lowrank_fl/`` or ``verify/`` exceeds 600 lines."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 600


def test_no_module_over_600_lines():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines())
             for pkg in ("lowrank_fl", "verify") for p in (ROOT / pkg).rglob("*.py")}
    assert len(sizes) > 50                      # the walk found the packages
    assert {k: n for k, n in sizes.items() if n > LIMIT} == {}
