"""Conditions of FLUTE's Theorems 5.1 / 5.5 (and App. A) on an instance.

Scales (Sec. 5 vs App. A): the main text uses the singular values ``lambda_j`` of ``Phi``; the appendix
``lambda*_j = 2 lambda_j``; ``Delta = 2 (lambda_k - lambda_(k+1)) = lambda*_k - lambda*_(k+1)``.
Unspecified absolute constants (``c``, ``c_1``, ``c'``) are taken as 1 and the conditions that
involve them are reported (``holds=None``), not decided.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from lowrank_fl.validation import as_float_array, as_generator, check_int, check_positive
from lowrank_fl.algorithms.flute import flute_init
from lowrank_fl.exact.flute import (data_weight, divergence_boundary, entry_time_bound,
                                    region_quantities, theta_embedding)
from lowrank_fl.problems.underparameterized import underparameterized

from . import Condition

__all__ = ["generate", "evaluate"]


def generate(seed=0, *, d: int = 10, n_clients: int = 15, k: int = 2, spectrum=None,
             samples_per_client: int = 20, noise: float = float(np.sqrt(0.3)),
             step_size: float = 0.03, init_scale: float | None = None, gamma1: float = 0.25,
             gamma2: float = 0.125, rounds: int = 1000, delta: float = 0.1,
             epsilon: float = 0.1) -> dict:
    """An App. C instance (default ``d = 10``, ``M = 15``, ``eta = 0.03``, ``alpha = 1/(10 d)``)
    with the hyper-parameters the theorems talk about and one random initialization.

    Returns
    -------
    dict with ``Phi`` (d, M), ``B0`` (d, k), ``W0`` (M, k) (heads, client axis first) and scalars ``k``, ``noise``,
    ``step_size``, ``init_scale``, ``gamma1``, ``gamma2``, ``samples_per_client``, ``rounds``,
    ``delta``, ``epsilon``.
    """
    rng = as_generator(seed)
    p = underparameterized(d=d, n_clients=n_clients, rank=k, spectrum=spectrum, noise=noise, seed=rng)
    alpha = 1.0 / (10 * d) if init_scale is None else check_positive(init_scale, "init_scale")
    B0, W0 = flute_init(d=d, rank=k, n_clients=n_clients, init_scale=alpha, seed=rng)
    return {"Phi": p.Phi, "B0": B0, "W0": W0, "k": k, "noise": float(noise),
            "step_size": float(step_size), "init_scale": alpha, "gamma1": float(gamma1),
            "gamma2": float(gamma2), "samples_per_client": int(samples_per_client),
            "rounds": int(rounds), "delta": float(delta), "epsilon": float(epsilon)}


def evaluate(instance: Mapping) -> list[Condition]:
    """Evaluate the hypotheses and constants of Thms 5.1 / 5.5, Prop. A.2, Claim A.3."""
    Phi = as_float_array(instance["Phi"], "Phi", ndim=2)
    d, M = Phi.shape
    k = check_int(int(instance["k"]), "k", minimum=1, maximum=min(d, M) - 1)
    eta = check_positive(float(instance["step_size"]), "step_size")
    alpha = check_positive(float(instance["init_scale"]), "init_scale")
    g1, g2 = float(instance["gamma1"]), float(instance["gamma2"])
    N = int(instance["samples_per_client"])
    T = int(instance["rounds"])
    sigma = float(instance["noise"])
    delta = float(instance["delta"])
    eps = float(instance["epsilon"])
    s = np.linalg.svd(Phi, compute_uv=False)
    lam1, E = float(s[0]), float(np.sum(s ** 2))
    lam1s = 2 * lam1
    gap = 2 * float(s[k - 1] - s[k])
    dbar = max(d, M)
    rank = int(np.sum(s > 1e-12 * s[0]))
    out: list[Condition] = []
    C = out.append
    C(Condition("Def 3.1", "under-parameterized (rank(Phi) > k)", rank, f"> {k}", rank > k))
    C(Condition("Thm 5.1/5.5", "spectral gap Delta = 2(lambda_k - lambda_(k+1))", gap, "> 0",
                gap > 0))
    C(Condition("Thm 5.1/5.5", "lambda_1 (main text; appendix lambda*_1 = 2 lambda_1)", lam1))
    C(Condition("Thm 5.1/5.5", "E = ||Phi||_F^2", E))
    C(Condition("Thm 5.1/5.5", "gamma1 = 1/4, gamma2 = 1/8", (g1, g2), "(0.25, 0.125)",
                bool(np.isclose(g1, 0.25) and np.isclose(g2, 0.125))))
    b_ok = divergence_boundary(g2)
    C(Condition("eq. (4)", "objective bounded below (gamma1 < 2 gamma2 + a, a = 1/2)", g1,
                f"< {b_ok:g}", g1 < b_ok,
                note=f"the paper's App. C says gamma1 > {2 * g2:g} (= 2 gamma2) diverges; "
                     "the correct boundary (appendix normalization) is 2 gamma2 + 1/2"))
    if gap <= 0:
        return out
    paper = gap ** 2 / (228 * lam1 ** 3)
    fixed = gap ** 2 / (288 * lam1 ** 3)
    C(Condition("Thm 5.1", "step size eta <= Delta^2 / (228 lambda_1^3) (as printed)", eta,
                f"<= {paper:.3g}", eta <= paper, note="228 is likely a typo for 288 (Lemmas A.10-A.12 give 288)"))
    C(Condition("Lemma A.10-A.12", "step size eta <= Delta^2 / (36 lambda*_1^3) = Delta^2/(288 "
                "lambda_1^3)", eta, f"<= {fixed:.3g}", eta <= fixed, note="the binding condition"))
    C(Condition("Prop A.2", "step size eta <= 1 / (6 lambda*_1)", eta, f"<= {1 / (6 * lam1s):.3g}",
                eta <= 1 / (6 * lam1s)))
    C(Condition("Thm 5.1/5.5", "init scale alpha <~ 1/(10 d)", alpha, f"<= {1 / (10 * d):.3g}",
                alpha <= 1 / (10 * d) * (1 + 1e-12)))
    rho = 1 - eta * gap / 16
    C(Condition("Thm 5.5 eq. (8)", "contraction factor 1 - eta Delta / 16", rho, "in (0, 1)",
                0 < rho < 1))
    C(Condition("measured", "population rate 1 - eta Delta / 2 (measured, sharper)",
                1 - eta * gap / 2))
    if "B0" in instance and "W0" in instance:
        B0 = as_float_array(instance["B0"], "B0", shape=(d, k))
        W0 = as_float_array(instance["W0"], "W0", shape=(M, k))
        q = region_quantities(theta_embedding(B0, W0, Phi), k)
        C(Condition("Claim A.3", "sigma_1^2(Theta^0) <= lambda*_1", q["sigma1"] ** 2,
                    f"<= {lam1s:.3g}", q["sigma1"] ** 2 <= lam1s))
        C(Condition("Claim A.3", "sigma_1^2(Theta_res^0) <= lambda*_k - Delta/2",
                    q["sigma1_res"] ** 2, f"<= {2 * s[k - 1] - gap / 2:.3g}",
                    q["sigma1_res"] ** 2 <= 2 * s[k - 1] - gap / 2))
        C(Condition("Claim A.3", "sigma_k^2(Theta_k^0) <= Delta/4", q["sigmak_k"] ** 2,
                    f"<= {gap / 4:.3g}", q["sigmak_k"] ** 2 <= gap / 4))
        if q["sigmak_k"] > 0:
            tr = entry_time_bound(s, k, eta, q["sigmak_k"])
            C(Condition("Prop A.2 eq. (16)", "entry time T_R into region R", tr, f"< T = {T}",
                        tr < T))
    kappa_T = rho ** T
    root = np.sqrt(k * lam1 ** 2 + E) + np.sqrt(k) * sigma
    n55 = (dbar + np.log(1 / delta) + np.log(T)) * root ** 2 / (kappa_T ** 2 * gap ** 2)
    C(Condition("Thm 5.5", "samples per client N >= c_1 (d̄ + log 1/δ + log T)(√(kλ_1²+E) + "
                "√k σ)² / (κ_T² Δ²), c_1 = 1", N, f">= {n55:.3g}", None,
                note="absolute constant unknown: reported, not decided"))
    n51 = (lam1 ** 4 * k * (dbar + np.log(1 / delta) + np.log(np.log(1 / eps))) * root ** 2
           / (M * eta ** 2 * gap ** 6 * eps ** 2))
    C(Condition("Thm 5.1", "samples per client for accuracy epsilon (c = 1)", N, f">= {n51:.3g}",
                None, note="absolute constant unknown: reported, not decided"))
    t51 = np.log(eps * np.sqrt(M) * eta * gap ** 2 / (lam1 ** 2 * np.sqrt(k))) / np.log(rho)
    C(Condition("Thm 5.1", "rounds for accuracy epsilon (c' = 1)", T, f">= {t51:.3g}", None,
                note="absolute constant unknown: reported, not decided"))
    C(Condition("Remark 5.2", "per-client sample complexity scale max(d, M) / M", dbar / M))
    C(Condition("Lemma A.13", "data weight a of the analysed normalization",
                data_weight("appendix")))
    return out
