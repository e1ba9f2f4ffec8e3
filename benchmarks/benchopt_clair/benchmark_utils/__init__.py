"""Shared pieces of the benchmark's solvers (benchopt imports this package as ``benchmark_utils``)."""
from benchopt import BaseSolver

from lowrank_fl.compare.runners import clair_point


class IterativeSolver(BaseSolver):
    """An iterative method of ``solve_penalized`` run for exactly ``n_iter`` iterations from
    ``L = S = 0``; subclasses set ``name`` and ``method``."""

    sampling_strategy = "iteration"
    method = None

    def set_objective(self, D, q, lam_L, lam_S, weights):
        self.problem = dict(D=D, q=q, lam_L=lam_L, lam_S=lam_S, weights=weights)

    def run(self, n_iter):
        p = self.problem
        self.L, self.S = clair_point(p["D"], p["q"], p["lam_L"], p["lam_S"],
                                     weights=p["weights"], method=self.method, n_iter=n_iter)

    def get_result(self):
        return dict(L=self.L, S=self.S)
