"""benchopt benchmark of CLAIR's penalized program (7).

    min_{L,S}  1/2 sum_g w_g ||P_g(D - L - S)||_F^2 + lam_L ||L||_* + lam_S sum_g ||S^(g)||_F

on the contrasts ``D`` (G*q, p) of local estimates ``W_hat`` (K, q, p), with the §7 penalty
scalings ``lam_L = c_L / sqrt(K)``, ``lam_S = c_S / K^1.5`` and ``w_g = 1/K``. Every solver's
``(L, S)`` is scored by lowrank_fl itself: the objective ``value`` and the certified duality gap
(``duality_gap``, and ``relative_gap`` = gap / F(0, 0)), the same formula for every solver.

Run (from the repository, with ``pip install ".[benchopt]"``)::

    benchopt run benchmarks/benchopt_clair -d "clair-simulation[K=10]" -n 20
    benchopt run benchmarks/benchopt_clair -d "npz[path=/abs/path/W_hat.npz]"

Add a solver: a file in ``solvers/`` whose ``get_result`` returns ``{"L": ..., "S": ...}``.
"""
import numpy as np
from benchopt import BaseObjective

from lowrank_fl.clair import contrasts, duality_gap, penalized_objective


class Objective(BaseObjective):
    name = "CLAIR program (7)"
    url = "https://github.com/lowrank-fl/lowrank_fl"
    min_benchopt_version = "1.5"
    parameters = {"c_L": [1.0], "c_S": [3.0]}
    test_config = {"dataset": {"name": "clair-simulation", "K": 4, "p": 4, "q": 4, "n": 50}}

    def skip(self, W_hat):
        if W_hat is None:
            return True, "no W_hat: pass -d 'npz[path=/abs/path/W_hat.npz]'"
        return False, None

    def set_data(self, W_hat):
        W = np.asarray(W_hat, dtype=float)
        self.K, self.q, _ = W.shape
        self.D = contrasts(W)
        self.lam_L = self.c_L / np.sqrt(self.K)
        self.lam_S = self.c_S / self.K ** 1.5
        Z = np.zeros_like(self.D)
        self.scale = penalized_objective(self.D, self.q, Z, Z, self.lam_L, self.lam_S)

    def get_objective(self):
        return dict(D=self.D, q=self.q, lam_L=self.lam_L, lam_S=self.lam_S, weights=None)

    def evaluate_result(self, L, S):
        args = (self.D, self.q, L, S, self.lam_L, self.lam_S)
        gap = duality_gap(*args)
        return dict(value=penalized_objective(*args), duality_gap=gap,
                    relative_gap=gap / self.scale)

    def get_one_result(self):
        Z = np.zeros_like(self.D)
        return dict(L=Z, S=Z)
