"""Time budgets per claim (verify.budgets): derivation, --time-budget, and a claim stopped at its
budget on every backend while the other claims run as usual (issue 23)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import jsonschema
import pytest

from _dummy_tasks import dummy_claims, slow_claim
from verify import budgets as B
from verify.claim import BUDGET_VERDICT, OMITTED, REGISTRY, Context
from verify.cli import lowrank_fl_main as lowrank_fl
from verify.report.results_json import load_schema
from verify.runner import run_claims
from verify.sweep import Sweep

ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- derivation
def _doc(scale, seconds):
    return {"scale": scale, "claims": [{"id": cid, "seconds": s} for cid, s in seconds.items()]}


def test_budget_is_factor_times_measured_with_a_floor_and_falls_back_to_the_larger_scale():
    docs = [_doc("full", {"a.x": 100.0, "a.y": 2.0, "a.z": 31.04}),
            _doc("smoke", {"a.x": 7.0, "a.y": 0.5}), _doc("smoke", {"a.x": 9.5})]
    got = B.derive_budgets(docs)
    # a.x: smoke 10 x 9.5 (the larger of two smoke runs); quick has no report: full's 10 x 100
    assert got["a.x"] == {"smoke": 95.0, "quick": 1000.0, "full": 1000.0}
    assert got["a.y"] == {"smoke": 60.0, "quick": 120.0, "full": 300.0}   # floors
    assert got["a.z"] == {"smoke": 311.0, "quick": 311.0, "full": 311.0}  # ceil(310.4); smoke from full
    only_smoke = B.derive_budgets([_doc("smoke", {"b.q": 30.0})])["b.q"]
    assert only_smoke == {"smoke": 300.0, "quick": B.UNMEASURED["quick"], "full": B.UNMEASURED["full"]}
    with pytest.raises(ValueError, match="report scale must be one of"):
        B.derive_budgets([_doc("huge", {})])


def test_claims_sharing_runs_share_the_longest_runtime():
    """A claim that reads another's runs (overlapping seeds) is budgeted as if it computed them: it
    does under --no-cache. Sharing is transitive; claims without seeds or with disjoint ones are not
    joined."""
    doc = {"scale": "full", "claims": [
        {"id": "a.main", "seconds": 900.0, "seeds": [1, 2, 3]},
        {"id": "a.reader", "seconds": 0.4, "seeds": [3]},
        {"id": "a.chain", "seconds": 2.0, "seeds": [3, 7]},
        {"id": "a.chained", "seconds": 1.0, "seeds": [7, 8]},
        {"id": "a.alone", "seconds": 5.0, "seeds": [4, 5]},
        {"id": "a.none", "seconds": 3.0, "seeds": []},
        {"id": "a.missing", "seconds": 6.0}]}
    got = B.derive_budgets([doc])
    assert {c: got[c]["full"] for c in ("a.main", "a.reader", "a.chain", "a.chained")} == dict.fromkeys(
        ("a.main", "a.reader", "a.chain", "a.chained"), 9000.0)
    assert got["a.alone"]["full"] == got["a.none"]["full"] == got["a.missing"]["full"] == 300.0
    # the same claims without overlap: each its own runtime
    for e in doc["claims"]:
        e["seeds"] = [hash(e["id"])]
    assert B.derive_budgets([doc])["a.reader"]["full"] == 300.0


def test_committed_budgets_follow_the_rule_from_the_committed_full_report():
    table = B.load_budgets()
    full = json.loads((ROOT / "reports" / "full" / "results.json").read_text())
    shared = B.shared_runtimes(full["claims"])
    for entry in full["claims"]:
        expected = max(B.FLOORS["full"], float(-(-B.FACTOR * shared[entry["id"]] // 1)))
        # at least the rule on the committed report; more where another full run (named in the
        # file's command, e.g. a cold-cache run of a claim whose committed runtime was cached) took longer
        assert table[entry["id"]]["full"] >= expected, entry["id"]
        assert table[entry["id"]]["smoke"] <= table[entry["id"]]["quick"] <= table[entry["id"]]["full"]
    assert table["clair.sec8.table3"]["full"] >= 10 * 434   # the longest claims keep long budgets
    # a claim reading another's runs is budgeted for computing them (--no-cache)
    assert table["adapters.trained.heldout_loss"]["full"] == table["adapters.trained.detection"]["full"]


@pytest.mark.parametrize("text, expected", [("auto", ("auto", None)), ("OFF", ("off", None)),
                                            ("90", ("seconds", 90.0)), ("2.5s", ("seconds", 2.5)),
                                            ("3x", ("factor", 3.0)), ("1e9", ("seconds", 1e9)),
                                            ("2.5E-1s", ("seconds", 0.25)), ("1e3x", ("factor", 1e3)),
                                            (" 7 s ", ("seconds", 7.0))])
def test_parse_time_budget(text, expected):
    assert B.parse_time_budget(text) == expected


@pytest.mark.parametrize("text", ["", "0", "-5", "fast", "3y", "x", "inf", "nan", "1e999", "-1e9",
                                  "0e5x", "s"])
def test_bad_time_budget_is_refused(text):
    with pytest.raises(ValueError, match="--time-budget must be 'auto', 'off', seconds > 0"):
        B.parse_time_budget(text)


def test_budget_for_each_mode():
    table = {"a.x": {"smoke": 60.0, "quick": 200.0, "full": 400.0}}
    assert B.budget_for("a.x", "quick", table=table) == (200.0, "budgets.json")
    assert B.budget_for("a.x", "full", "factor", 1.5, table) == (600.0, "1.5 x budgets.json")
    assert B.budget_for("a.x", "smoke", "seconds", 7.0, table) == (7.0, "--time-budget")
    assert B.budget_for("a.x", "smoke", "off", None, table) == (None, "off")
    assert B.budget_for("new.claim", "quick", table=table) == (B.UNMEASURED["quick"], "unmeasured default")
    # a factor whose product overflows stays finite (the report's JSON holds no inf)
    assert B.budget_for("a.x", "full", "factor", 1e308, table) == (sys.float_info.max, "1e+308 x budgets.json")


def test_a_budget_beyond_the_timer_range_runs_unlimited_in_practice():
    # setitimer overflows a little above 9e9 s; the timer is capped, the deadline is not
    import signal as sig

    with B.time_limit(1e12):
        assert B.active_deadline() > time.monotonic() + 1e11
        assert 0 < sig.getitimer(sig.ITIMER_REAL)[0] <= 1e9
    assert sig.getitimer(sig.ITIMER_REAL)[0] == 0 and B.active_deadline() is None


def test_cli_accepts_exponent_time_budget_and_auto(slow_registry, capsys):
    out = slow_registry / "report"
    for value in ("1e9", "auto"):
        assert lowrank_fl(["verify", "--scale", "smoke", "--claim", "fedrep.dummy.mean", "--no-cache",
                           "--time-budget", value, "--out", str(out), "--overwrite"]) == 0, value
        budget = json.loads((out / "results.json").read_text())["claims"][0]["budget"]
        assert budget == ({"limit_s": 1e9, "source": "--time-budget", "exceeded": False} if value == "1e9"
                          else {"limit_s": B.UNMEASURED["smoke"], "source": "unmeasured default",
                                "exceeded": False})


@pytest.mark.parametrize("source, limit, words", [
    ("--time-budget", 0.5, "(0.5 s for every claim, given with --time-budget)"),
    ("3 x budgets.json", 180.0, "(3 times its budget in verify/budgets.json, 10 times its measured "
                                "runtime with a floor, scaled with --time-budget 3x)"),
    ("budgets.json", 60.0, "(its budget in verify/budgets.json, 10 times its measured runtime with a floor)"),
    ("unmeasured default", 300.0, "(the default budget of a claim not yet measured)")])
def test_report_legend_says_where_the_budget_came_from(source, limit, words):
    from verify.claim import Evidence
    from verify.report._common import verdict_legend

    c = dummy_claims()[0]
    e = Evidence(verdict=BUDGET_VERDICT, summary="stopped",
                 budget={"limit_s": limit, "source": source, "exceeded": True})
    text = verdict_legend([(c, e)])[BUDGET_VERDICT]
    assert text.startswith(f"the experiment was stopped at its time budget {words}: it does not hold")
    assert "verify/budgets.py" not in text and "{" not in text
    # no budget recorded (--time-budget off, an older results.json): the general rule
    assert "unless --time-budget set it" in verdict_legend([(c, Evidence(verdict="holds", summary="ok"))])[BUDGET_VERDICT]


def test_time_limit_interrupts_python_work_and_restores_the_timer():
    import signal

    with pytest.raises(B.BudgetExceeded, match="time budget of 0.2 s exceeded"):
        with B.time_limit(0.2):
            try:
                while True:
                    sum(range(1000))
            except Exception:   # an experiment's broad except does not swallow the stop
                pytest.fail("BudgetExceeded was caught as an Exception")
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert B.active_deadline() is None
    with B.time_limit(None):
        pass


# ----------------------------------------------------------------------------- every backend
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:   # a killed child not yet reaped is a zombie: dead for our purpose
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _pids(log_dir, prefix):
    return sorted(int(p.name.split("_")[1]) for p in Path(log_dir).glob(f"{prefix}_*"))


@pytest.fixture
def process_cluster():
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=":0")
    client = distributed.Client(cluster, set_as_default=False)
    yield client
    client.close()
    cluster.close()


@pytest.mark.parametrize("backend", ["sequential", "loky", "dask"])
def test_a_claim_past_its_budget_is_stopped_with_its_workers_and_the_run_goes_on(
        backend, tmp_path, request):
    sweep = (Sweep("dask", client=request.getfixturevalue("process_cluster")) if backend == "dask"
             else Sweep(backend, n_jobs=2))
    slow = slow_claim(tmp_path, seconds=300.0, busy=backend == "sequential")
    before, after = dummy_claims()[0], dummy_claims()[3]   # fedrep.dummy.mean, rolora.dummy.erratum
    limits = {slow.id: 2.0}
    with sweep:
        results = run_claims([before, slow, after], Context(scale="smoke", sweep=sweep),
                             budgets=lambda c: (limits.get(c.id, 600.0), "test"))
        ev = {c.id: e for c, e in results}
        # the others ran under their budgets with their usual verdicts, one after the stop
        assert ev[before.id].verdict == "holds" and ev[after.id].verdict == "erratum confirmed"
        assert ev[before.id].budget == {"limit_s": 600.0, "source": "test", "exceeded": False}
        # the slow claim was stopped at its budget, not when its tasks ended
        e = ev[slow.id]
        assert e.verdict == BUDGET_VERDICT and e.budget == {"limit_s": 2.0, "source": "test",
                                                            "exceeded": True}
        assert e.seconds >= 2.0 and e.summary.startswith(
            f"exceeded time budget: stopped after {e.seconds:.1f} s (budget 2 s, test)")
        started = _pids(tmp_path, "start")
        assert started and _pids(tmp_path, "finished") == []
        if backend == "sequential":
            assert started == [os.getpid()]   # interrupted in this process, which goes on
        else:
            assert os.getpid() not in started
            deadline = time.monotonic() + 60   # the kill is asynchronous for dask's nannies
            while any(map(_alive, started)) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not any(map(_alive, started)), f"{backend} workers still running the slow task"
        # the backend still works after its workers were killed
        assert run_claims([before], Context(scale="smoke", sweep=sweep))[0][1].verdict == "holds"
    assert _pids(tmp_path, "finished") == []


@pytest.mark.parametrize("backend", ["loky", "dask"])
def test_worker_start_up_and_restart_are_not_charged_to_the_next_claims_budgets(
        tmp_path, monkeypatch, backend, request):
    # loky: a claim stopped at its budget kills the workers; their restart (here dominated by a
    # module that takes 3 s to import in a worker) used to run on the clocks of the claims after
    # it, which were then stopped too although their own work takes a fraction of a second
    from _slow_import_tasks import IMPORT_SECONDS, squares_claim

    monkeypatch.setenv("SLOW_IMPORT_PARENT", str(os.getpid()))   # before the cluster starts
    fast = [squares_claim(k) for k in range(4)]
    slow = slow_claim(tmp_path, seconds=300.0)
    limits = {slow.id: 1.0}
    sweep = (Sweep("dask", client=request.getfixturevalue("process_cluster")) if backend == "dask"
             else Sweep("loky", n_jobs=2))
    with sweep:
        results = run_claims([fast[0], slow, *fast[1:]], Context(scale="smoke", sweep=sweep),
                             budgets=lambda c: (limits.get(c.id, IMPORT_SECONDS - 1.0), "test"))
    ev = {c.id: e for c, e in results}
    assert ev[slow.id].verdict == BUDGET_VERDICT and ev[slow.id].budget["exceeded"]
    for c in fast:   # the first pays no start-up, the next ones no restart
        assert ev[c.id].verdict == "holds", (c.id, ev[c.id].summary)
        assert ev[c.id].budget == {"limit_s": IMPORT_SECONDS - 1.0, "source": "test", "exceeded": False}
        assert ev[c.id].seconds < IMPORT_SECONDS - 1.0
    started = _pids(tmp_path, "start")
    assert started and not any(map(_alive, started))   # the slow claim's workers were killed


_VERIFY_SLOW_CLAIM = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    from _dummy_tasks import slow_claim
    import verify.cli as cli
    from verify.claim import OMITTED, REGISTRY

    REGISTRY.clear()
    OMITTED.clear()
    claim = slow_claim(sys.argv[2], seconds=300.0)
    REGISTRY[claim.id] = claim
    cli._load_claims = lambda papers: None
    sys.exit(cli.lowrank_fl_main(sys.argv[3:]))
""")


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
@pytest.mark.parametrize("backend", ["loky", "dask"])
def test_killed_verify_leaves_no_workers(tmp_path, backend):
    # kill -9 of `lowrank-fl verify` while its workers run a claim's tasks: the workers (and with
    # them loky's resource tracker and its /dev/shm files) end with it, not 300 s later. dask: the
    # LocalCluster's worker processes (children of the in-process nannies) end by themselves
    if backend == "dask":
        pytest.importorskip("distributed")
    from test_output_safety import _gone, _shm

    def _children(pid):   # of every thread (dask's nannies start workers from their loop thread)
        return sorted(int(x) for t in Path(f"/proc/{pid}/task").iterdir()
                      for x in (t / "children").read_text().split())

    log = tmp_path / "log"
    log.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with tempfile.TemporaryFile("w+") as errfile:   # orphans would hold a pipe open
        proc = subprocess.Popen(
            [sys.executable, "-c", _VERIFY_SLOW_CLAIM, str(ROOT / "tests"), str(log), "verify",
             "--scale", "smoke", "--backend", backend, "--jobs", "2", "--no-cache",
             "--time-budget", "off", "--out", str(tmp_path / "report")],
            env=env, stdout=subprocess.DEVNULL, stderr=errfile)
        try:
            deadline = time.monotonic() + 120
            while len(_pids(log, "start")) < 2 and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.1)
            workers = _pids(log, "start")
            children = _children(proc.pid)
            assert len(workers) == 2 and set(workers) <= set(children), (workers, children)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        errfile.seek(0)
        err = errfile.read()
    assert proc.returncode == -signal.SIGKILL, err
    assert _gone(children), f"{backend} workers or resource tracker outlived the killed verify"
    assert _shm(proc.pid) == []
    assert _pids(log, "finished") == []


