"""The stall rule (lowrank_fl.stall, issue 33): a solver with a realistic bug stops with status
"stalled" within its window instead of running to max_iter; healthy solves are not touched (their
iteration counts equal those of the same solve with the rule off, and the README's)."""
import warnings

import numpy as np
import pytest

from lowrank_fl.clair import factored, penalized
from lowrank_fl.clair.contrasts import contrasts
from lowrank_fl.clair.factored import PairContrasts, solve_penalized_factored
from lowrank_fl.clair.penalized import solve_penalized
from lowrank_fl.clair.pipeline import fit
from lowrank_fl.clair.simulate import generate, simulate
from lowrank_fl.exact import nuclear
from lowrank_fl.exact.nuclear import solve_nuclear_prox
from lowrank_fl.problems.multitask import multitask_linear
from lowrank_fl.results import STATUSES, ConvergenceWarning, SolverError, StalledWarning
from lowrank_fl.stall import (DEFAULT_WINDOWS, DESCENT, FACTOR, MARGIN, START, StallRule,
                              check_stall_window)


# ----------------------------------------------------------------------------- the rule itself
def _first_stop(rule, gaps, every=5, objective=lambda k: 1.0):
    """Feed ``gaps(k)`` and ``objective(k)`` (default: stationary) at k = every, 2 every, ...;
    the iteration the rule fires at (or None)."""
    for k in range(every, 100_001, every):
        if rule.check(k, gaps(k), objective(k)):
            return k
    return None


def test_a_plateau_stops_at_the_first_full_window():
    rule = StallRule(4.0, 1e-8)
    assert _first_stop(rule, lambda k: 0.1) == 4 * START      # k / 4 >= START first at k = 100
    assert rule.since == START and rule.best == 0.1


@pytest.mark.parametrize("window", [4.0, 8.0])
def test_rate_boundary(window):
    """A gap falling like k^-a improves by window^a over a window: the rule fires exactly when that
    is below FACTOR (FISTA's 1/k^2 and ISTA's 1/k never stall at the default windows)."""
    a_crit = np.log(FACTOR) / np.log(window)
    assert _first_stop(StallRule(window, 1e-12), lambda k: k ** -(0.9 * a_crit)) is not None
    assert _first_stop(StallRule(window, 1e-12), lambda k: k ** -(1.1 * a_crit)) is None
    assert _first_stop(StallRule(DEFAULT_WINDOWS["fista"], 1e-12), lambda k: k ** -2.0) is None
    assert _first_stop(StallRule(DEFAULT_WINDOWS["proxgrad"], 1e-12), lambda k: 1.0 / k) is None


def test_a_descending_objective_is_slow_not_stalled():
    """A flat gap with an objective still falling by more than DESCENT of the gap over the window
    (an ill-conditioned healthy solve) runs on; once the objective stops falling, it stalls."""
    gap = 1e-3
    falling = lambda k: 1.0 - 2 * DESCENT * gap * np.log(k)           # noqa: E731
    assert _first_stop(StallRule(4.0, 1e-8), lambda k: gap, objective=falling) is None
    settles = lambda k: falling(min(k, 1000))                          # noqa: E731
    stop = _first_stop(StallRule(4.0, 1e-8), lambda k: gap, objective=settles)
    assert 1000 < stop <= 4 * 1000                  # after it settled, within one window
    rising = lambda k: 1.0 + 1e-3 * k                                  # noqa: E731
    assert _first_stop(StallRule(4.0, 1e-8), lambda k: gap, objective=rising) == 4 * START


def test_no_stall_near_tol_off_or_without_tol():
    assert _first_stop(StallRule(4.0, 1e-8), lambda k: 0.99 * MARGIN * 1e-8) is None
    assert _first_stop(StallRule(4.0, 1e-8), lambda k: 1.01 * MARGIN * 1e-8) == 4 * START
    assert _first_stop(StallRule(None, 1e-8), lambda k: 0.1) is None
    assert _first_stop(StallRule(4.0, None), lambda k: 0.1) is None
    # the best gap so far counts: a gap that jumps back up after halving does not reset the window
    rule = StallRule(4.0, 1e-8)
    assert _first_stop(rule, lambda k: 0.1 if k < 50 else (0.01 if k == 50 else 0.2)) == 200


