"""lowrank_fl: federated low-rank learning, solved exactly and iteratively.

Subpackages
-----------
linalg      orthonormal bases, projectors, subspace distances, SVT, block soft thresholding
problems    synthetic federated instances with ground truth
algorithms  iterative federated methods (FedRep, FLUTE, FedAvg/D-GD, RoLoRA, ...) → Trace
exact       closed-form and CVXPY references
clair       CLAIR: contrasts, convex programs, solvers, pipeline, certificates
adapters    CLAIR and baselines on PEFT LoRA adapter directories (exact subspace reduction)
"""
from .results import ConvergenceWarning, SolverError, SolverResult, Trace

__version__ = "0.1.0"
__all__ = ["SolverError", "ConvergenceWarning", "SolverResult", "Trace", "__version__"]