# ----------------------------------------------------------------------------- command line
@pytest.fixture
def slow_registry(tmp_path, monkeypatch):
    saved, saved_omitted = dict(REGISTRY), dict(OMITTED)
    REGISTRY.clear()
    OMITTED.clear()
    claims = [dummy_claims()[0], slow_claim(tmp_path / "log", seconds=300.0), dummy_claims()[3]]
    (tmp_path / "log").mkdir()
    REGISTRY.update({c.id: c for c in claims})
    monkeypatch.setattr("verify.cli._load_claims", lambda papers: None)
    table = tmp_path / "budgets.json"
    table.write_text(json.dumps({"budgets": {"flute.dummy.slow": {"smoke": 2.0, "quick": 2.0,
                                                                  "full": 2.0}}}))
    monkeypatch.setattr(B, "BUDGETS_PATH", table)
    yield tmp_path
    REGISTRY.clear()
    REGISTRY.update(saved)
    OMITTED.clear()
    OMITTED.update(saved_omitted)


def test_verify_reports_the_claim_stopped_at_its_budget_and_exits_non_zero(slow_registry, capsys):
    out = slow_registry / "report"
    code = lowrank_fl(["verify", "--scale", "smoke", "--backend", "loky", "--jobs", "2", "--no-cache",
                       "--no-progress", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1
    assert "[2/3] flute.dummy.slow: exceeded time budget" in err
    assert "stopped at their time budget: flute.dummy.slow (exit status 1)" in err
    doc = json.loads((out / "results.json").read_text())
    jsonschema.validate(doc, load_schema())
    by_id = {c["id"]: c for c in doc["claims"]}
    assert by_id["flute.dummy.slow"]["verdict"] == "exceeded time budget"
    assert by_id["flute.dummy.slow"]["budget"] == {"limit_s": 2.0, "source": "budgets.json",
                                                   "exceeded": True}
    # claims the table does not list get the generous default, and hold as usual
    assert by_id["fedrep.dummy.mean"]["verdict"] == "holds"
    assert by_id["fedrep.dummy.mean"]["budget"]["source"] == "unmeasured default"
    assert doc["totals"]["exceeded time budget"] == 1
    md = (out / "README.md").read_text()
    assert "### `flute.dummy.slow` — **exceeded time budget**" in md
    assert "Time budget: 2 s (budgets.json); the experiment was stopped after" in md
    assert 'class="v budget">exceeded time budget</span>' in (out / "index.html").read_text()
    assert _pids(slow_registry / "log", "finished") == []


def test_time_budget_option_overrides_and_turns_off(slow_registry, capsys):
    code = lowrank_fl(["verify", "--scale", "smoke", "--backend", "sequential", "--no-cache",
                       "--no-progress", "--claim", "fedrep.dummy.mean", "--time-budget", "45s",
                       "--out", str(slow_registry / "a")])
    assert code == 0
    doc = json.loads((slow_registry / "a" / "results.json").read_text())
    assert doc["claims"][0]["budget"] == {"limit_s": 45.0, "source": "--time-budget", "exceeded": False}
    code = lowrank_fl(["verify", "--scale", "smoke", "--backend", "sequential", "--no-cache",
                       "--no-progress", "--claim", "fedrep.dummy.mean", "--time-budget", "off",
                       "--out", str(slow_registry / "b")])
    assert code == 0
    assert "budget" not in json.loads((slow_registry / "b" / "results.json").read_text())["claims"][0]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        lowrank_fl(["verify", "--time-budget", "soon", "--out", str(slow_registry / "c")])
    assert exc.value.code == 2
    assert "argument --time-budget: must be 'auto', 'off', seconds > 0" in capsys.readouterr().err


# ----------------------------------------------------------------------------- mutation harness
def test_a_mutant_whose_claims_all_exceed_their_budget_is_caught_by_the_budget(tmp_path):
    from verify.mutants.harness import Mutant, baseline_verdicts, run_mutant

    def crawl(original):
        def slow(*args, **kwargs):   # a solver crawling to its caps: far past any budget
            time.sleep(600)
            return original(*args, **kwargs)
        return slow

    ids = ("rolora.prop5_5.ffa_expected_loss",)
    mutant = Mutant("slow.c_tilde", "lowrank_fl.exact.rolora:c_tilde", "c_tilde crawls.",
                    ("rolora",), crawl, claims=ids)
    budget = ("seconds", 3.0)
    baseline = baseline_verdicts(["rolora"], "smoke", ids=ids, time_budget=budget)
    assert baseline == {ids[0]: "holds"}
    out = run_mutant(mutant, baseline, "smoke", time_budget=budget)
    assert out.stopped_by_budget == list(ids) and out.caught_by == [] and out.caught_by_budget
    assert not out.escaped and out.seconds >= 3.0
    row = out.to_dict()
    assert row["caught_by_budget"] is True and row["stopped_by_budget"] == list(ids)
    assert row["seconds"] == round(out.seconds, 2)


def test_mutants_command_refuses_a_bad_time_budget(tmp_path, capsys):
    from verify.mutants.__main__ import main

    assert main(["--mutant", "rolora.c_tilde_sign", "--time-budget", "0x", "--out", str(tmp_path)]) == 2
    assert "--time-budget must be 'auto', 'off', seconds > 0" in capsys.readouterr().err


# ----------------------------------------------------------------------------- unhandled non-convergence
def _lax(**options):
    from _dummy_tasks import lax_claim

    return lax_claim(**options)


def test_a_criterion_that_ignores_a_non_converged_solve_cannot_hold():
    from verify.convergence import WARNED_STATUS

    good = _lax(max_iter=10000).run(Context(scale="smoke"))
    assert good.verdict == "holds" and good.solves == {}      # converged: nothing recorded
    bad = _lax(max_iter=3).run(Context(scale="smoke"))         # the deliberately broken solve
    assert bad.verdict == "inconclusive"
    # one record per task (their duality gaps differ), naming the warning and where it was raised
    assert bad.summary.startswith("inconclusive (2 of 2 solves not converged (e.g. ConvergenceWarning "
                                  "(_dummy_tasks.py:")
    assert "solve_penalized(method='fista') stopped at max_iter=3" in bad.summary
    assert "was holds): objectives" in bad.summary
    assert bad.solves["by_status"] == {WARNED_STATUS: 2}
    assert [r["count"] for r in bad.solves["failures"]] == [1, 1]
    # the same broken solve in the claim's own body, and a non-dict task result
    assert _lax(max_iter=3, in_body=True).run(Context(scale="smoke")).verdict == "inconclusive"
    wrapped = _lax(max_iter=3, as_dict=False).run(Context(scale="smoke"))
    assert wrapped.verdict == "inconclusive" and wrapped.measured["objectives"] == bad.measured["objectives"]
    # a claim that runs to the cap on purpose says so at the call, and keeps its verdict
    assert _lax(max_iter=3, silence=True).run(Context(scale="smoke")).verdict == "holds"
    assert _lax(max_iter=3, silence=True, in_body=True).run(Context(scale="smoke")).verdict == "holds"


def test_unhandled_non_convergence_travels_from_workers_and_through_the_cache(tmp_path):
    seq = _lax(max_iter=3).run(Context(scale="smoke"))
    with Sweep("loky", n_jobs=2, cache_dir=tmp_path) as sweep:
        first = _lax(max_iter=3).run(Context(scale="smoke", sweep=sweep))
        assert sweep.executed == 2 and sweep.reused == 0
        again = _lax(max_iter=3).run(Context(scale="smoke", sweep=sweep))
        assert sweep.executed == 2 and sweep.reused == 2          # served from the cache
    for ev in (first, again):
        assert ev.verdict == "inconclusive" and ev.solves == seq.solves
        assert ev.measured == seq.measured


def test_other_warnings_pass_through_the_capture():
    import warnings

    from verify.convergence import capture_convergence
    from lowrank_fl.results import ConvergenceWarning

    sink = []
    with pytest.warns(RuntimeWarning, match="not a convergence matter"):
        with capture_convergence(sink):
            warnings.warn("not a convergence matter", RuntimeWarning)
            for _ in range(2):   # one record per distinct warning and place, with its count
                warnings.warn("capped", ConvergenceWarning)
    assert [(r["status"], r["count"], r["ok"]) for r in sink] == [("not converged (warning)", 2, False)]


def test_budgets_file_is_package_data():
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "budgets.json" in meta["tool"]["setuptools"]["package-data"]["verify"]
    assert B.BUDGETS_PATH.parent == ROOT / "verify"


def test_budgets_command_writes_the_rule_and_never_replaces_a_foreign_file(tmp_path, capsys):
    out = tmp_path / "budgets.json"
    report = ROOT / "reports" / "full" / "results.json"
    assert B.main([str(report), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["factor"] == B.FACTOR and doc["floors"] == B.FLOORS
    assert doc["command"] == "python -m verify.budgets <full report>"   # no machine path recorded
    written = B.load_budgets(out)
    full = json.loads(report.read_text())
    shared = B.shared_runtimes(full["claims"])
    assert {c: r["full"] for c, r in written.items()} == {
        c["id"]: max(B.FLOORS["full"], float(-(-B.FACTOR * shared[c["id"]] // 1))) for c in full["claims"]}
    assert B.main([str(report), "--out", str(out)]) == 0                 # its own file: replaced
    foreign = tmp_path / "notes.json"
    foreign.write_text('{"mine": 1}')
    assert B.main([str(report), "--out", str(foreign)]) == 2
    assert foreign.read_text() == '{"mine": 1}'
    assert "exists and is not a budgets file" in capsys.readouterr().err


def test_outside_the_main_thread_the_sweep_checks_the_deadline_between_tasks():
    import threading

    from _dummy_tasks import noisy_task

    seen = {}

    def run():
        try:
            with B.time_limit(1.0):   # no SIGALRM in this thread: the sweep's own check stops it
                Sweep().map(noisy_task, [{"x": 0, "sleep": 0.25}], [list(range(40))], label="fedrep.t")
        except B.BudgetExceeded as exc:
            seen["stop"] = exc

    sweep_thread = threading.Thread(target=run)
    sweep_thread.start()
    sweep_thread.join()
    assert isinstance(seen.get("stop"), B.BudgetExceeded) and seen["stop"].limit == 1.0
    assert B.active_deadline() is None


def test_a_deadline_inside_an_import_waits_for_the_import():
    # the fedrep smoke run at --time-budget 0.5 stopped a claim inside matplotlib's first import;
    # every later claim that drew a figure then raised KeyError: 'Rectangle:kwdoc'
    sys.modules.pop("_interrupted_import", None)
    start = time.monotonic()
    with pytest.raises(B.BudgetExceeded):
        with B.time_limit(0.1):
            import _interrupted_import  # noqa: F401  (the import itself is the slow work)
            while True:
                time.sleep(0.01)
    assert time.monotonic() - start >= 0.5
    module = sys.modules["_interrupted_import"]
    assert module.COMPLETE and len(module.STEPS) == 10


def test_nested_limits_keep_the_outer_one():
    with pytest.raises(B.BudgetExceeded) as exc:
        with B.time_limit(0.6):
            with B.time_limit(30.0):   # ends first without firing; the outer one still fires
                pass
            while True:
                sum(range(1000))
    assert exc.value.limit == 0.6