def test_stall_window_is_checked():
    assert check_stall_window(None) is None and check_stall_window(3) == 3.0
    for bad in (1, 0.5, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="stall_window"):
            check_stall_window(bad)
    for bad in ("4", True):
        with pytest.raises(TypeError, match="stall_window"):
            check_stall_window(bad)
    D = np.ones((3 * 2, 2))
    with pytest.raises(ValueError, match="stall_window"):
        solve_penalized(D, 2, 0.1, 0.1, stall_window=1.0)
    with pytest.raises(ValueError, match="stall_window"):
        solve_penalized(D, 2, 0.1, 0.1, method="cvxpy", stall_window=4)
    with pytest.raises(ValueError, match="stall_window"):
        solve_penalized_factored(_pair_contrasts(), 0.1, 0.1, stall_window=0.0)
    assert "stalled" in STATUSES and issubclass(StalledWarning, ConvergenceWarning)


# ----------------------------------------------------------------------------- instances
def _readme_instance():
    """The K = 20, q = p = 10 instance of benchmarks/bench_clair_solvers.py and the README's
    `lowrank-fl compare clair` table (FISTA 120 iterations, Algorithm 1 450, to 1e-8)."""
    K = 20
    inst = generate(n_clients=K, p=10, q=10, rank=2, contaminated=2, noise=0.3 / np.sqrt(K), seed=0)
    return contrasts(inst.W_hat), 10, 1 / np.sqrt(K), 3 / K ** 1.5


