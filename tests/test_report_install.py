"""A report written by a non-editable install (``pip install .``: no ``.git`` beside ``verify/``)
names the commit it was built from, and reads correctly for a newcomer: the legend defines every
column (``requires torch``, ``remarks``, ``omitted``), remarks are counted apart from the verdicts,
and the skip hint is a command that works from a checkout. The reference commit comes from git."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from verify.report.provenance import git_state

ROOT = Path(__file__).resolve().parents[1]
GIT = shutil.which("git")

# torch and peft look missing (find_spec), so the torch-only remark is skipped with its hint
RUN = """
import importlib.util, sys
real = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a, **k: (None if name.split(".")[0] in ("torch", "peft")
                                                   else real(name, *a, **k))
import verify
assert verify.__file__.startswith(sys.argv[2]), verify.__file__
from verify.cli import main
sys.exit(main(["--scale", "smoke", "--paper", "clair", "--paper", "fedrep",
               "--claim", "clair.lemmaS11.identity", "--claim", "clair.lemma1.rho_vacuous",
               "--claim", "clair.sec8.backbone_seeds", "--no-cache", "--backend", "sequential",
               "--no-progress", "--time-budget", "off", "--out", sys.argv[1]]))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``pip install --no-deps --target`` of this checkout (the build tree kept out of it)."""
    if GIT is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout and git: the commit to compare with comes from git")
    tmp = tmp_path_factory.mktemp("install")
    extra = tmp / "build.cfg"          # setuptools reads it: build/ and *.egg-info go to tmp
    extra.write_text(f"[build]\nbuild_base = {tmp / 'build'}\n[egg_info]\negg_base = {tmp}\n")
    site = tmp / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--no-compile", "--disable-pip-version-check", "--target", str(site), str(ROOT)],
                   check=True, capture_output=True, text=True, timeout=300,
                   env={**os.environ, "DIST_EXTRA_CONFIG": str(extra)})
    assert not (site / ".git").exists() and (site / "verify" / "_build_commit.json").is_file()
    return site


@pytest.mark.slow
def test_a_non_editable_install_writes_a_report_that_names_its_commit(installed, tmp_path):
    expected = git_state(root=ROOT)                  # the checkout it was built from, by git
    assert expected["commit"] == subprocess.run([GIT, "rev-parse", "HEAD"], cwd=ROOT, check=True,
                                                capture_output=True, text=True).stdout.strip()
    script = tmp_path / "run.py"
    script.write_text(RUN)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(installed)
    out = tmp_path / "report"
    run = subprocess.run([sys.executable, str(script), str(out), str(installed)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads((out / "results.json").read_text())
    md = (out / "README.md").read_text()
    html = (out / "index.html").read_text()

    # provenance: the build's record, not "not recorded"
    git = doc["provenance"]["git"]
    assert git == {"commit": expected["commit"], "dirty": expected["dirty"], "source": "build"}
    state = "with uncommitted changes" if expected["dirty"] else "clean"
    words = f"(recorded when this installed copy was built: {state})"
    assert f"`{expected['commit']}` {words}" in md and f"{expected['commit']} {words}" in html
    assert "not recorded" not in md + html

    # counts: the two remarks are under remarks only, the verdict columns hold the one counted claim
    verdicts = {c["id"]: c["verdict"] for c in doc["claims"]}
    assert verdicts == {"clair.sec8.backbone_seeds": "requires torch", "clair.lemma1.rho_vacuous": "holds",
                        "clair.lemmaS11.identity": "holds"}
    t = doc["totals"]
    assert t["remarks"] == 2 and t["holds"] == 1 and t["requires torch"] == 0 and t["claims"] == 3
    assert sum(t[v] for v in ("holds", "fails", "inconclusive", "erratum confirmed", "requires torch",
                              "exceeded time budget")) + t["remarks"] == t["claims"]
    assert "| **all** | **3** | **1** | **0** | **0** | **0** | **0** | **2** | **2** |" in md
    assert doc["totals_by_paper"]["fedrep"]["omitted"] == 2 == len(doc["omitted"])
    assert ("clair.sec8.backbone_seeds (requires torch), clair.lemma1.rho_vacuous (holds)" in md)

    # the legend defines every column and verdict shown
    for term in ("*claims*", "*remarks*", "*omitted*", "**requires torch**"):
        assert f"- {term}: " in md, term
    assert "not among the claims checked" in md
    for term in ("claims", "remarks", "omitted"):
        assert f"<dt><code>{term}</code></dt>" in html, term
    assert '<dt><span class="v requires">requires torch</span></dt>' in html

    # the skip hint works from a checkout; the package is on no index
    skipped = next(c for c in doc["claims"] if c["id"] == "clair.sec8.backbone_seeds")
    assert 'pip install ".[peft]"' in skipped["summary"] and "lowrank_fl[" not in md + html
