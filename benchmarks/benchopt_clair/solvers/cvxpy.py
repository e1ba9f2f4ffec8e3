"""The exact conic program (7) through CVXPY (block-Schur nuclear norm), one solve per run;
``solver`` is a CVXPY backend lowrank_fl accepts (Clarabel, SCS)."""
from benchopt import BaseSolver

from lowrank_fl.compare.runners import clair_point


class Solver(BaseSolver):
    name = "cvxpy"
    sampling_strategy = "run_once"
    parameters = {"solver": ["CLARABEL", "SCS"]}

    def skip(self, D, q, lam_L, lam_S, weights):
        import cvxpy as cp

        if self.solver not in cp.installed_solvers():
            return True, f"{self.solver} is not installed"
        return False, None

    def set_objective(self, D, q, lam_L, lam_S, weights):
        self.problem = dict(D=D, q=q, lam_L=lam_L, lam_S=lam_S, weights=weights)

    def run(self, _):
        p = self.problem
        self.L, self.S = clair_point(p["D"], p["q"], p["lam_L"], p["lam_S"],
                                     weights=p["weights"], method="cvxpy", solver=self.solver)

    def get_result(self):
        return dict(L=self.L, S=self.S)