def _pair_contrasts(K=8, h=6, r=2, p=16, seed=0):
    rng = np.random.default_rng(seed)
    A = np.linalg.qr(rng.standard_normal((p, r)))[0].T
    X = np.stack([A + 0.05 * rng.standard_normal((r, p)) for _ in range(K)])
    return PairContrasts(T=rng.standard_normal((K * (K - 1) // 2, h, 2 * r)), X=X)


# ----------------------------------------------------------------------------- broken solvers stall
@pytest.mark.parametrize("method", ["fista", "proxgrad"])
def test_missing_step_factor_in_the_s_step_stalls(monkeypatch, method):
    """The bug of issue 33: the S-step's block soft threshold BST(.; lam_S) instead of
    BST(.; t lam_S). Without the rule it runs to max_iter; with it, it stops at the end of its
    first full window, and running on would not have converged (the gap at max_iter is not even
    FACTOR below the stalled one)."""
    D, q, lam_L, lam_S = _readme_instance()
    t = 1 / (2 * (1 / 20))                                      # 1 / (2 max w), w = 1/K
    original = penalized._bst
    monkeypatch.setattr(penalized, "_bst",
                        lambda M, q, tau, inplace=False: original(M, q, tau / t, inplace))
    window = DEFAULT_WINDOWS[method]
    with pytest.warns(StalledWarning, match=r"stalled at iteration \d+ with relative duality gap"):
        res = solve_penalized(D, q, lam_L, lam_S, method=method, tol=1e-8, max_iter=20_000)
    assert res.status == "stalled" and not res.converged
    assert res.iterations == window * START                     # the first full window
    assert res.relative_gap > 1e-3 and f"{res.relative_gap:.3e}" in res.message
    with pytest.warns(ConvergenceWarning, match="max_iter"):
        ran_on = solve_penalized(D, q, lam_L, lam_S, method=method, tol=1e-8,
                                 max_iter=8 * res.iterations, stall_window=None)
    assert ran_on.status == "max_iter"
    assert ran_on.relative_gap > res.relative_gap / FACTOR


def test_pipeline_reports_a_stalled_solve_as_not_converged(monkeypatch):
    inst = simulate(n_clients=10, samples_per_client=200, rank=2, p=10, q=10, seed=1)
    original = penalized._bst
    monkeypatch.setattr(penalized, "_bst",
                        lambda M, q, tau, inplace=False: original(M, q, tau * 5, inplace))
    with pytest.warns(ConvergenceWarning, match="stalled"):
        res = fit(inst.W_hat, 10 ** -0.5, 0.4 * 10 ** -0.5, rank=2, tol=1e-4, max_iter=5000)
    assert res.status == "stalled" and res.solution.iterations == 4 * START


def test_factored_solver_with_a_wrong_threshold_stalls(monkeypatch):
    """The factored FISTA of the adapters with its SVT threshold halved inside the loop (the
    certificate stays honest: it uses the right threshold)."""
    D = _pair_contrasts()
    step, certify = factored._svt_step, factored._certify

    def honest_certify(*args, **kwargs):
        monkeypatch.setattr(factored, "_svt_step", step)
        try:
            return certify(*args, **kwargs)
        finally:
            monkeypatch.setattr(factored, "_svt_step", broken)

    def broken(D, B, tau, *args, **kwargs):
        return step(D, B, 0.5 * tau, *args, **kwargs)

    monkeypatch.setattr(factored, "_svt_step", broken)
    monkeypatch.setattr(factored, "_certify", honest_certify)
    with pytest.warns(StalledWarning, match="solve_penalized_factored stalled"):
        res = solve_penalized_factored(D, 8 ** -0.5, 3 / 8 ** 1.5, tol=1e-8)
    assert res.status == "stalled" and res.iterations == 4 * START
    with pytest.warns(ConvergenceWarning, match="max_iter"):
        ran_on = solve_penalized_factored(D, 8 ** -0.5, 3 / 8 ** 1.5, tol=1e-8,
                                          max_iter=8 * res.iterations, stall_window=None)
    assert ran_on.relative_gap > res.relative_gap / FACTOR


def test_nuclear_prox_with_a_wrong_threshold_stalls(monkeypatch):
    p = multitask_linear(d=8, rank=2, n_clients=10, samples_per_client=6, noise=0.1, seed=0)
    original = nuclear.svt
    monkeypatch.setattr(nuclear, "svt", lambda M, tau: original(M, 0.3 * tau))
    with pytest.warns(StalledWarning, match="solve_nuclear_prox stalled"):
        res = solve_nuclear_prox(p.X, p.y, 0.1, tol=1e-10)
    # the wrong iteration creeps towards its fixed point: it stops once the objective settles
    assert res.status == "stalled" and 4 * START <= res.iterations < 1000
    with pytest.warns(ConvergenceWarning, match="max_iter"):
        ran_on = solve_nuclear_prox(p.X, p.y, 0.1, tol=1e-10, max_iter=4 * res.iterations,
                                    stall_window=None)
    assert ran_on.relative_gap > res.relative_gap / FACTOR


# ----------------------------------------------------------------------------- healthy solves
@pytest.mark.parametrize("method, readme_iterations", [("fista", 120), ("proxgrad", 450)])
def test_readme_compare_instance_keeps_its_iteration_counts(method, readme_iterations):
    D, q, lam_L, lam_S = _readme_instance()
    on = solve_penalized(D, q, lam_L, lam_S, method=method, tol=1e-8, max_iter=100_000)
    off = solve_penalized(D, q, lam_L, lam_S, method=method, tol=1e-8, max_iter=100_000,
                          stall_window=None)
    assert on.status == off.status == "optimal"
    assert on.iterations == off.iterations == readme_iterations
    assert on.objective == off.objective


@pytest.mark.parametrize("seed", range(3))
def test_healthy_solves_keep_their_iteration_counts(seed):
    """§7 instances at the verifier's λ scalings, both methods, tight and loose tolerances, warm
    and cold: the rule changes no iteration count (rule off as the reference)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        for K, p in ((5, 10), (10, 10), (20, 20)):
            inst = simulate(n_clients=K, samples_per_client=200, rank=2, p=p, q=p, seed=seed)
            D = contrasts(inst.W_hat)
            for ratio, method, tol in ((1.0, "fista", 1e-10), (3.0, "proxgrad", 1e-8),
                                       (12.0, "fista", 1e-4)):
                args = (D, p, K ** -0.5, ratio / K * K ** -0.5)
                on = solve_penalized(*args, method=method, tol=tol, max_iter=50_000)
                off = solve_penalized(*args, method=method, tol=tol, max_iter=50_000,
                                      stall_window=None)
                assert (on.status, on.iterations) == (off.status, off.iterations) \
                    == ("optimal", off.iterations)
    D = _pair_contrasts(seed=seed)
    on = solve_penalized_factored(D, 8 ** -0.5, 3 / 8 ** 1.5, tol=1e-10)
    off = solve_penalized_factored(D, 8 ** -0.5, 3 / 8 ** 1.5, tol=1e-10, stall_window=None)
    assert on.status == "optimal" and on.iterations == off.iterations
    p = multitask_linear(d=8, rank=2, n_clients=10, samples_per_client=6, noise=0.1, seed=seed)
    on = solve_nuclear_prox(p.X, p.y, 0.1, tol=1e-11)
    off = solve_nuclear_prox(p.X, p.y, 0.1, tol=1e-11, stall_window=None)
    assert on.status == "optimal" and on.iterations == off.iterations


# ----------------------------------------------------------------------------- the verifier's side
def test_report_names_claims_stopped_on_a_stall_and_at_a_budget():
    """A captured StalledWarning becomes a 'stalled (warning)' record; the report (Markdown, HTML,
    results.json) names the claims cut short by a stall and by a time budget, apart."""
    from verify.claim import Claim, Evidence
    from verify.convergence import STALLED_STATUS, WARNED_STATUS, capture_convergence
    from verify.report._common import stop_sentence, stops
    from verify.report.html import render_html
    from verify.report.markdown import render_markdown
    from verify.report.results_json import build_results

    sink = []
    with capture_convergence(sink):
        warnings.warn("x stalled at iteration 100", StalledWarning)
        warnings.warn("y stopped at max_iter", ConvergenceWarning)
    assert sorted(r["status"] for r in sink) == sorted([STALLED_STATUS, WARNED_STATUS])
    mk = lambda i: Claim(id=f"clair.{i}", paper="clair", reference="r", statement="s",  # noqa: E731
                         kind="bound", experiment=None)
    solves = lambda st: {"count": 2, "not_converged": 1, "by_status": {"optimal": 1, st: 1},  # noqa: E731
                         "max_relative_gap": 0.1, "failures": []}
    results = [(mk("a"), Evidence(verdict="inconclusive", summary="s", solves=solves("stalled"))),
               (mk("b"), Evidence(verdict="inconclusive", summary="s", solves=solves(STALLED_STATUS))),
               (mk("c"), Evidence(verdict="inconclusive", summary="s", solves=solves("max_iter"))),
               (mk("d"), Evidence(verdict="exceeded time budget", summary="s",
                                  budget={"limit_s": 9, "source": "--time-budget", "exceeded": True})),
               (mk("e"), Evidence(verdict="holds", summary="s"))]
    assert stops(results) == {"stalled": ["clair.a", "clair.b"], "time_budget": ["clair.d"]}
    sentence = stop_sentence(results)
    assert "2 on a stalled solve" in sentence and "clair.a, clair.b" in sentence
    assert "1 at their time budget: clair.d" in sentence and "clair.c" not in sentence
    assert sentence in render_markdown(results, scale="quick")
    assert 'id="stops"' in render_html(results, scale="quick")
    assert build_results(results, scale="quick")["stops"] == stops(results)
    assert stop_sentence(results[2:3] + results[4:]) == ""
    assert 'id="stops"' not in render_html(results[4:], scale="quick")


# ------------------------------------------------------------------- broken certificates stop at once
def test_a_gap_below_minus_tol_is_a_broken_certificate():
    rule = StallRule(4.0, 1e-6)
    assert rule.broken(-1.01e-6) and not rule.broken(-1e-6) and not rule.broken(0.0)
    assert StallRule(None, 1e-6).broken(-1e-3)                  # whatever the window
    assert not StallRule(4.0, None).broken(-1.0)                # a run without tol certifies nothing


@pytest.mark.parametrize("method", ["fista", "proxgrad"])
def test_a_broken_certificate_stops_the_dense_solve_as_inaccurate(monkeypatch, method):
    # a dual value above the objective (weak duality broken by 1e-3 of the scale): "optimal" was
    # reported before, since gap <= tol held
    D, q, lam_L, lam_S = _readme_instance()
    real = penalized.dual_scale_from_residual

    def inflated(D, q, R, w, lam_L, lam_S, sq_norms=None):
        c, dual = real(D, q, R, w, lam_L, lam_S, sq_norms=sq_norms)
        return c, dual + 1e-3 * penalized.zero_objective(D, q, w)

    monkeypatch.setattr(penalized, "dual_scale_from_residual", inflated)
    with pytest.warns(ConvergenceWarning, match="weak duality forbids"):
        res = solve_penalized(D, q, lam_L, lam_S, method=method, tol=1e-6, max_iter=20_000)
    assert res.status == "inaccurate" and not res.converged
    # it stopped at the first check whose (inflated) gap was below -tol, and not later
    gaps = np.asarray(res.history["gap"]) / res.gap_scale
    assert gaps[-1] < -1e-6 and np.all(gaps[:-1] >= -1e-6)
    assert res.history["gap_iteration"][-1] == res.iterations


def test_a_broken_certificate_stops_the_factored_solve_as_inaccurate(monkeypatch):
    # the factored FISTA of the adapters with its dual value inflated by 1e-3 of the scale: once
    # the true gap is below that, the certified gap is below -tol, and the solve stops there
    D = _pair_contrasts()
    real = factored._certify

    def inflated(D, S, w, lam_L, lam_S, *args):
        cert = real(D, S, w, lam_L, lam_S, *args)
        if cert is None:
            return cert
        scale = 0.5 * w * float(D.block_sq_norms.sum())
        return (cert[0], cert[1] + 1e-3 * scale) + tuple(cert[2:])

    monkeypatch.setattr(factored, "_certify", inflated)
    with pytest.warns(ConvergenceWarning, match="weak duality forbids"):
        res = solve_penalized_factored(D, 0.3, 0.05, tol=1e-6, max_iter=5000)
    assert res.status == "inaccurate" and not res.converged
    gaps = np.asarray(res.history["gap"]) / res.gap_scale
    assert gaps[-1] < -1e-6 and np.all(gaps[:-1] >= -1e-6)


@pytest.mark.parametrize("method", ["fista", "proxgrad"])
def test_a_step_too_large_warns_and_is_reported_diverged(method):
    # t = 10 on K = 6 (1/(2 max w) = 3): the iterates grow; the solve used to stop "stalled" at an
    # objective of 3e50 and clair.fit returned a set from it
    inst = simulate(n_clients=6, samples_per_client=40, p=6, q=5, seed=0)
    D = contrasts(inst.W_hat)
    with pytest.warns(UserWarning, match=r"step_size=10 is above 1/\(2 max w\) = 3"):
        res = solve_penalized(D, 5, 6 ** -0.5, 3.5 / 6 ** 1.5, method=method, step_size=10.0)
    assert res.status == "diverged" and res.objective > res.gap_scale    # above where it started
    with pytest.raises(SolverError, match="diverged"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit(inst.W_hat, 6 ** -0.5, 3.5 / 6 ** 1.5, rank=2, step_size=10.0, method=method)
    # at the bound itself: no warning, converged
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ok = solve_penalized(D, 5, 6 ** -0.5, 3.5 / 6 ** 1.5, method=method, step_size=3.0)
    assert ok.status == "optimal"
