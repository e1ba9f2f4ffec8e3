"""CLAIR: federated LoRA fine-tuning via collaborative alignment.

Modules (one job each):

contrasts    pairs (j, k) in lexicographic order, stacked contrasts D (G*q, p) of eqs. (5)–(6)
program7     program (7) itself: objective, dual point, duality gap, KKT residuals, result class
penalized    solvers of (7): Algorithm 1 ("proxgrad"), FISTA (default) or CVXPY
factored     (7) on pair-factored contrasts D_g = T_g [X_j; X_k] (adapters), never formed
programs     CVXPY formulations: block-Schur nuclear norm, (7), noiseless (24), oracles (23), (17)
oracle       smooth reduced oracle (23) by L-BFGS-B for large K
certificate  dual certificate of Proposition S1, Lemma S3 residual, Block-IC μ, window (25)
simulate     the paper's §7 simulation and a general generator with ground truth
pipeline     fit: (7) → P_Â → collaborative set (8) → refined estimates (9); λ-path; baselines
cli          ``lowrank-fl clair fit``
"""
from .contrasts import as_blocks, contrasts, pairs
from .program7 import (PenalizedResult, dual_point, dual_value, duality_gap, kkt_residuals,
                       penalized_objective)
from .penalized import solve_penalized
from .factored import FactoredResult, PairContrasts, solve_penalized_factored
from .programs import (NoiselessResult, OracleResult, nuclear_norm_block_schur, solve_noiseless,
                       solve_noisy_oracle, solve_oracle)
from .oracle import solve_oracle_smooth
from .certificate import (Certificate, block_incoherence, build_certificate, lemma_s3_residual,
                          rho_prime, theorem1_window)
from .simulate import ClairInstance, generate, simulate
from .pipeline import (ClairFit, DetectionCounts, LambdaPath, collaborative_set, detection_counts,
                       fedavg, fit, lambda_path, largest_gap_split, largest_gap_threshold, local,
                       majority_pairs, oracle_fedavg, refine, refine_closed_form)

__all__ = [
    "pairs", "contrasts", "as_blocks",
    "solve_penalized", "PenalizedResult", "solve_penalized_factored", "PairContrasts",
    "FactoredResult", "penalized_objective", "dual_point", "dual_value", "duality_gap",
    "kkt_residuals",
    "nuclear_norm_block_schur", "solve_noiseless", "solve_oracle", "solve_noisy_oracle",
    "NoiselessResult", "OracleResult", "solve_oracle_smooth",
    "build_certificate", "Certificate", "lemma_s3_residual", "rho_prime", "block_incoherence",
    "theorem1_window",
    "simulate", "generate", "ClairInstance",
    "fit", "ClairFit", "lambda_path", "LambdaPath", "collaborative_set", "largest_gap_threshold", "largest_gap_split", "majority_pairs",
    "refine", "refine_closed_form", "local", "fedavg", "oracle_fedavg", "detection_counts",
    "DetectionCounts",
]
