"""FISTA with adaptive restart on program (7) (``solve_penalized(method="fista")``), run for
exactly ``n_iter`` iterations from ``L = S = 0``."""
from benchmark_utils import IterativeSolver


class Solver(IterativeSolver):
    name = "fista"
    method = "fista"
