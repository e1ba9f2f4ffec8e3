"""Theorem conditions of "FedAvg with fine tuning" (Collins et al., 2022) on an instance.

``generate(seed=0, **params)`` builds the App. C.1 instance (``paper_instance``) and returns its
arrays; ``evaluate(instance)`` reports Assumptions 1-2, Definition 1, Theorem 1/2's initial
conditions (i)-(iii), the step-size bound (and the inconsistent variants the
proofs of Theorems 1-2 cite), the participation bound, the guaranteed contraction and round bound, and D-GD's
invariant lower bound (Proposition 1's mechanism).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from lowrank_fl.validation import as_float_array, check_int, check_positive
from lowrank_fl.exact.fedavg_ft import dgd_invariant_lower_bound, head_statistics, theorem2_constants
from lowrank_fl.linalg import subspace_distance
from lowrank_fl.problems.fedavg_ft import paper_instance

from . import Condition

__all__ = ["generate", "evaluate"]


def generate(seed=0, *, d: int = 100, k: int = 5, n_clients: int = 40, step_size: float = 0.4,
             local_steps: int = 2, heads: str = "gaussian", epsilon: float = 1e-6,
             clients_per_round: int | None = None) -> dict:
    """The App. C.1 instance as a dict of arrays and scalars.

    Keys: ``B_star`` (d, k), ``heads`` (M, k), ``B0`` (d, k), ``w0`` (k,), ``step_size``,
    ``local_steps``, ``epsilon``, ``clients_per_round`` (M when None).
    """
    inst = paper_instance(d=d, rank=k, n_clients=n_clients, step_size=step_size, heads=heads, seed=seed)
    return {"B_star": inst.problem.B_star, "heads": inst.problem.heads, "B0": inst.B0, "w0": inst.w0,
            "step_size": float(step_size), "local_steps": int(local_steps), "epsilon": float(epsilon),
            "clients_per_round": int(n_clients if clients_per_round is None else clients_per_round)}


def _scalar(instance, key, default=None):
    if key not in instance:
        if default is None:
            raise ValueError(f"instance must contain {key!r}")
        return default
    return np.asarray(instance[key]).item()


def evaluate(instance: Mapping) -> list[Condition]:
    """Evaluate the paper's hypotheses and constants on ``instance`` (see :func:`generate`)."""
    for key in ("B_star", "heads", "B0"):
        if key not in instance:
            raise ValueError(f"instance must contain {key!r}")
    Bs = as_float_array(instance["B_star"], "B_star", ndim=2)
    d, k = Bs.shape
    W = as_float_array(instance["heads"], "heads", shape=(None, k))
    B0 = as_float_array(instance["B0"], "B0", shape=(d, k))
    w0 = as_float_array(instance["w0"], "w0", shape=(k,)) if "w0" in instance else np.zeros(k)
    M = W.shape[0]
    alpha = check_positive(float(_scalar(instance, "step_size")), "step_size")
    tau = check_int(int(_scalar(instance, "local_steps")), "local_steps", minimum=1)
    eps = float(_scalar(instance, "epsilon", 1e-6))
    m = check_int(int(_scalar(instance, "clients_per_round", M)), "clients_per_round", minimum=1, maximum=M)

    st = head_statistics(W)
    delta0 = subspace_distance(Bs, B0)
    E0 = 1 - delta0 ** 2
    L, mu, kap = st.L_max, st.mu, st.kappa_max
    T1, T2, A = "Theorem 1/2", "Theorem 2", "Assumptions"
    out = [
        Condition(A, "L_max (Assumption 1)", L, "< inf", bool(np.isfinite(L))),
        Condition(A, "mu (Assumption 2, centered diversity)", mu, "> 0", bool(mu > 0)),
        Condition(A, "kappa_max = L_max / mu", kap),
        Condition(A, "gamma^2 (Definition 1)", st.gamma2),
        Condition(A, "H (Definition 1, typo corrected)", st.H),
        Condition(A, "lambda_min of the uncentered head moment (Lemma 10)", st.second_moment_min,
                  note="what actually drives the contraction; > 0 suffices in experiments (Lemma 10 uses the uncentered second moment)"),
        Condition(T1, "(i) delta0 = dist(B0, B*)", delta0, "< 1 (E0 = 1 - delta0^2 > 0)", bool(delta0 < 1)),
        Condition(T1, "tau >= 2", tau, ">= 2", tau >= 2, note="tau = 1 is D-GD (Proposition 1)"),
        Condition(A, "D-GD invariant lower bound ||(I - P_S) B*||", dgd_invariant_lower_bound(B0, Bs, W),
                  note="every D-GD iterate stays at least this far from B* (D-GD only adds B* wbar* directions, eq. (70))"),
    ]
    Delta0 = float(np.linalg.norm(np.eye(k) - alpha * B0.T @ B0, 2))
    if mu > 0:
        c = theorem2_constants(W, delta0, tau, step_size=alpha, epsilon=eps, E0=E0 if E0 > 0 else None)
        out += [
            Condition(T2, "(ii) ||I - alpha B0^T B0||", Delta0, f"<= {c.init_delta_bound:.3g}",
                      bool(Delta0 <= c.init_delta_bound)),
            Condition(T2, "(iii) ||w0||", float(np.linalg.norm(w0)), f"<= {c.init_w_bound:.3g}",
                      bool(np.linalg.norm(w0) <= c.init_w_bound)),
            Condition(T2, "step size alpha (c3 = 4800)", alpha, f"<= {c.step_size_bound:.3g}",
                      bool(alpha <= c.step_size_bound)),
            Condition(T2, "step size, Lemma 9 (54) variant", alpha,
                      f"<= {(1 - delta0) / (4800 * np.sqrt(tau) * L**2 * kap**2):.3g}",
                      bool(alpha <= (1 - delta0) / (4800 * np.sqrt(tau) * L**2 * kap**2)),
                      note="the proofs cite inconsistent L-powers (Theorem 2, (54), (39))"),
            Condition(T2, "step size, (39) variant alpha^2 <= 1/(120 kappa^2 L^2)", alpha,
                      f"<= {1 / np.sqrt(120 * kap**2 * L**2):.3g}",
                      bool(alpha <= 1 / np.sqrt(120 * kap**2 * L**2))),
            Condition(T2, "participation m", m, f">= {c.participation_bound:.3g}",
                      bool(m >= c.participation_bound)),
            Condition(T2, "contraction 0.04 alpha^2 tau mu^2 E0 at this alpha", c.contraction,
                      note="the formula evaluated outside the theorem's range if alpha exceeds the bound"),
            Condition(T2, f"round bound for epsilon = {eps:g} at this alpha", c.round_bound),
        ]
        cmax = theorem2_constants(W, delta0, tau, epsilon=eps, E0=E0 if E0 > 0 else None)
        out.append(Condition(T2, f"round bound for epsilon = {eps:g} at the step-size bound",
                             cmax.round_bound, note="what the theorem guarantees (Theorem 2, c3 = 4800)"))
    return out
