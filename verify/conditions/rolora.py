"""Theorem conditions and constants of RoLoRA (Chen et al.) on an instance of the rank-one toy.

``generate(seed=0, **params)`` builds an instance (ground truth, initial a0, optional sample size
and step size); ``evaluate(instance)`` reports, for Lemma 5.3 / Theorem 5.4 (homogeneous, finite
sample), Lemma A.16 / Theorem A.14 (heterogeneous, population), Proposition 5.5 and
Proposition A.17:

* delta_0 and whether it lies in (0, 1);
* L_max = ||bbar*|| and the step-size bounds, the paper's and the corrected one (proof step (101)
  needs 2 eta ||bbar||^2 <= 1),
  with whether the given step satisfies each;
* the predicted per-iteration rate factors (eqs. (9), (254)) and iteration counts for eps;
* FFA-LoRA's floors: gamma^2 + ||bbar*||^2 delta_0^2 and (1 + c~)||b*||^2 delta_0^2;
* the accuracy thresholds eps', eps~ < (1 - delta_0^2)/16 the homogeneous theorem needs.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from lowrank_fl.validation import as_float_array, as_generator, check_positive
from lowrank_fl.exact.rolora import (c_tilde, ffa_expected_loss, ffa_population_loss, iterations_bound,
                                     rate_bound_heterogeneous, rate_bound_homogeneous, step_size_bound)
from lowrank_fl.problems.lora import angle_distance, init_at_angle, rank_one_lora

from . import Condition

__all__ = ["generate", "evaluate"]


def generate(seed=0, *, d: int = 20, n_clients: int = 10, gamma: float = 0.0, delta0: float = 0.5,
             samples_per_client: int | None = None, b_norm: float | None = None,
             step_size: float | None = None, eps: float = 1e-6) -> dict:
    """An instance: ``a_star`` (d,), ``b_star`` (N, d), ``a0`` (d,) and scalars.

    ``samples_per_client`` (m) is only recorded (the conditions need m, not the data);
    ``step_size`` defaults to the corrected bound ``1/(2 ||bbar*||^2)``.
    """
    if step_size is not None:
        step_size = check_positive(step_size, "step_size")
    eps = check_positive(eps, "eps")
    rng = as_generator(seed)
    prob = rank_one_lora(d=d, n_clients=n_clients, gamma=gamma, b_norm=b_norm, seed=rng)
    a0 = init_at_angle(prob.a_star, delta0, rng)
    inst = {"a_star": prob.a_star, "b_star": prob.b_star, "a0": a0, "eps": float(eps)}
    if samples_per_client is not None:
        inst["samples_per_client"] = int(samples_per_client)
    inst["step_size"] = float(step_size) if step_size is not None else 0.5 / prob.L_max ** 2
    return inst


def evaluate(instance: Mapping) -> list[Condition]:
    """Evaluate every theorem's hypotheses and constants on ``instance`` (see :func:`generate`)."""
    if not isinstance(instance, Mapping):
        raise TypeError(f"instance must be a mapping (dict or npz), got {type(instance).__name__}")
    missing = [k for k in ("a_star", "b_star", "a0") if k not in instance]
    if missing:
        raise ValueError(f"instance is missing {missing}; expected keys a_star (d,), b_star (N, d), a0 (d,)")
    a_star = as_float_array(instance["a_star"], "a_star", ndim=1)
    b_star = as_float_array(instance["b_star"], "b_star", ndim=2)
    if b_star.shape[1] != a_star.size:
        raise ValueError(f"b_star must have shape (N, {a_star.size}), got {b_star.shape}")
    a0 = as_float_array(instance["a0"], "a0", shape=a_star.shape)
    # step_size absent (or NaN, "not given") leaves the step conditions undecided; a given step
    # must be a positive number, and so must eps
    eta = instance.get("step_size")
    eta = np.nan if eta is None or (np.ndim(eta) == 0 and np.isnan(float(eta))) else \
        check_positive(float(eta), "step_size")
    eps = check_positive(float(instance.get("eps", 1e-6)), "eps")
    m = instance.get("samples_per_client")
    n = b_star.shape[0]

    b_bar = b_star.mean(axis=0)
    L = float(np.linalg.norm(b_bar))
    s = L ** 2
    gamma = float(np.sqrt(np.mean(np.sum((b_star - b_bar) ** 2, axis=1))))
    delta0 = angle_distance(a0, a_star)
    unit = abs(np.linalg.norm(a_star) - 1) <= 1e-10
    homog = gamma <= 1e-12
    out = [
        Condition("Def 5.2", "a_star unit", float(np.linalg.norm(a_star)), "= 1", bool(unit)),
        Condition("Thm 5.4 / A.14", "delta_0", delta0, "in (0, 1)", bool(0 < delta0 < 1)),
        Condition("Def A.13", "gamma", gamma, "", None, "(1/N) sum ||b_i* - bbar*||^2 = gamma^2"),
        Condition("Thm 5.4", "homogeneous (all b_i* equal)", homog, "True", homog),
        Condition("Assumption 5.1 / A.12", "L_max = ||bbar*||", L, "", None, "tightest admissible L_max"),
    ]
    bound_paper = step_size_bound(L, setting="homogeneous", variant="paper")
    bound_fixed = step_size_bound(L, setting="homogeneous", variant="corrected")
    het_bound = step_size_bound(L, setting="heterogeneous")
    out += [
        Condition("Lemma 5.3 / Thm 5.4", "step bound (paper) 1/L_max^2", bound_paper, "",
                  None if not np.isfinite(eta) else eta <= bound_paper, "as stated; too loose: proof step (101) needs 2 eta ||bbar||^2 <= 1"),
        Condition("Lemma 5.3 / Thm 5.4", "step bound (corrected) 1/(2 L_max^2)", bound_fixed, "",
                  None if not np.isfinite(eta) else eta <= bound_fixed,
                  "needed by proof step (101): 2 eta ||bbar||^2 <= 1"),
        Condition("Lemma A.16 / Thm A.14", "step bound 1/(2 L_max^2)", het_bound, "",
                  None if not np.isfinite(eta) else eta <= het_bound),
        Condition("all", "step_size eta", eta),
    ]
    if np.isfinite(eta):
        rho_h = rate_bound_homogeneous(eta, delta0, L)
        rho_p = rate_bound_heterogeneous(eta, delta0, L)
        out += [
            Condition("Lemma 5.3 eq. (9)", "rate factor sqrt(1 - eta(1-delta0^2)||b*||^2)", rho_h, "< 1",
                      bool(rho_h < 1) if np.isfinite(rho_h) else False),
            Condition("Lemma A.16 eq. (254)", "rate factor 1 - 2 eta (1-delta0^2)||bbar*||^2", rho_p, "in [0, 1)",
                      0 <= rho_p < 1),
        ]
        c_h, c_p = eta * s, 2 * eta * s
        if 0 < delta0 < 1 and 0 < c_h <= 1:
            out.append(Condition("Thm 5.4", f"T for eps={eps:g} (c = eta ||b*||^2)",
                                 iterations_bound(c_h, delta0, eps, setting="homogeneous")))
        if 0 < delta0 < 1 and 0 < c_p <= 1:
            out.append(Condition("Thm A.14", f"T for eps={eps:g} (c = 2 eta ||bbar*||^2)",
                                 iterations_bound(c_p, delta0, eps, setting="heterogeneous")))
    out += [
        Condition("Prop A.17 eq. (274)", "FFA population loss gamma^2 + ||bbar*||^2 delta0^2",
                  ffa_population_loss(gamma, L, delta0)),
        Condition("§3.7", "global optimum gamma^2", gamma ** 2),
        Condition("Thm 5.4", "eps', eps~ must be below (1 - delta0^2)/16", (1 - delta0 ** 2) / 16, "", None,
                  "thresholds of Lemma 5.3; m = Omega(max(log N/min(eps1,eps2)^2, d log(2/eps0)/eps2^2))"),
    ]
    if m is not None:
        m = int(m)
        if m > 2:
            out += [Condition("Prop 5.5 eq. (242)", "c~ = (N(4-m)-2)/(N^2 m(m-2))", c_tilde(n, m)),
                    Condition("Prop 5.5 eq. (11)", "FFA expected loss (1+c~)||b*||^2 delta0^2",
                              ffa_expected_loss(delta0, L, n, m), "", None, "homogeneous setting")]
        out.append(Condition("Lemma 5.3", "samples per client m vs d", m, f">= d = {a_star.size} (order)",
                             m >= a_star.size, "m = Omega(d log(2/eps0)/eps2^2) up to constants"))
    return out
