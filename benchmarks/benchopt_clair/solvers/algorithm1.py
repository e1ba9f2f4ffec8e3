"""Algorithm 1 of the CLAIR paper as printed (``solve_penalized(method="proxgrad")``: eqs.
(19)–(21), constant step 1/(2 max w)), run for exactly ``n_iter`` iterations from ``L = S = 0``."""
from benchmark_utils import IterativeSolver


class Solver(IterativeSolver):
    name = "algorithm1"
    method = "proxgrad"
