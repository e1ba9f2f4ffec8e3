"""Per-client reference for one FedAvg round, shared by tests/test_fedavg.py and
benchmarks/bench_fedavg_round.py (one definition: the benchmark checks against the same loop)."""
import numpy as np


def loop_round(B, w, tau, alpha, *, targets=None, X=None, y=None):
    """Straightforward reference: every client copies (B, w), runs tau simultaneous GD steps
    (population error ``B w - theta_i`` or full-batch ``X_i^T (X_i B w - y_i) / n``), then the
    server averages. B (d, k), w (k,), targets (m, d) or X (m, n, d) with y (m, n)."""
    m = len(targets) if targets is not None else len(X)
    B_sum, w_sum = np.zeros_like(B), np.zeros_like(w)
    for i in range(m):
        Bi, wi = B.copy(), w.copy()
        for _ in range(tau):
            if targets is not None:
                e = Bi @ wi - targets[i]
            else:
                e = X[i].T @ (X[i] @ (Bi @ wi) - y[i]) / X[i].shape[0]
            Bi, wi = Bi - alpha * np.outer(e, wi), wi - alpha * Bi.T @ e
        B_sum += Bi
        w_sum += wi
    return B_sum / m, w_sum / m
