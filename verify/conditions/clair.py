"""Theorem conditions of CLAIR (Theorems 1-3, Lemma 2) evaluated on an instance.

``generate(seed=0, **params)`` builds an instance dict; ``evaluate(instance)`` returns the
theorems' constants and hypotheses as :class:`~verify.conditions.Condition` rows.

Instance keys (arrays client-axis first):

* ``W_hat`` (K, q, p) — required (the only thing CLAIR sees);
* ``W`` (K, q, p), ``A`` (r, p), ``benign`` (K,) bool — the truth; hypotheses that need it are
  reported with ``holds=None`` ("unknown") when it is absent;
* ``noise`` — the estimation errors ``W_hat - W`` (K, q, p), or their level ``tau_k`` (scalar or
  (K,)); optional (otherwise estimated from ``W_hat - W`` when ``W`` is given);
* optional scalars ``r``, ``lam_L``, ``lam_S``, ``a``, ``b`` (default 0.99), ``alpha`` (0.5),
  ``w`` (pair weight, default 1/K), ``tau`` (noise level, same as a scalar ``noise``).

Notes on the paper: for the model-induced ``L0`` (zero on the contaminated
pairs I) Lemma 1's ``rho = ||P_I P_U P_I||`` is identically 0, and Block-IC forces
``mu >= G/(G-s)``; Theorems 1-2 then need roughly ``r s/(G-s) < 1/16``, so on the §7 design
(40% contaminated) the window (25) is empty.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from lowrank_fl.validation import as_float_array
from lowrank_fl.clair.certificate import block_incoherence, theorem1_window, theorem1_x
from lowrank_fl.linalg import block_norms, row_projector

from . import Condition

__all__ = ["generate", "evaluate", "equal_leverage_instance", "DESIGNS"]

DESIGNS = ("general", "sec7", "equal-leverage")


def equal_leverage_instance(K: int = 40, p: int = 4, *, seed=0) -> dict:
    """Hand-built noiseless instance with one contaminated client and perfectly spread leverage.

    ``r = 1``, ``q = K - 1``; benign ``W^(k) = W0 + e_k a`` (``e_k`` the k-th basis vector of
    R^q, ``a`` a unit row), so every benign pair block ``(e_j - e_k) a`` has the same norm and
    Block-IC holds with the smallest possible ``mu = G/(G - s)``. Then
    ``x^2 = r s/(G - s) = 2/(K - 2)``, and the window (25) (a = b = 0.99) is non-empty for
    ``K >= 35``. The last client is contaminated (``W0 + N(0,1)``).
    """
    rng = np.random.default_rng(seed)
    q = K - 1
    a = rng.standard_normal(p)
    a /= np.linalg.norm(a)
    W0 = rng.standard_normal((q, p))
    W = np.empty((K, q, p))
    W[:K - 1] = W0 + np.eye(q)[:, :, None] * a          # client k: W0 + e_k a
    W[K - 1] = W0 + rng.standard_normal((q, p))
    benign = np.ones(K, dtype=bool)
    benign[-1] = False
    return {"W_hat": W.copy(), "W": W, "A": a[None, :], "benign": benign, "r": 1}


def generate(seed=0, *, design: str = "general", n_clients: int | None = None, p: int = 4,
             q: int = 3, rank: int | None = None, contaminated: int | None = None,
             delta: float = 0.0, noise: float = 0.0, samples_per_client: int | None = None,
             variant: str = "unit-variance", c1: float = 1.0, c2: float = 3.0,
             a: float = 0.99, b: float = 0.99, alpha: float = 0.5, K: int | None = None,
             r: int | None = None, n: int | None = None) -> dict:
    """An instance for :func:`evaluate`.

    Parameters
    ----------
    seed : int or Generator
    design : {"general", "sec7", "equal-leverage"}
        ``"general"``: :func:`lowrank_fl.clair.simulate.generate`; ``"sec7"``:
        :func:`lowrank_fl.clair.simulate.simulate` (``samples_per_client`` defaults to the
        paper's 100/150/300); ``"equal-leverage"``: :func:`equal_leverage_instance`
        (``n_clients``, ``p`` only).
    n_clients, p, q, rank : int
        The paper's K, p, q, r (defaults 12, 4, 3, 1).
    contaminated : int or None
        A COUNT of contaminated clients (default: 2 for "general", the paper's 40 % for "sec7").
    delta, noise, samples_per_client, variant
        Passed to the generator.
    c1, c2 : float
        Tuning ``lam_L = c1 K^{-1/2}``, ``lam_S = c2 K^{-3/2}`` (Theorem 2 / §7 scalings).
    a, b, alpha : float
        Theorem constants stored in the instance.
    K, r, n : int
        Deprecated aliases of ``n_clients``, ``rank``, ``samples_per_client``.

    Returns
    -------
    dict
        ``W_hat``, ``W`` (K, q, p), ``A`` (r, p), ``benign`` (K,), and scalars ``r``, ``lam_L``,
        ``lam_S``, ``a``, ``b``, ``alpha``, ``tau`` (noise level, if known).
    """
    import warnings

    from lowrank_fl.clair.simulate import generate as gen_general
    from lowrank_fl.clair.simulate import simulate

    for old, new, value in (("K", "n_clients", K), ("r", "rank", r), ("n", "samples_per_client", n)):
        if value is not None:
            if {"K": n_clients, "r": rank, "n": samples_per_client}[old] is not None:
                raise TypeError(f"give {new} only ({old} is its deprecated alias), not both")
            warnings.warn(f"{old} is deprecated (generate({old}=...), --param {old}=...); use {new}",
                          DeprecationWarning, stacklevel=2)
    n_clients = (K if K is not None else 12) if n_clients is None else n_clients
    rank = (r if r is not None else 1) if rank is None else rank
    samples_per_client = n if samples_per_client is None else samples_per_client
    if design not in DESIGNS:
        raise ValueError(f"design must be one of {DESIGNS}, got {design!r}")
    if design == "equal-leverage":
        inst = equal_leverage_instance(n_clients, p, seed=seed)
        tau = 0.0
    elif design == "sec7":
        m = {10: 100, 20: 150, 50: 300}.get(p, 3 * p) if samples_per_client is None \
            else samples_per_client
        ci = simulate(p=p, q=q, n_clients=n_clients, samples_per_client=m, rank=rank,
                      contaminated=contaminated, variant=variant, seed=seed)
        inst = {"W_hat": np.asarray(ci.W_hat), "W": np.asarray(ci.W), "A": np.asarray(ci.A),
                "benign": np.asarray(ci.benign), "r": rank}
        tau = None
    else:
        ci = gen_general(n_clients=n_clients, p=p, q=q, rank=rank,
                         contaminated=2 if contaminated is None else contaminated, delta=delta,
                         noise=noise, seed=seed)
        inst = {"W_hat": np.asarray(ci.W_hat), "W": np.asarray(ci.W), "A": np.asarray(ci.A),
                "benign": np.asarray(ci.benign), "r": rank}
        tau = float(noise)
    Kk = inst["W_hat"].shape[0]
    inst.update(lam_L=c1 / np.sqrt(Kk), lam_S=c2 / Kk ** 1.5, a=a, b=b, alpha=alpha)
    if tau is not None:
        inst["tau"] = tau
    return inst


# --------------------------------------------------------------------------------------------
def _scalar(instance, key, default=None, *, minimum=0.0, strict=True):
    """A scalar of the instance (None where absent), finite and > ``minimum`` (>= with ``strict``
    False): a penalty, weight, rank or constant that is 0, negative or NaN makes no theorem's
    condition, and would print as a number."""
    v = instance.get(key, default)
    if v is None:
        return None
    v = np.asarray(v)
    if v.size != 1:
        raise ValueError(f"instance[{key!r}] must be a scalar, got shape {v.shape}")
    x = float(v.reshape(()))
    if not (np.isfinite(x) and (x > minimum if strict else x >= minimum)):
        raise ValueError(f"instance[{key!r}] must be a finite number {'>' if strict else '>='} {minimum:g}, got {x:g}")
    return x


def _unknown(theorem, name, required, note="needs the truth (W, A, benign), absent from the instance"):
    return Condition(theorem, name, None, required, None, note)


def evaluate(instance: Mapping) -> list[Condition]:
    """Evaluate Theorems 1-3 and Lemma 2's constants and hypotheses on ``instance``.

    Returns
    -------
    list of Condition
        Theorem 1: G, s, mu (Block-IC of L0), the floor G/(G-s), x = sqrt(mu r s/G) < ab/(1+a)^2,
        window (25) non-empty, lam_S/lam_L inside it, rho (= 0 identically, the erratum) and
        rho' (when the oracle (23) can be solved). Lemma 2's eta bound. Theorem 3: alpha range,
        beta_min > 0, eta > 1/2. Theorem 2: the scalings K tau^2, lam_L sqrt(K), lam_S K^{3/2},
        w K (reported, O(1) wanted).
    """
    if "W_hat" not in instance:
        raise ValueError("instance must contain 'W_hat' (K, q, p), the local estimates")
    W_hat = as_float_array(instance["W_hat"], "W_hat", ndim=3)
    K, q, p = W_hat.shape
    if K < 2:
        raise ValueError(f"W_hat must hold at least 2 clients, got shape {W_hat.shape}")
    G = K * (K - 1) // 2
    a = _scalar(instance, "a", 0.99)
    b = _scalar(instance, "b", 0.99)
    alpha = _scalar(instance, "alpha", 0.5)
    lam_L, lam_S = _scalar(instance, "lam_L"), _scalar(instance, "lam_S")
    w = _scalar(instance, "w", 1.0 / K)
    has_truth = all(k in instance for k in ("W", "A", "benign"))
    r = _scalar(instance, "r")
    if r is None and "A" in instance:
        r = float(np.atleast_2d(instance["A"]).shape[0])
    r = None if r is None else int(r)
    out: list[Condition] = [Condition("setup", "K", K), Condition("setup", "G = K(K-1)/2", G),
                            Condition("setup", "r", r, note="" if r is not None else "unknown")]
    T1, T2, T3, L2 = "Theorem 1", "Theorem 2", "Theorem 3", "Lemma 2"

    if not has_truth or r is None:
        for name, req in [("s = |I|", ""), ("mu (Block-IC of L0)", ">= 1"),
                          ("x = sqrt(mu r s/G)", f"< ab/(1+a)^2 = {a * b / (1 + a) ** 2:.4g}"),
                          ("window (25) non-empty", "True"), ("rho = ||P_I P_U P_I||", "< 1"),
                          ("eta", "> sqrt(1 - 1/(mu r) + 1/(4(K-1)))")]:
            out.append(_unknown(T1 if "eta" not in name else L2, name, req))
        out += [_unknown(T3, "eta > 1/2", "True"), _unknown(T3, "beta_min", "> 0")]
    else:
        W = as_float_array(instance["W"], "W", shape=(K, q, p))
        A = np.atleast_2d(as_float_array(instance["A"], "A"))
        benign = np.asarray(instance["benign"], dtype=bool)
        if benign.shape != (K,):
            raise ValueError(f"benign must have shape ({K},), got {benign.shape}")
        P_A = row_projector(A)
        j, k = np.triu_indices(K, 1)
        I = ~(benign[j] & benign[k])
        s = int(I.sum())
        eta = float(benign.mean())
        D = W[j] - W[k]
        L0 = np.where(I[:, None, None], 0.0, D @ P_A)      # = (B_j - B_k) A on benign pairs (delta = 0)
        out.append(Condition(T1, "s = |I|", s, note=f"s/G = {s / G:.3f}"))
        mu = block_incoherence(L0.reshape(G * q, p), q, r) if s < G else float("inf")
        floor = G / (G - s) if s < G else float("inf")
        out.append(Condition(T1, "mu (Block-IC of L0)", mu, f">= G/(G-s) = {floor:.4g} always",
                             bool(mu >= floor * (1 - 1e-10)),
                             "Block-IC for the model-induced U forces mu >= G/(G-s)"))
        x = theorem1_x(mu, r, s, G) if np.isfinite(mu) else float("inf")
        thr = a * b / (1 + a) ** 2
        out.append(Condition(T1, "x = sqrt(mu r s/G)", x, f"< ab/(1+a)^2 = {thr:.4g}", bool(x < thr),
                             f"a = {a}, b = {b}; even at mu = G/(G-s), x >= sqrt(r s/(G-s)) = "
                             f"{np.sqrt(r * s / max(G - s, 1)):.4g}"))
        window = theorem1_window(mu, r, s, G, a, b) if np.isfinite(mu) else None
        out.append(Condition(T1, "window (25) for lam_S/lam_L", window, "non-empty", window is not None,
                             "" if window is not None else "empty: Theorems 1-2 say nothing here"))
        if lam_L is not None and lam_S is not None:
            ratio = lam_S / lam_L
            inside = window is not None and window[0] < ratio < window[1]
            out.append(Condition(T1, "lam_S/lam_L in window (25)", ratio,
                                 "in window" if window else "in window (empty)", bool(inside)))
        U = np.linalg.svd(L0.reshape(G * q, p), full_matrices=False)[0][:, :r].reshape(G, q, r)
        UI = U[I].reshape(-1, r)
        rho = float(np.linalg.norm(UI, 2) ** 2) if UI.size else 0.0
        out.append(Condition(T1, "rho = ||P_I P_U P_I|| (Lemma 1)", rho, "< 1", bool(rho < 1),
                             "identically 0 for the model-induced L0 (it vanishes on I), so Lemmas 1-2 "
                             "are vacuous; rho' below is the meaningful quantity"))
        out.append(_rho_prime(D, I, q, A, r, lam_L, lam_S, G))
        eta_req = np.sqrt(max(0.0, 1 - 1 / (mu * r) + 1 / (4 * (K - 1)))) if np.isfinite(mu) else 1.0
        out.append(Condition(L2, "eta = |C|/K", eta, f"> sqrt(1 - 1/(mu r) + 1/(4(K-1))) = {eta_req:.4g}",
                             bool(eta > eta_req)))
        out.append(Condition(T3, "eta > 1/2", eta, "> 0.5", bool(eta > 0.5)))
        nb, nc = int(benign.sum()), int((~benign).sum())
        lo, hi = (nc - 1) / (K - 1), (nb - 1) / (K - 1)
        out.append(Condition(T3, "alpha in ((|C^c|-1)/(K-1), (|C|-1)/(K-1)]", alpha,
                             f"in ({lo:.4g}, {hi:.4g}]", bool(lo < alpha <= hi), "Remark 3"))
        Pp = np.eye(p) - P_A
        mixed = benign[j] != benign[k]
        beta = float(block_norms(D[mixed] @ Pp).min()) if np.any(mixed) else float("inf")
        out.append(Condition(T3, "beta_min", beta, "> 0", bool(beta > 1e-12 * max(1.0, np.abs(D).max())),
                             "mixed-pair separation min ||S_Aperp^(j,k)||_F"))

    # Theorem 2 scalings (reported: each should stay O(1) as K grows)
    tau = _scalar(instance, "tau", strict=False)
    note_tau = "given"
    if tau is None and "noise" in instance:
        nz = np.asarray(instance["noise"], dtype=float)
        if nz.ndim == 3:
            tau = float(np.sqrt(np.max(np.mean(nz ** 2, axis=(1, 2)))))
            note_tau = "max_k RMS entry of the given noise"
        elif nz.ndim <= 1:
            tau = float(np.max(nz))
        else:
            raise ValueError(f"noise must be (K, q, p) errors or a scalar/(K,) level, got shape {nz.shape}")
    if tau is None and "W" in instance:
        Xi = W_hat - as_float_array(instance["W"], "W", shape=(K, q, p))
        tau = float(np.sqrt(np.max(np.mean(Xi ** 2, axis=(1, 2)))))
        note_tau = "estimated as max_k RMS entry of W_hat - W"
    out.append(Condition(T2, "K tau^2", None if tau is None else K * tau ** 2, "O(1) (n_k >~ K)", None,
                         "unknown: no noise level or truth" if tau is None else note_tau))
    out.append(Condition(T2, "lam_L sqrt(K)", None if lam_L is None else lam_L * np.sqrt(K), "O(1)", None,
                         "" if lam_L is not None else "lam_L not given"))
    out.append(Condition(T2, "lam_S K^{3/2}", None if lam_S is None else lam_S * K ** 1.5, "O(1)", None,
                         "" if lam_S is not None else "lam_S not given"))
    out.append(Condition(T2, "w K", w * K, "O(1)", None))
    return out


def _rho_prime(D, I, q, A, r, lam_L, lam_S, G) -> Condition:
    """rho' = ||P_I P_U' P_I|| for the oracle optimizer L' of (23) (Lemmas S7/S8), if computable."""
    name, req = "rho' = ||P_I P_U' P_I|| (oracle L', Lemma S8)", "< 1"
    if lam_L is None or lam_S is None:
        return Condition("Theorem 1", name, None, req, None, "needs lam_L and lam_S")
    if G * q > 200_000 or not np.any(I) or np.all(I):
        return Condition("Theorem 1", name, None, req, None, "not computed (size or no contaminated pairs)")
    try:
        from lowrank_fl.clair.certificate import rho_prime
        from lowrank_fl.clair.oracle import solve_oracle_smooth

        res = solve_oracle_smooth(D.reshape(G * q, -1), q, A, I, lam_L, lam_S)
        U = np.linalg.svd(res.L, full_matrices=False)[0][:, :r]
        val = rho_prime(U, I, q)
    except ValueError as exc:  # benign blocks outside row(A) (delta > 0 or noise): (23) infeasible
        return Condition("Theorem 1", name, None, req, None, f"not computable: {exc}")
    return Condition("Theorem 1", name, val, req, bool(val < 1),
                     f"Lemma S7 bound (lam_S/lam_L) sqrt(s) = {lam_S / lam_L * np.sqrt(I.sum()):.4g}")
