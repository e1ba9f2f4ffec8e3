"""Compare exact (CVXPY) and iterative solvers on one instance of a library program.

Modules (one job each):

methods   method names, which can run here (solver installed, memory estimate), defaults
runners   every call into a solver (one place to adapt)
child     one solve in a child process: time limit, peak memory
certify   the library's objective, certified duality gap and lower bound from any returned point
engine    compare_clair (7), compare_nuclear, compare_noiseless (24) → Comparison
result    Comparison (to_dict → compare.json, table → Markdown), MethodRow, PairRow
figure    suboptimality vs time
cli       ``lowrank-fl compare {clair,nuclear,noiseless}``
"""
from .engine import TAU_RULES, compare_clair, compare_noiseless, compare_nuclear
from .methods import default_methods, estimate_memory
from .result import SCHEMA_VERSION, Comparison, MethodRow, PairRow, load_schema

__all__ = ["compare_clair", "compare_nuclear", "compare_noiseless", "Comparison", "MethodRow",
           "PairRow", "SCHEMA_VERSION", "load_schema", "default_methods", "estimate_memory",
           "TAU_RULES"]
