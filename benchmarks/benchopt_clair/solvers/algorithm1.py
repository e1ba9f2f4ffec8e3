"""Algorithm 1 of the CLAIR paper as printed (``solve_penalized(method="proxgrad")``: eqs.
(19)–(21), constant step 1/(2 max w)), run for
exactly ``n_iter`` iterations from ``L = S = 0``."""
from benchopt import BaseSolver

from lowrank_fl.compare.runners import clair_point


class Solver(BaseSolver):
    name = "algorithm1"
    sampling_strategy = "iteration"

    def set_objective(self, D, q, lam_L, lam_S, weights):
        self.problem = dict(D=D, q=q, lam_L=lam_L, lam_S=lam_S, weights=weights)

    def run(self, n_iter):
        p = self.problem
        self.L, self.S = clair_point(p["D"], p["q"], p["lam_L"], p["lam_S"],
                                     weights=p["weights"], method="proxgrad", n_iter=n_iter)

    def get_result(self):
        return dict(L=self.L, S=self.S)
