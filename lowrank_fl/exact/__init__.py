"""Closed-form and convex (CVXPY) references the iterative methods are checked against.

multitask  method of moments, per-client OLS + SVD, AltMin, population optima (FedRep)
nuclear    nuclear-norm-penalized multi-task least squares: CVXPY and proximal gradient with gap
flute      truncated-SVD target, regularized population minimizer and divergence boundary (FLUTE)
rolora     FFA-LoRA floors (Prop. 5.5), population recursions, step-size bounds (RoLoRA)
fedavg_ft  FedAvg's population optimum, one-round closed form, D-GD lower bound (FedAvg-FT)

Several modules define a ``population_optimum`` for their own model; use the module namespace.
"""
from . import fedavg_ft, flute, multitask, nuclear, rolora
from .multitask import altmin, method_of_moments, ols_then_svd
from .nuclear import NuclearResult, solve_nuclear_cvxpy, solve_nuclear_prox
from .flute import truncated_target

__all__ = [
    "multitask", "nuclear", "flute", "rolora", "fedavg_ft",
    "altmin", "method_of_moments", "ols_then_svd", "solve_nuclear_cvxpy", "solve_nuclear_prox",
    "NuclearResult", "truncated_target",
]
