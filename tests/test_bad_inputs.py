"""Bad input across the public API and the command line: every case fails (or, for a retired keyword,
warns) with a message that names the argument, the option or the file.

Each case is ``Case(id, call, expect, name)``: ``call(tmp)`` performs the bad call (``tmp`` is a
fresh directory for the command-line cases); ``expect`` is the exception type (``ValueError`` or
``TypeError``), ``DeprecationWarning`` for a retired keyword name (never silently ignored), or
``CLI`` for a command line, which must exit with status 2 and print one error line (after
argparse's usage line for its own errors) and no traceback; ``name`` must appear in the message.
"""
from __future__ import annotations

import contextlib
import functools
import io
import re
import warnings
from typing import Callable, NamedTuple

import numpy as np
import pytest

CLI = "cli"


class Case(NamedTuple):
    id: str
    call: Callable
    expect: object
    name: str


# ----------------------------------------------------------------------------- small instances
@functools.cache
def mt():
    from lowrank_fl.problems import multitask_linear
    return multitask_linear(d=6, rank=2, n_clients=4, samples_per_client=8, seed=0)


@functools.cache
def mt_pop():
    from lowrank_fl.problems import multitask_linear
    return multitask_linear(d=6, rank=2, n_clients=4, seed=0)


@functools.cache
def up():
    from lowrank_fl.problems import underparameterized
    return underparameterized(d=6, n_clients=4, rank=2, samples_per_client=8, seed=0)


@functools.cache
def r1():
    from lowrank_fl.problems import rank_one_lora
    return rank_one_lora(d=5, n_clients=3, seed=0)


@functools.cache
def r1_data():
    from lowrank_fl.problems import rank_one_lora
    return rank_one_lora(d=5, n_clients=3, samples_per_client=8, seed=0)


@functools.cache
def lm():
    from lowrank_fl.problems import lora_matrix_problem
    return lora_matrix_problem(d=5, n_clients=3, rank=2, seed=0)


def _rng(seed=0):
    return np.random.default_rng(seed)


def _X():
    return _rng().standard_normal((4, 8, 6))


def _y():
    return _rng(1).standard_normal((4, 8))


def _B():
    return np.linalg.qr(_rng(2).standard_normal((6, 2)))[0]


def _heads():
    return _rng(3).standard_normal((4, 2))


def _nan(shape):
    a = np.ones(shape)
    a.flat[0] = np.nan
    return a


# ----------------------------------------------------------------------------- the API cases
def _problems():
    from lowrank_fl.problems import (MultitaskProblem, haar_orthonormal, lora_matrix_problem,
                                     multitask_linear, new_client, paper_instance,
                                     proposition1_instance, rank_one_lora, underparameterized)
    mk = functools.partial(multitask_linear, d=6, rank=2, n_clients=4)
    return [
        Case("multitask_linear-d-zero", lambda t: multitask_linear(d=0, rank=1, n_clients=4), ValueError, "d"),
        Case("multitask_linear-d-float", lambda t: multitask_linear(d=6.5, rank=2, n_clients=4), TypeError, "d"),
        Case("multitask_linear-rank-zero", lambda t: multitask_linear(d=6, rank=0, n_clients=4), ValueError, "rank"),
        Case("multitask_linear-rank-above-d", lambda t: multitask_linear(d=6, rank=7, n_clients=4), ValueError, "rank"),
        Case("multitask_linear-n_clients-zero", lambda t: multitask_linear(d=6, rank=2, n_clients=0), ValueError, "n_clients"),
        Case("multitask_linear-samples-zero", lambda t: mk(samples_per_client=0), ValueError, "samples_per_client"),
        Case("multitask_linear-noise-negative", lambda t: mk(noise=-1.0), ValueError, "noise"),
        Case("multitask_linear-noise-nan", lambda t: mk(noise=float("nan")), ValueError, "noise"),
        Case("multitask_linear-heads-unknown", lambda t: mk(heads="bogus"), ValueError, "heads"),
        Case("multitask_linear-B_star-shape", lambda t: mk(B_star=np.eye(5)[:, :2]), ValueError, "B_star"),
        Case("multitask_linear-seed-negative", lambda t: mk(seed=-1), ValueError, "seed"),
        Case("multitask_linear-seed-string", lambda t: mk(seed="abc"), TypeError, "seed"),
        Case("multitask_linear-seed-float", lambda t: mk(seed=1.5), TypeError, "seed"),
        Case("multitask_linear-retired-k", lambda t: multitask_linear(d=6, k=2, n_clients=4), DeprecationWarning, "rank"),
        Case("haar_orthonormal-rank-above-d", lambda t: haar_orthonormal(d=3, rank=5), ValueError, "rank"),
        Case("from_data-X-2d", lambda t: MultitaskProblem.from_data(np.ones((8, 6)), np.ones(8), rank=2), ValueError, "X"),
        Case("from_data-y-mismatch", lambda t: MultitaskProblem.from_data(_X(), np.ones((4, 7)), rank=2), ValueError, "y"),
        Case("from_data-X-nan", lambda t: MultitaskProblem.from_data(_nan((4, 8, 6)), _y(), rank=2), ValueError, "X"),
        Case("from_data-rank-above-d", lambda t: MultitaskProblem.from_data(_X(), _y(), rank=6), ValueError, "rank"),
        Case("from_data-X-empty", lambda t: MultitaskProblem.from_data(np.ones((0, 8, 6)), np.ones((0, 8)), rank=2), ValueError, "X"),
        Case("underparameterized-rank-above-d", lambda t: underparameterized(d=4, n_clients=3, rank=5), ValueError, "rank"),
        Case("underparameterized-spectrum-length", lambda t: underparameterized(d=6, n_clients=4, rank=2, spectrum=[3.0]), ValueError, "spectrum"),
        Case("underparameterized-spectrum-negative", lambda t: underparameterized(d=4, n_clients=4, rank=2, spectrum=[3.0, 2.0, -1.0, 0.5]), ValueError, "spectrum"),
        Case("underparameterized-noise-inf", lambda t: underparameterized(d=6, n_clients=4, rank=2, noise=float("inf")), ValueError, "noise"),
        Case("rank_one_lora-d-zero", lambda t: rank_one_lora(d=0, n_clients=3), ValueError, "d"),
        Case("rank_one_lora-gamma-negative", lambda t: rank_one_lora(d=5, n_clients=3, gamma=-0.5), ValueError, "gamma"),
        Case("rank_one_lora-b_norm-negative", lambda t: rank_one_lora(d=5, n_clients=3, b_norm=-1.0), ValueError, "b_norm"),
        Case("rank_one_lora-n_clients-float", lambda t: rank_one_lora(d=5, n_clients=3.0), TypeError, "n_clients"),
        Case("lora_matrix_problem-rank-above-d", lambda t: lora_matrix_problem(d=3, n_clients=3, rank=5), ValueError, "rank"),
        Case("lora_matrix_problem-gamma-negative", lambda t: lora_matrix_problem(d=5, n_clients=3, rank=2, gamma=-1.0), ValueError, "gamma"),
        Case("lora_matrix_problem-b_scale-zero", lambda t: lora_matrix_problem(d=5, n_clients=3, rank=2, b_scale=0.0), ValueError, "b_scale"),
        Case("paper_instance-n_clients-zero", lambda t: paper_instance(d=10, rank=2, n_clients=0), ValueError, "n_clients"),
        Case("paper_instance-step_size-negative", lambda t: paper_instance(d=10, rank=2, n_clients=4, step_size=-0.4), ValueError, "step_size"),
        Case("proposition1_instance-delta0-above-one", lambda t: proposition1_instance(d=6, rank=2, n_clients=4, delta0=1.5), ValueError, "delta0"),
        Case("new_client-samples-zero", lambda t: new_client(mt(), samples_per_client=0), ValueError, "samples_per_client"),
        Case("new_client-head-shape", lambda t: new_client(mt(), samples_per_client=5, head=np.ones(3)), ValueError, "head"),
        Case("new_client-retired-n", lambda t: new_client(mt(), n=5, seed=0), DeprecationWarning, "samples_per_client"),
        Case("new_client-problem-type", lambda t: new_client("problem", samples_per_client=5), TypeError, "problem"),
    ]


def _algorithms():
    from lowrank_fl.algorithms import (dgd, fedavg, fedavg_lora, fedavg_round, fedrep, fedrep_round,
                                       federated_lora_matrix, fedsgd, ffa_lora, fine_tune, flute,
                                       interference, local_only, rolora)
    from lowrank_fl.problems import new_client
    return [
        Case("fedrep-rounds-negative", lambda t: fedrep(mt(), -1, 0.1), ValueError, "rounds"),
        Case("fedrep-rounds-float", lambda t: fedrep(mt(), 2.5, 0.1), TypeError, "rounds"),
        Case("fedrep-step_size-negative", lambda t: fedrep(mt(), 2, -0.1), ValueError, "step_size"),
        Case("fedrep-step_size-nan", lambda t: fedrep(mt(), 2, float("nan")), ValueError, "step_size"),
        Case("fedrep-step_size-string", lambda t: fedrep(mt(), 2, "0.1"), TypeError, "step_size"),
        Case("fedrep-data-unknown", lambda t: fedrep(mt(), 2, 0.1, data="bogus"), ValueError, "data"),
        Case("fedrep-data-fixed-without-dataset", lambda t: fedrep(mt_pop(), 2, 0.1, data="fixed"), ValueError, "data"),
        Case("fedrep-batch_size-without-fresh", lambda t: fedrep(mt(), 2, 0.1, batch_size=4), ValueError, "batch_size"),
        Case("fedrep-batch_size-zero", lambda t: fedrep(mt(), 2, 0.1, data="fresh", batch_size=0), ValueError, "batch_size"),
        Case("fedrep-clients_per_round-zero", lambda t: fedrep(mt(), 2, 0.1, clients_per_round=0), ValueError, "clients_per_round"),
        Case("fedrep-clients_per_round-too-many", lambda t: fedrep(mt(), 2, 0.1, clients_per_round=5), ValueError, "clients_per_round"),
        Case("fedrep-clients_per_round-fraction", lambda t: fedrep(mt(), 2, 0.1, clients_per_round=0.5), TypeError, "clients_per_round"),
        Case("fedrep-init-unknown", lambda t: fedrep(mt(), 2, 0.1, init="bogus"), ValueError, "init"),
        Case("fedrep-init-shape", lambda t: fedrep(mt(), 2, 0.1, init=np.ones((5, 2))), ValueError, "init"),
        Case("fedrep-init-zero", lambda t: fedrep(mt(), 2, 0.1, init=np.zeros((6, 2))), ValueError, "init"),
        Case("fedrep-tol-negative", lambda t: fedrep(mt(), 2, 0.1, tol=-1.0), ValueError, "tol"),
        Case("fedrep-head_steps-zero", lambda t: fedrep(mt(), 2, 0.1, head_steps=0), ValueError, "head_steps"),
        Case("fedrep-batch-unknown", lambda t: fedrep(mt(), 2, 0.1, batch="bogus"), ValueError, "batch"),
        Case("fedrep-seed-negative", lambda t: fedrep(mt(), 2, 0.1, seed=-1), ValueError, "seed"),
        Case("fedrep-problem-type", lambda t: fedrep("problem", 2, 0.1), TypeError, "problem"),
        Case("fedrep-unknown-keyword", lambda t: fedrep(mt(), 2, 0.1, bogus=1), TypeError, "bogus"),
        Case("fedrep-retired-participation", lambda t: fedrep(mt(), 1, 0.1, participation=0.5, seed=0), DeprecationWarning, "clients_per_round"),
        Case("fedrep-retired-fresh_samples", lambda t: fedrep(mt(), 1, 0.1, fresh_samples=False, seed=0), DeprecationWarning, "data"),
        Case("fedrep_round-B-X-mismatch", lambda t: fedrep_round(np.ones((5, 2)), _X(), _y(), 0.1), ValueError, "X"),
        Case("fedrep_round-y-mismatch", lambda t: fedrep_round(_B(), _X(), np.ones((4, 7)), 0.1), ValueError, "y"),
        Case("fedrep_round-heads-shape", lambda t: fedrep_round(_B(), _X(), _y(), 0.1, head_steps=2, heads=np.ones((4, 3))), ValueError, "heads"),
        Case("local_only-ridge-negative", lambda t: local_only(mt(), ridge=-1.0), ValueError, "ridge"),
        Case("fedsgd-aggregation-unknown", lambda t: fedsgd(mt(), 2, 0.1, aggregation="bogus"), ValueError, "aggregation"),
        Case("fedsgd-head_ridge-negative", lambda t: fedsgd(mt(), 2, 0.1, head_ridge=-1.0), ValueError, "head_ridge"),
        Case("fedsgd-retired-participation", lambda t: fedsgd(mt(), 1, 0.1, participation=1.0, seed=0), DeprecationWarning, "clients_per_round"),
        Case("flute-gamma1-negative", lambda t: flute(up(), 2, 0.1, gamma1=-0.25), ValueError, "gamma1"),
        Case("flute-gamma2-nan", lambda t: flute(up(), 2, 0.1, gamma2=float("nan")), ValueError, "gamma2"),
        Case("flute-normalization-unknown", lambda t: flute(up(), 2, 0.1, normalization="bogus"), ValueError, "normalization"),
        Case("flute-aggregation-unknown", lambda t: flute(up(), 2, 0.1, aggregation="bogus"), ValueError, "aggregation"),
        Case("flute-record_every-zero", lambda t: flute(up(), 2, 0.1, record_every=0), ValueError, "record_every"),
        Case("flute-divergence_threshold-negative", lambda t: flute(up(), 2, 0.1, divergence_threshold=-1.0), ValueError, "divergence_threshold"),
        Case("flute-init_scale-negative", lambda t: flute(up(), 2, 0.1, init_scale=-1.0), ValueError, "init_scale"),
        Case("flute-step_size_reg-zero", lambda t: flute(up(), 2, 0.1, step_size_reg=0.0), ValueError, "step_size_reg"),
        Case("flute-batch_size-length", lambda t: flute(up(), 2, 0.1, data="fresh", batch_size=[4, 4, 4]), ValueError, "batch_size"),
        Case("flute-problem-type", lambda t: flute(mt(), 2, 0.1), TypeError, "problem"),
        Case("flute-retired-samples", lambda t: flute(up(), 1, 0.1, data="fresh", samples=4, seed=0), DeprecationWarning, "batch_size"),
        Case("fedavg-local_steps-zero", lambda t: fedavg(mt_pop(), 2, 0.1, local_steps=0), ValueError, "local_steps"),
        Case("fedavg-local_steps-huge", lambda t: fedavg(mt_pop(), 2, 0.1, local_steps=10**9), ValueError, "local_steps"),
        Case("fedavg-batch_size-zero", lambda t: fedavg(mt_pop(), 2, 0.1, data="fresh", batch_size=0), ValueError, "batch_size"),
        Case("fedavg-init-unknown", lambda t: fedavg(mt_pop(), 2, 0.1, init="bogus"), ValueError, "init"),
        Case("fedavg-step_size-inf", lambda t: fedavg(mt_pop(), 2, float("inf")), ValueError, "step_size"),
        Case("fedavg-retired-mode", lambda t: fedavg(mt_pop(), 1, 0.1, mode="population", seed=0), DeprecationWarning, "data"),
        Case("dgd-step_size-zero", lambda t: dgd(mt_pop(), 2, 0.0), ValueError, "step_size"),
        Case("dgd-init-shape", lambda t: dgd(mt_pop(), 2, 0.1, init=(np.ones((5, 2)), np.ones(2))), ValueError, "init"),
        Case("fedavg_round-w-mismatch", lambda t: fedavg_round(_B(), np.ones(3), 0.1, targets=np.ones((4, 6))), ValueError, "w"),
        Case("fedavg_round-local_steps-zero", lambda t: fedavg_round(_B(), np.ones(2), 0.1, local_steps=0, targets=np.ones((4, 6))), ValueError, "local_steps"),
        Case("fine_tune-steps-negative", lambda t: fine_tune(new_client(mt(), samples_per_client=5, seed=0), _B(), np.ones(2), steps=-1), ValueError, "steps"),
        Case("fine_tune-B-shape", lambda t: fine_tune(new_client(mt(), samples_per_client=5, seed=0), np.ones((5, 2)), np.ones(2)), ValueError, "B"),
        Case("fine_tune-retired-n", lambda t: fine_tune(mt(), _B(), np.ones(2), steps=1, n=5, seed=0), DeprecationWarning, "samples_per_client"),
        Case("rolora-step_size-unknown", lambda t: rolora(r1(), 2, "bogus"), ValueError, "step_size"),
        Case("rolora-L_max-negative", lambda t: rolora(r1(), 2, "paper", L_max=-1.0), ValueError, "L_max"),
        Case("rolora-init-shape", lambda t: rolora(r1(), 2, 0.1, init=np.ones(4)), ValueError, "init"),
        Case("rolora-init-zero", lambda t: rolora(r1(), 2, 0.1, init=np.zeros(5)), ValueError, "init"),
        Case("rolora-init-angle-above-one", lambda t: rolora(r1(), 2, 0.1, init=1.5), ValueError, "delta0"),
        Case("rolora-retired-sample_mode", lambda t: rolora(r1_data(), 1, 0.1, sample_mode="reuse", seed=0), DeprecationWarning, "data"),
        Case("rolora-retired-a0", lambda t: rolora(r1(), 1, 0.1, a0=np.ones(5), seed=0), DeprecationWarning, "init"),
        Case("ffa_lora-local-unknown", lambda t: ffa_lora(r1(), 2, local="bogus"), ValueError, "local"),
        Case("ffa_lora-local_steps-zero", lambda t: ffa_lora(r1(), 2, 0.1, local="gd", local_steps=0), ValueError, "local_steps"),
        Case("fedavg_lora-local_steps-zero", lambda t: fedavg_lora(r1(), 2, 0.1, local_steps=0), ValueError, "local_steps"),
        Case("fedavg_lora-clients_per_round-too-many", lambda t: fedavg_lora(r1(), 2, 0.1, clients_per_round=4), ValueError, "clients_per_round"),
        Case("federated_lora_matrix-method-unknown", lambda t: federated_lora_matrix(lm(), 2, 0.1, method="bogus"), ValueError, "method"),
        Case("federated_lora_matrix-init-shape", lambda t: federated_lora_matrix(lm(), 2, 0.1, init=np.ones((5, 2))), ValueError, "init"),
        Case("federated_lora_matrix-retired-A0", lambda t: federated_lora_matrix(lm(), 1, 0.1, A0=np.ones((2, 5)), seed=0), DeprecationWarning, "init"),
        Case("interference-shape-mismatch", lambda t: interference(np.ones((3, 2, 5)), np.ones((4, 5, 2))), ValueError, "B"),
        Case("interference-weights-negative", lambda t: interference(np.ones((3, 2, 5)), np.ones((3, 5, 2)), weights=[1.0, -1.0, 1.0]), ValueError, "weights"),
    ]


def _exact():
    from lowrank_fl.exact import fedavg_ft as eft
    from lowrank_fl.exact import flute as efl
    from lowrank_fl.exact import multitask as emt
    from lowrank_fl.exact import rolora as ero
    Phi = _rng(5).standard_normal((6, 4))
    return [
        Case("method_of_moments-k-zero", lambda t: emt.method_of_moments(_X(), _y(), 0), ValueError, "k"),
        Case("method_of_moments-X-2d", lambda t: emt.method_of_moments(np.ones((8, 6)), _y(), 2), ValueError, "X"),
        Case("method_of_moments-y-nan", lambda t: emt.method_of_moments(_X(), _nan((4, 8)), 2), ValueError, "y"),
        Case("ols_then_svd-ridge-negative", lambda t: emt.ols_then_svd(_X(), _y(), 2, ridge=-1.0), ValueError, "ridge"),
        Case("altmin-k-above-d", lambda t: emt.altmin(_X(), _y(), 7), ValueError, "k"),
        Case("altmin-max_iter-zero", lambda t: emt.altmin(_X(), _y(), 2, max_iter=0), ValueError, "max_iter"),
        Case("altmin-tol-negative", lambda t: emt.altmin(_X(), _y(), 2, tol=-1.0), ValueError, "tol"),
        Case("altmin-B0-shape", lambda t: emt.altmin(_X(), _y(), 2, B0=np.ones((5, 2))), ValueError, "B0"),
        Case("fit_heads-B-shape", lambda t: emt.fit_heads(np.ones((5, 2)), _X(), _y()), ValueError, "B"),
        Case("population_optimum-k-zero", lambda t: emt.population_optimum(_heads() @ _B().T, 0), ValueError, "k"),
        Case("truncated_target-k-zero", lambda t: efl.truncated_target(Phi, 0), ValueError, "k"),
        Case("truncated_target-Phi-nan", lambda t: efl.truncated_target(_nan((6, 4)), 2), ValueError, "Phi"),
        Case("regularizer-gamma1-negative", lambda t: efl.regularizer(np.ones((6, 2)), np.ones((4, 2)), -1.0, 0.1), ValueError, "gamma1"),
        Case("divergence_boundary-gamma2-negative", lambda t: efl.divergence_boundary(-1.0), ValueError, "gamma2"),
        Case("divergence_boundary-statement-unknown", lambda t: efl.divergence_boundary(0.1, statement="bogus"), ValueError, "statement"),
        Case("data_weight-normalization-unknown", lambda t: efl.data_weight("bogus"), ValueError, "normalization"),
        Case("theta_step-step_size-nan", lambda t: efl.theta_step(np.ones((12, 2)), efl.lambda_tilde(Phi), float("nan")), ValueError, "step_size"),
        Case("altmin_erm-restarts-zero", lambda t: efl.altmin_erm(_X(), _y(), 2, restarts=0), ValueError, "restarts"),
        Case("nuclear_relaxation_estimate-mu-negative", lambda t: efl.nuclear_relaxation_estimate(_X(), _y(), 2, -1.0), ValueError, "mu"),
        Case("nuclear_relaxation_estimate-method-unknown", lambda t: efl.nuclear_relaxation_estimate(_X(), _y(), 2, 0.1, method="bogus"), ValueError, "method"),
        Case("exact.flute-region_quantities-k-zero", lambda t: efl.region_quantities(np.ones((6, 4)), 0), ValueError, "k"),
        Case("exact.rolora-angle_loss-delta-above-one", lambda t: ero.angle_loss(1.0, 1.0, 1.5), ValueError, "delta"),
        Case("exact.rolora-angle_loss-gamma-nan", lambda t: ero.angle_loss(float("nan"), 1.0, 0.5), ValueError, "gamma"),
        Case("exact.rolora-c_tilde-n_clients-zero", lambda t: ero.c_tilde(0, 10), ValueError, "n_clients"),
        Case("exact.rolora-recursion-rounds-negative", lambda t: ero.rolora_population_recursion(0.5, 1.0, 0.1, -1), ValueError, "rounds"),
        Case("exact.rolora-step_size_bound-L_max-negative", lambda t: ero.step_size_bound(-1.0), ValueError, "L_max"),
        Case("exact.rolora-step_size_bound-setting-unknown", lambda t: ero.step_size_bound(1.0, setting="bogus"), ValueError, "setting"),
        Case("exact.rolora-iterations_bound-eps-zero", lambda t: ero.iterations_bound(0.5, 0.5, 0.0), ValueError, "eps"),
        Case("exact.rolora-reduced_rank_regression-rank-zero", lambda t: ero.reduced_rank_regression(_rng().standard_normal((3, 8, 5)), np.ones((3, 8, 4)), 0), ValueError, "rank"),
        Case("exact.rolora-ffa_matrix_optimum-A-shape", lambda t: ero.ffa_matrix_optimum(np.ones((3, 4, 5)), np.ones((2, 6))), ValueError, "A"),
        Case("exact.rolora-local_b_solve-Y-mismatch", lambda t: ero.local_b_solve(np.ones((3, 8, 5)), np.ones((3, 7, 5)), np.ones(5)), ValueError, "Y"),
        Case("exact.fedavg_ft-head_statistics-heads-1d", lambda t: eft.head_statistics(np.ones(4)), ValueError, "heads"),
        Case("exact.fedavg_ft-theorem2-c3-negative", lambda t: eft.theorem2_constants(_heads(), 0.5, 2, c3=-1.0), ValueError, "c3"),
        Case("exact.fedavg_ft-theorem2-delta0-nan", lambda t: eft.theorem2_constants(_heads(), float("nan"), 2), ValueError, "delta0"),
        Case("exact.fedavg_ft-theorem2-local_steps-zero", lambda t: eft.theorem2_constants(_heads(), 0.5, 0), ValueError, "local_steps"),
        Case("exact.fedavg_ft-theorem2-epsilon-zero", lambda t: eft.theorem2_constants(_heads(), 0.5, 2, epsilon=0.0), ValueError, "epsilon"),
        Case("exact.fedavg_ft-proposition1_bounds-delta0-nan", lambda t: eft.proposition1_bounds(float("nan")), ValueError, "delta0"),
        Case("exact.fedavg_ft-one_round-step_size-negative", lambda t: eft.one_round_closed_form(np.ones((4, 2)), _heads(), -0.1), ValueError, "step_size"),
        Case("exact.fedavg_ft-head_only_expected_error-n-zero", lambda t: eft.head_only_expected_error(np.eye(3), np.ones(3), 0.1, 0), ValueError, "n"),
        Case("exact.fedavg_ft-dgd_lower_bound-rtol-negative", lambda t: eft.dgd_invariant_lower_bound(_B(), _B(), _heads(), rtol=-1.0), ValueError, "rtol"),
        Case("exact.fedavg_ft-global_objective-B-B_star-mismatch", lambda t: eft.global_objective(_B(), np.ones(2), np.ones((5, 2)), _heads()), ValueError, "B"),
    ]


def _linalg_compare():
    from lowrank_fl import compare, linalg
    return [
        Case("orth-1d", lambda t: linalg.orth(np.ones(3)), ValueError, "A"),
        Case("orth-nan", lambda t: linalg.orth(_nan((4, 2))), ValueError, "A"),
        Case("subspace_distance-shape-mismatch", lambda t: linalg.subspace_distance(np.eye(4)[:, :2], np.eye(5)[:, :2]), ValueError, "V"),
        Case("subspace_distance-rank_deficient-unknown", lambda t: linalg.subspace_distance(np.eye(4)[:, :2], np.eye(4)[:, :2], rank_deficient="bogus"), ValueError, "rank_deficient"),
        Case("truncated_svd-rank-zero", lambda t: linalg.truncated_svd(np.ones((4, 3)), 0), ValueError, "rank"),
        Case("svt-tau-negative", lambda t: linalg.svt(np.ones((4, 3)), -1.0), ValueError, "tau"),
        Case("block_soft_threshold-tau-negative", lambda t: linalg.block_soft_threshold(np.ones((2, 3, 3)), -1.0), ValueError, "tau"),
        Case("projector_distance-shape-mismatch", lambda t: linalg.projector_distance(np.eye(3), np.eye(4)), ValueError, "Q"),
        Case("spectral_norm-inf", lambda t: linalg.spectral_norm(np.full((2, 2), np.inf)), ValueError, "M"),
        Case("compare_clair-time_limit-negative", lambda t: compare.compare_clair(np.ones((4, 3, 3)), 0.1, 0.1, time_limit=-1.0), ValueError, "time_limit"),
        Case("compare_clair-methods-unknown", lambda t: compare.compare_clair(np.ones((4, 3, 3)), 0.1, 0.1, methods=["bogus"]), ValueError, "method"),
        Case("compare_clair-memory_measure-unknown", lambda t: compare.compare_clair(np.ones((4, 3, 3)), 0.1, 0.1, memory_measure="bogus"), ValueError, "memory_measure"),
        Case("compare_nuclear-mu-zero", lambda t: compare.compare_nuclear(_X(), _y(), 0.0), ValueError, "mu"),
        Case("compare_nuclear-y-mismatch", lambda t: compare.compare_nuclear(_X(), np.ones((4, 7)), 0.1), ValueError, "y"),
    ]


def _keyword_options():
    """Second sweep: keyword options, empty arrays, seeds, scalars of the closed forms."""
    from lowrank_fl import compare, linalg
    from lowrank_fl.algorithms import (dgd, fedavg, fedrep, fedsgd, ffa_lora, fine_tune, interference,
                                       rolora)
    from lowrank_fl.exact import fedavg_ft as eft
    from lowrank_fl.exact import flute as efl
    from lowrank_fl.exact import multitask as emt
    from lowrank_fl.exact import rolora as ero
    from lowrank_fl.problems import (haar_orthonormal, lora_matrix_problem, multitask_linear,
                                     new_client, paper_instance, proposition1_instance,
                                     rank_one_lora, underparameterized)
    client = lambda: new_client(mt(), samples_per_client=5, seed=0)  # noqa: E731
    return [
        Case("fedrep-head_step_size-negative", lambda t: fedrep(mt(), 2, 0.1, head_steps=2, head_step_size=-0.1), ValueError, "head_step_size"),
        Case("fedrep-init_samples-zero", lambda t: fedrep(mt_pop(), 2, 0.1, init_samples=0), ValueError, "init_samples"),
        Case("fedrep-orthonormalize-string", lambda t: fedrep(mt(), 2, 0.1, orthonormalize="no"), TypeError, "orthonormalize"),
        Case("fedrep-seed-bool", lambda t: fedrep(mt(), 2, 0.1, seed=True), TypeError, "seed"),
        Case("fedsgd-init-unknown", lambda t: fedsgd(mt(), 2, 0.1, init="bogus"), ValueError, "init"),
        Case("fedsgd-rounds-string", lambda t: fedsgd(mt(), "2", 0.1), TypeError, "rounds"),
        Case("dgd-batch_size-without-fresh", lambda t: dgd(mt_pop(), 2, 0.1, batch_size=4), ValueError, "batch_size"),
        Case("fedavg-seed-float", lambda t: fedavg(mt_pop(), 2, 0.1, seed=0.5), TypeError, "seed"),
        Case("fedavg-init-zero", lambda t: fedavg(mt_pop(), 2, 0.1, init=(np.zeros((6, 2)), np.zeros(2))), ValueError, "init"),
        Case("fine_tune-noise-negative", lambda t: fine_tune(client(), _B(), np.ones(2), noise=-1.0), ValueError, "noise"),
        Case("fine_tune-step_size-zero", lambda t: fine_tune(client(), _B(), np.ones(2), step_size=0.0), ValueError, "step_size"),
        Case("fine_tune-w-shape", lambda t: fine_tune(client(), _B(), np.ones(3)), ValueError, "w"),
        Case("rolora-normalize-string", lambda t: rolora(r1(), 2, 0.1, normalize="yes"), TypeError, "normalize"),
        Case("rolora-seed-list", lambda t: rolora(r1(), 2, 0.1, seed=[1, 2]), TypeError, "seed"),
        Case("rolora-data-fixed-without-dataset", lambda t: rolora(r1(), 2, 0.1, data="fixed"), ValueError, "data"),
        Case("ffa_lora-step_size-negative", lambda t: ffa_lora(r1(), 2, -0.1, local="gd"), ValueError, "step_size"),
        Case("interference-weights-length", lambda t: interference(np.ones((3, 2, 5)), np.ones((3, 5, 2)), weights=[1.0, 1.0]), ValueError, "weights"),
        Case("interference-no-clients", lambda t: interference(np.ones((0, 2, 5)), np.ones((0, 5, 2))), ValueError, "A"),
        Case("multitask_linear-heads-shape", lambda t: multitask_linear(d=6, rank=2, n_clients=4, heads=np.ones((4, 3))), ValueError, "heads"),
        Case("multitask_linear-B_star-not-orthonormal", lambda t: multitask_linear(d=6, rank=2, n_clients=4, B_star=np.ones((6, 2))), ValueError, "B_star"),
        Case("haar_orthonormal-d-zero", lambda t: haar_orthonormal(d=0, rank=1), ValueError, "d"),
        Case("underparameterized-seed-negative", lambda t: underparameterized(d=6, n_clients=4, rank=2, seed=-5), ValueError, "seed"),
        Case("underparameterized-samples-zero", lambda t: underparameterized(d=6, n_clients=4, rank=2, samples_per_client=0), ValueError, "samples_per_client"),
        Case("rank_one_lora-samples-zero", lambda t: rank_one_lora(d=5, n_clients=3, samples_per_client=0), ValueError, "samples_per_client"),
        Case("rank_one_lora-noise-negative", lambda t: rank_one_lora(d=5, n_clients=3, noise=-0.1), ValueError, "noise"),
        Case("lora_matrix_problem-d_out-zero", lambda t: lora_matrix_problem(d=5, n_clients=3, rank=2, d_out=0), ValueError, "d_out"),
        Case("paper_instance-heads-unknown", lambda t: paper_instance(d=10, rank=2, n_clients=4, heads="bogus"), ValueError, "heads"),
        Case("paper_instance-noise-nan", lambda t: paper_instance(d=10, rank=2, n_clients=4, noise=float("nan")), ValueError, "noise"),
        Case("proposition1_instance-B0-shape", lambda t: proposition1_instance(d=6, rank=2, n_clients=4, delta0=0.5, B0=np.ones((5, 2))), ValueError, "B0"),
        Case("new_client-noise-nan", lambda t: new_client(mt(), samples_per_client=5, noise=float("nan")), ValueError, "noise"),
        Case("projected_gd_init-step_size-negative", lambda t: emt.projected_gd_init(_X(), _y(), 2, step_size=-0.5), ValueError, "step_size"),
        Case("projected_gd_init-steps-negative", lambda t: emt.projected_gd_init(_X(), _y(), 2, steps=-1), ValueError, "steps"),
        Case("least_squares_heads-ridge-negative", lambda t: emt.least_squares_heads(np.ones((4, 8, 2)), _y(), ridge=-1.0), ValueError, "ridge"),
        Case("gram_heads-gram-shape", lambda t: emt.gram_heads(_B(), np.ones((4, 5, 5)), np.ones((4, 6))), ValueError, "gram"),
        Case("population_moment_matrix-noise-negative", lambda t: emt.population_moment_matrix(_heads() @ _B().T, noise=-1.0), ValueError, "noise"),
        Case("method_of_moments-no-samples", lambda t: emt.method_of_moments(np.ones((4, 0, 6)), np.ones((4, 0)), 2), ValueError, "X"),
        Case("local_least_squares-y-mismatch", lambda t: emt.local_least_squares(_X(), np.ones((3, 8))), ValueError, "y"),
        Case("balanced_factors-k-zero", lambda t: efl.balanced_factors(_rng().standard_normal((6, 4)), 0), ValueError, "k"),
        Case("flute_objective-aggregation-unknown", lambda t: efl.flute_objective(np.ones((6, 2)), np.ones((4, 2)), _X(), _y(), aggregation="bogus"), ValueError, "aggregation"),
        Case("is_unbounded-gamma1-nan", lambda t: efl.is_unbounded(float("nan"), 0.1), ValueError, "gamma1"),
        Case("entry_time_bound-step_size-negative", lambda t: efl.entry_time_bound(np.array([3.0, 2.0, 1.0]), 2, -0.1, 0.1), ValueError, "step_size"),
        Case("ols_truncated_svd-k-zero", lambda t: efl.ols_truncated_svd(_X(), _y(), 0), ValueError, "k"),
        Case("exact.rolora-zero_model_loss-gamma-negative", lambda t: ero.zero_model_loss(-1.0, 1.0), ValueError, "gamma"),
        Case("exact.rolora-ffa_population_loss-delta0-above-one", lambda t: ero.ffa_population_loss(1.0, 1.0, 1.5), ValueError, "delta0"),
        Case("exact.rolora-ffa_expected_loss-m-zero", lambda t: ero.ffa_expected_loss(0.5, 1.0, 3, 0), ValueError, "m"),
        Case("exact.rolora-rate_bound-step_size-negative", lambda t: ero.rate_bound_homogeneous(-0.1, 0.5, 1.0), ValueError, "step_size"),
        Case("exact.rolora-iterations_bound-setting-unknown", lambda t: ero.iterations_bound(0.5, 0.5, 0.1, setting="bogus"), ValueError, "setting"),
        Case("exact.rolora-population_b-a-shape", lambda t: ero.population_b(np.ones((3, 5)), np.ones(5) / np.sqrt(5), np.ones(4)), ValueError, "a"),
        Case("exact.rolora-expected_gradient_a-b_bar-shape", lambda t: ero.expected_gradient_a(np.ones(5), np.ones(4), np.ones(5), np.ones((3, 5))), ValueError, "b_bar"),
        Case("exact.fedavg_ft-complement-step_size-nan", lambda t: eft.complement_closed_form(_B(), _B(), np.ones((4, 2)), float("nan")), ValueError, "step_size"),
        Case("exact.fedavg_ft-oracle_representation-heads-shape", lambda t: eft.oracle_representation(_B(), np.ones((4, 3))), ValueError, "heads"),
        Case("exact.fedavg_ft-head_only_least_squares-B-shape", lambda t: eft.head_only_least_squares(_X()[0], _y()[0], np.ones((5, 2))), ValueError, "B"),
        Case("exact.fedavg_ft-head_statistics-no-clients", lambda t: eft.head_statistics(np.ones((0, 2))), ValueError, "heads"),
        Case("linalg-truncated_svd-rank-above-size", lambda t: linalg.truncated_svd(np.ones((4, 3)), 4), ValueError, "rank"),
        Case("linalg-nuclear_norm-1d", lambda t: linalg.nuclear_norm(np.ones(3)), ValueError, "M"),
        Case("linalg-block_norms-2d", lambda t: linalg.block_norms(np.ones((3, 3))), ValueError, "M"),
        Case("linalg-svt-tau-nan", lambda t: linalg.svt(np.ones((4, 3)), float("nan")), ValueError, "tau"),
        Case("linalg-orth-empty", lambda t: linalg.orth(np.ones((4, 0))), ValueError, "A"),
        Case("compare_clair-tol-negative", lambda t: compare.compare_clair(np.ones((4, 3, 3)), 0.1, 0.1, tol=-1.0), ValueError, "tol"),
        Case("compare_clair-max_iter-zero", lambda t: compare.compare_clair(np.ones((4, 3, 3)), 0.1, 0.1, max_iter=0), ValueError, "max_iter"),
        Case("compare_clair-memory_limit-negative", lambda t: compare.compare_clair(np.ones((4, 3, 3)), 0.1, 0.1, memory_limit=-1.0), ValueError, "memory_limit"),
        Case("compare_clair-alpha-above-one", lambda t: compare.compare_clair(np.ones((4, 3, 3)), 0.1, 0.1, alpha=2.0), ValueError, "alpha"),
        Case("compare_clair-one-client", lambda t: compare.compare_clair(np.ones((1, 3, 3)), 0.1, 0.1), ValueError, "W_hat"),
        Case("compare_noiseless-W-2d", lambda t: compare.compare_noiseless(np.ones((4, 3)), 0.1, 0.1), ValueError, "W"),
        Case("compare_nuclear-rank-zero", lambda t: compare.compare_nuclear(_X(), _y(), 0.1, rank=0), ValueError, "rank"),
    ]


def _ignored_options_and_starts():
    """Options that another option makes meaningless, degenerate starting points, more linalg."""
    from lowrank_fl import compare, linalg
    from lowrank_fl.algorithms import (fedavg_lora, fedrep, fedsgd, federated_lora_matrix, ffa_lora,
                                       flute, rolora)
    from lowrank_fl.exact import fedavg_ft as eft
    from lowrank_fl.exact import flute as efl
    from lowrank_fl.exact import multitask as emt
    from lowrank_fl.problems import paper_instance, underparameterized
    rank_one = np.outer(np.arange(1.0, 7.0), [1.0, 1.0])          # (6, 2), rank 1
    return [
        Case("fedrep-init-rank-deficient", lambda t: fedrep(mt(), 2, 0.1, init=rank_one), ValueError, "init"),
        Case("fedrep-head_step_size-without-head_steps", lambda t: fedrep(mt(), 2, 0.1, head_step_size=0.1), ValueError, "head_step_size"),
        Case("fedrep-init_samples-with-array-init", lambda t: fedrep(mt(), 2, 0.1, init=_B(), init_samples=4), ValueError, "init_samples"),
        Case("fedsgd-clients_per_round-zero", lambda t: fedsgd(mt(), 2, 0.1, clients_per_round=0), ValueError, "clients_per_round"),
        Case("flute-init-zero", lambda t: flute(up(), 2, 0.1, init=(np.zeros((6, 2)), np.zeros((4, 2)))), ValueError, "init"),
        Case("flute-init-shape", lambda t: flute(up(), 2, 0.1, init=(np.ones((5, 2)), np.ones((4, 2)))), ValueError, "init"),
        Case("flute-init_scale-with-array-init", lambda t: flute(up(), 2, 0.1, init=(_B(), np.ones((4, 2))), init_scale=0.5), ValueError, "init_scale"),
        Case("flute-record_theta-string", lambda t: flute(up(), 2, 0.1, record_theta="yes"), TypeError, "record_theta"),
        Case("rolora-L_max-with-numeric-step_size", lambda t: rolora(r1(), 2, 0.1, L_max=2.0), ValueError, "L_max"),
        Case("ffa_lora-step_size-with-argmin", lambda t: ffa_lora(r1(), 2, 0.1, local="argmin"), ValueError, "step_size"),
        Case("ffa_lora-init-zero", lambda t: ffa_lora(r1(), 2, init=np.zeros(5)), ValueError, "init"),
        Case("fedavg_lora-normalize-string", lambda t: fedavg_lora(r1(), 2, 0.1, normalize="no"), TypeError, "normalize"),
        Case("fedavg_lora-init-b0-shape", lambda t: fedavg_lora(r1(), 2, 0.1, init=(np.ones(5), np.ones(4))), ValueError, "b0"),
        Case("federated_lora_matrix-init-zero", lambda t: federated_lora_matrix(lm(), 2, 0.1, init=(np.zeros((2, 5)), np.zeros((5, 2)))), ValueError, "init"),
        Case("federated_lora_matrix-local_steps-zero", lambda t: federated_lora_matrix(lm(), 2, 0.1, local_steps=0), ValueError, "local_steps"),
        Case("underparameterized-noise-negative", lambda t: underparameterized(d=6, n_clients=4, rank=2, noise=-1.0), ValueError, "noise"),
        Case("paper_instance-rank-above-d", lambda t: paper_instance(d=4, rank=5, n_clients=4), ValueError, "rank"),
        Case("altmin-B0-rank-deficient", lambda t: emt.altmin(_X(), _y(), 2, B0=rank_one), ValueError, "B0"),
        Case("altmin_erm-max_iter-zero", lambda t: efl.altmin_erm(_X(), _y(), 2, max_iter=0), ValueError, "max_iter"),
        Case("altmin_erm-tol-negative", lambda t: efl.altmin_erm(_X(), _y(), 2, tol=-1.0), ValueError, "tol"),
        Case("embed_factors-U_s-shape", lambda t: efl.embed_factors(np.ones((6, 2)), np.ones((4, 2)), np.ones((5, 5)), np.ones((4, 4))), ValueError, "U_s"),
        Case("representation_step-xty-shape", lambda t: emt.representation_step(np.ones((4, 2)), np.ones((4, 5, 5)), np.ones((4, 6))), ValueError, "xty"),
        Case("exact.fedavg_ft-global_objective-closed_form-string", lambda t: eft.global_objective(_B(), np.ones(2), _B(), _heads(), closed_form="yes"), TypeError, "closed_form"),
        Case("projected_gd_init-seed-negative", lambda t: emt.projected_gd_init(_X(), _y(), 2, seed=-1), ValueError, "seed"),
        Case("linalg-subspace_distance-nan", lambda t: linalg.subspace_distance(_nan((4, 2)), np.eye(4)[:, :2]), ValueError, "U"),
        Case("linalg-block_soft_threshold-tau-nan", lambda t: linalg.block_soft_threshold(np.ones((2, 3, 3)), float("nan")), ValueError, "tau"),
        Case("linalg-block_soft_threshold-tau-shape", lambda t: linalg.block_soft_threshold(np.ones((2, 3, 3)), np.ones(3)), ValueError, "tau"),
        Case("linalg-row_projector-1d", lambda t: linalg.row_projector(np.ones(3)), ValueError, "A"),
        Case("linalg-projector-rank-deficient", lambda t: linalg.projector(rank_one), ValueError, "A"),
        Case("compare_clair-weights-shape", lambda t: compare.compare_clair(np.ones((4, 3, 3)), 0.1, 0.1, weights=np.ones(2)), ValueError, "weights"),
        Case("compare_clair-tau-unknown", lambda t: compare.compare_clair(np.ones((4, 3, 3)), 0.1, 0.1, tau="bogus"), ValueError, "tau"),
        Case("compare_nuclear-methods-wrong-problem", lambda t: compare.compare_nuclear(_X(), _y(), 0.1, methods=["fista"]), ValueError, "method"),
        Case("compare_noiseless-lam_S-negative", lambda t: compare.compare_noiseless(np.ones((4, 3, 3)), 0.1, -0.1), ValueError, "lam_S"),
    ]


def _objects():
    """Problem dataclasses built directly, the file helpers, and the verifier's Python API."""
    from lowrank_fl import files, outdir
    from lowrank_fl.problems import (LoRAMatrixProblem, MultitaskProblem, RankOneLoRAProblem,
                                     UnderparameterizedProblem)
    from verify.claim import Context
    from verify.sweep import Sweep
    u = np.ones(5) / np.sqrt(5)
    return [
        Case("MultitaskProblem-nothing", lambda t: MultitaskProblem(), ValueError, "B_star"),
        Case("MultitaskProblem-heads-without-B_star", lambda t: MultitaskProblem(heads=_heads()), ValueError, "heads"),
        Case("MultitaskProblem-rank-mismatch", lambda t: MultitaskProblem(B_star=_B(), heads=_heads(), rank=3), ValueError, "rank"),
        Case("MultitaskProblem-X-without-y", lambda t: MultitaskProblem(B_star=_B(), heads=_heads(), X=_X()), ValueError, "y"),
        Case("RankOneLoRAProblem-a_star-not-unit", lambda t: RankOneLoRAProblem(a_star=np.ones(5), b_star=np.ones((3, 5)), gamma=0.0), ValueError, "a_star"),
        Case("RankOneLoRAProblem-b_star-shape", lambda t: RankOneLoRAProblem(a_star=u, b_star=np.ones((3, 4)), gamma=0.0), ValueError, "b_star"),
        Case("LoRAMatrixProblem-B_star-shape", lambda t: LoRAMatrixProblem(A_star=np.eye(5)[:2], B_star=np.ones((3, 4, 3)), gamma=1.0), ValueError, "B_star"),
        Case("UnderparameterizedProblem-k-zero", lambda t: UnderparameterizedProblem(U=np.eye(6)[:, :3], spectrum=np.array([3.0, 2.0, 1.0]), V=np.eye(4)[:3], k=0), ValueError, "k"),
        Case("files-load_npz-empty-path", lambda t: files.load_npz("", option="W_hat"), ValueError, "W_hat"),
        Case("files-load_npy-npz-given", lambda t: files.load_npy(_xy(t), option="--weights"), ValueError, "--weights"),
        Case("outdir-check_output_dir-current-directory", lambda t: outdir.check_output_dir(".", option="--out"), ValueError, "--out"),
        Case("Sweep-backend-unknown", lambda t: Sweep(backend="bogus"), ValueError, "backend"),
        Case("Sweep-n_jobs-zero", lambda t: Sweep(n_jobs=0), ValueError, "n_jobs"),
        Case("Context-scale-unknown", lambda t: Context(scale="huge"), ValueError, "scale"),
        Case("Sweep-map-seeds-length", lambda t: Sweep().map(abs, [{}, {}], [[0]]), ValueError, "seeds"),
    ]


def _regimes():
    """The data regime and participation settings every federated method shares."""
    from lowrank_fl.algorithms import (dgd, fedavg, fedavg_lora, fedrep, fedsgd, federated_lora_matrix,
                                       ffa_lora, flute, rolora)
    from lowrank_fl.problems import MultitaskProblem, multitask_linear
    own = lambda: MultitaskProblem.from_data(_X(), _y(), rank=2)  # noqa: E731
    return [
        Case("fedrep-data-population-without-truth", lambda t: fedrep(own(), 2, 0.1, data="population"), ValueError, "data"),
        Case("fedrep-data-fresh-without-sampler", lambda t: fedrep(own(), 2, 0.1, data="fresh", batch_size=4), ValueError, "data"),
        Case("fedsgd-data-unknown", lambda t: fedsgd(mt(), 2, 0.1, data="online"), ValueError, "data"),
        Case("flute-data-fresh-batch_size-zero", lambda t: flute(up(), 2, 0.1, data="fresh", batch_size=0), ValueError, "batch_size"),
        Case("flute-data-unknown", lambda t: flute(up(), 2, 0.1, data="bogus"), ValueError, "data"),
        Case("fedavg-data-fixed-without-dataset", lambda t: fedavg(mt_pop(), 2, 0.1, data="fixed"), ValueError, "data"),
        Case("fedavg-clients_per_round-too-many", lambda t: fedavg(mt_pop(), 2, 0.1, clients_per_round=5), ValueError, "clients_per_round"),
        Case("dgd-data-unknown", lambda t: dgd(mt_pop(), 2, 0.1, data="bogus"), ValueError, "data"),
        Case("rolora-batch_size-without-fresh", lambda t: rolora(r1(), 2, 0.1, batch_size=3), ValueError, "batch_size"),
        Case("rolora-clients_per_round-zero", lambda t: rolora(r1(), 2, 0.1, clients_per_round=0), ValueError, "clients_per_round"),
        Case("ffa_lora-data-unknown", lambda t: ffa_lora(r1(), 2, data="bogus"), ValueError, "data"),
        Case("fedavg_lora-batch_size-zero", lambda t: fedavg_lora(r1(), 2, 0.1, data="fresh", batch_size=0), ValueError, "batch_size"),
        Case("federated_lora_matrix-data-fixed-without-dataset", lambda t: federated_lora_matrix(lm(), 2, 0.1, data="fixed"), ValueError, "data"),
        Case("fedsgd-init-zero", lambda t: fedsgd(mt(), 2, 0.1, init=np.zeros((6, 2))), ValueError, "init"),
        Case("fedrep-rounds-bool", lambda t: fedrep(mt(), True, 0.1), TypeError, "rounds"),
        Case("fedavg-step_size-array", lambda t: fedavg(mt_pop(), 2, np.array([0.1])), TypeError, "step_size"),
        Case("multitask_linear-n_clients-bool", lambda t: multitask_linear(d=6, rank=2, n_clients=True), TypeError, "n_clients"),
        Case("federated_lora_matrix-clients_per_round-too-many", lambda t: federated_lora_matrix(lm(), 2, 0.1, clients_per_round=4), ValueError, "clients_per_round"),
    ]


@functools.cache
def clair_instance():
    from lowrank_fl.clair import generate
    return generate(n_clients=5, rank=1, p=3, q=3, contaminated=1, noise=1e-3, seed=0)


def _D():
    from lowrank_fl.clair import contrasts
    return contrasts(clair_instance().W_hat)


def _clair():
    """CLAIR (lowrank_fl.clair) and the nuclear-norm references (lowrank_fl.exact.nuclear)."""
    from lowrank_fl.clair import (as_blocks, block_incoherence, build_certificate, collaborative_set,
                                  contrasts, detection_counts, fit, generate, lambda_path,
                                  largest_gap_threshold, oracle_fedavg, pairs, refine, rho_prime,
                                  simulate, solve_noiseless, solve_oracle_smooth, solve_penalized,
                                  theorem1_window)
    from lowrank_fl.exact import nuclear
    W = lambda: clair_instance().W_hat  # noqa: E731   (5, 3, 3)
    sim = functools.partial(simulate, p=3, q=3, n_clients=5, samples_per_client=20, rank=1)
    pen = lambda **kw: solve_penalized(_D(), 3, 0.1, 0.05, **kw)  # noqa: E731
    fit_ = lambda **kw: fit(W(), 0.1, 0.05, **{"rank": 1, **kw})  # noqa: E731
    P = np.eye(3)
    return [
        Case("clair.simulate-n_clients-one", lambda t: sim(n_clients=1), ValueError, "n_clients"),
        Case("clair.simulate-contaminated-fraction", lambda t: sim(contaminated=0.4), TypeError, "contaminated"),
        Case("clair.simulate-contaminated-above-n_clients", lambda t: sim(contaminated=9), ValueError, "contaminated"),
        Case("clair.simulate-variant-unknown", lambda t: sim(variant="bogus"), ValueError, "variant"),
        Case("clair.simulate-rank-above-size", lambda t: sim(rank=4), ValueError, "rank"),
        Case("clair.simulate-samples-zero", lambda t: sim(samples_per_client=0), ValueError, "samples_per_client"),
        Case("clair.simulate-seed-negative", lambda t: sim(seed=-1), ValueError, "seed"),
        Case("clair.simulate-retired-K", lambda t: simulate(p=3, q=3, K=5, samples_per_client=20, rank=1, seed=0), DeprecationWarning, "n_clients"),
        Case("clair.generate-noise-negative", lambda t: generate(n_clients=5, rank=1, p=3, q=3, noise=-1.0), ValueError, "noise"),
        Case("clair.generate-contamination_scale-zero", lambda t: generate(n_clients=5, rank=1, p=3, q=3, contamination_scale=0.0), ValueError, "contamination_scale"),
        Case("clair.generate-retired-r", lambda t: generate(n_clients=5, r=1, p=3, q=3, seed=0), DeprecationWarning, "rank"),
        Case("clair.pairs-K-one", lambda t: pairs(1), ValueError, "K"),
        Case("clair.contrasts-W_hat-2d", lambda t: contrasts(np.ones((4, 3))), ValueError, "W_hat"),
        Case("clair.contrasts-W_hat-nan", lambda t: contrasts(_nan((4, 3, 3))), ValueError, "W_hat"),
        Case("clair.contrasts-one-client", lambda t: contrasts(np.ones((1, 3, 3))), ValueError, "W_hat"),
        Case("clair.as_blocks-q-not-dividing", lambda t: as_blocks(np.ones((10, 3)), 3), ValueError, "q"),
        Case("clair.solve_penalized-lam_L-negative", lambda t: solve_penalized(_D(), 3, -0.1, 0.05), ValueError, "lam_L"),
        Case("clair.solve_penalized-lam_S-nan", lambda t: solve_penalized(_D(), 3, 0.1, float("nan")), ValueError, "lam_S"),
        Case("clair.solve_penalized-method-unknown", lambda t: pen(method="bogus"), ValueError, "method"),
        Case("clair.solve_penalized-tol-negative", lambda t: pen(tol=-1.0), ValueError, "tol"),
        Case("clair.solve_penalized-max_iter-zero", lambda t: pen(max_iter=0), ValueError, "max_iter"),
        Case("clair.solve_penalized-step_size-negative", lambda t: pen(step_size=-1.0), ValueError, "step_size"),
        Case("clair.solve_penalized-weights-shape", lambda t: pen(weights=np.ones(3)), ValueError, "weights"),
        Case("clair.solve_penalized-weights-negative", lambda t: pen(weights=-np.ones(10)), ValueError, "weights"),
        Case("clair.solve_penalized-solver-with-fista", lambda t: pen(solver="SCS"), ValueError, "solver"),
        Case("clair.solve_penalized-svd-unknown", lambda t: pen(svd="bogus"), ValueError, "svd"),
        Case("clair.solve_penalized-nuclear-unknown", lambda t: pen(method="cvxpy", nuclear="bogus"), ValueError, "nuclear"),
        Case("clair.solve_penalized-on_inaccurate-unknown", lambda t: pen(on_inaccurate="bogus"), ValueError, "on_inaccurate"),
        Case("clair.solve_penalized-init-shape", lambda t: pen(init=(np.ones((4, 3)), np.ones((4, 3)))), ValueError, "init"),
        Case("clair.solve_penalized-check_every-zero", lambda t: pen(check_every=0), ValueError, "check_every"),
        Case("clair.solve_penalized-D-rows-not-multiple-of-q", lambda t: solve_penalized(np.ones((10, 3)), 3, 0.1, 0.05), ValueError, "q"),
        Case("clair.solve_penalized-retired-step", lambda t: pen(step=0.5, max_iter=5), DeprecationWarning, "step_size"),
        Case("clair.fit-rank-zero", lambda t: fit_(rank=0), ValueError, "rank"),
        Case("clair.fit-rank-above-size", lambda t: fit_(rank=3), ValueError, "rank"),
        Case("clair.fit-alpha-below-half", lambda t: fit_(alpha=0.3), ValueError, "alpha"),
        Case("clair.fit-tau-negative", lambda t: fit_(tau=-1.0), ValueError, "tau"),
        Case("clair.fit-tau-unknown", lambda t: fit_(tau="bogus"), ValueError, "tau"),
        Case("clair.fit-rank_mode-unknown", lambda t: fit_(rank_mode="bogus"), ValueError, "rank_mode"),
        Case("clair.fit-rank_threshold-negative", lambda t: fit_(rank_threshold=-1.0), ValueError, "rank_threshold"),
        Case("clair.fit-refinement-unknown", lambda t: fit_(refinement="bogus"), ValueError, "refinement"),
        Case("clair.fit-one-client", lambda t: fit(np.ones((1, 3, 3)), 0.1, 0.05, rank=1), ValueError, "W_hat"),
        Case("clair.fit-rank-missing", lambda t: fit(W(), 0.1, 0.05), TypeError, "rank"),
        Case("clair.lambda_path-ratios-empty", lambda t: lambda_path(W(), 0.1, [], rank=1), ValueError, "ratios"),
        Case("clair.lambda_path-ratios-negative", lambda t: lambda_path(W(), 0.1, [-1.0], rank=1), ValueError, "ratios"),
        Case("clair.collaborative_set-K-mismatch", lambda t: collaborative_set(np.ones(10), 4, 0.5), ValueError, "block_norms"),
        Case("clair.collaborative_set-alpha-above-one", lambda t: collaborative_set(np.ones(10), 5, 0.5, alpha=1.5), ValueError, "alpha"),
        Case("clair.largest_gap_threshold-norms-empty", lambda t: largest_gap_threshold(np.ones(0)), ValueError, "norms"),
        Case("clair.largest_gap_threshold-norms-nan", lambda t: largest_gap_threshold(np.array([1.0, np.nan, 2.0])), ValueError, "norms"),
        Case("clair.refine-benign-shape", lambda t: refine(W(), P, np.ones(4, dtype=bool)), ValueError, "benign"),
        Case("clair.refine-projector-shape", lambda t: refine(W(), np.eye(4), np.ones(5, dtype=bool)), ValueError, "projector"),
        Case("clair.oracle_fedavg-benign-not-bool", lambda t: oracle_fedavg(W(), np.array([0, 1, 2, 1, 1])), TypeError, "benign"),
        Case("clair.detection_counts-length-mismatch", lambda t: detection_counts(np.ones(4, dtype=bool), np.ones(5, dtype=bool)), ValueError, "estimated"),
        Case("clair.solve_noiseless-solver-unknown", lambda t: solve_noiseless(_D(), 3, 0.1, 0.05, solver="BOGUS"), ValueError, "solver"),
        Case("clair.solve_noiseless-nuclear-unknown", lambda t: solve_noiseless(_D(), 3, 0.1, 0.05, nuclear="bogus"), ValueError, "nuclear"),
        Case("clair.solve_oracle_smooth-gtol-negative", lambda t: solve_oracle_smooth(_D(), 3, np.ones((1, 3)), np.ones(10, dtype=bool), 0.1, 0.05, gtol=-1.0), ValueError, "gtol"),
        Case("clair.build_certificate-r-zero", lambda t: build_certificate(np.ones((30, 3)), np.zeros((30, 3)), np.ones(10, dtype=bool), 3, 0, 0.1, 0.05), ValueError, "r"),
        Case("clair.rho_prime-I_mask-shape", lambda t: rho_prime(np.eye(3)[:, :1], np.ones(4, dtype=bool), 3), ValueError, "I_mask"),
        Case("clair.block_incoherence-r-zero", lambda t: block_incoherence(np.ones((30, 3)), 3, 0), ValueError, "r"),
        Case("clair.theorem1_window-a-above-one", lambda t: theorem1_window(1.0, 1, 1, 10, 1.5, 0.5), ValueError, "a"),
        Case("nuclear.solve_nuclear_prox-mu-zero", lambda t: nuclear.solve_nuclear_prox(_X(), _y(), 0.0), ValueError, "mu"),
        Case("nuclear.solve_nuclear_prox-tol-negative", lambda t: nuclear.solve_nuclear_prox(_X(), _y(), 0.1, tol=-1.0), ValueError, "tol"),
        Case("nuclear.solve_nuclear_prox-max_iter-zero", lambda t: nuclear.solve_nuclear_prox(_X(), _y(), 0.1, max_iter=0), ValueError, "max_iter"),
        Case("nuclear.solve_nuclear_prox-init-shape", lambda t: nuclear.solve_nuclear_prox(_X(), _y(), 0.1, init=np.ones((4, 5))), ValueError, "init"),
        Case("nuclear.solve_nuclear_prox-y-mismatch", lambda t: nuclear.solve_nuclear_prox(_X(), np.ones((4, 7)), 0.1), ValueError, "y"),
        Case("nuclear.solve_nuclear_cvxpy-solver-unknown", lambda t: nuclear.solve_nuclear_cvxpy(_X(), _y(), 0.1, solver="BOGUS"), ValueError, "solver"),
        Case("nuclear.solve_nuclear_cvxpy-on_inaccurate-unknown", lambda t: nuclear.solve_nuclear_cvxpy(_X(), _y(), 0.1, on_inaccurate="bogus"), ValueError, "on_inaccurate"),
        Case("nuclear.nuclear_objective-Theta-shape", lambda t: nuclear.nuclear_objective(np.ones((4, 5)), _X(), _y(), 0.1), ValueError, "Theta"),
        Case("nuclear.nuclear_duality_gap-mu-nan", lambda t: nuclear.nuclear_duality_gap(np.ones((4, 6)), _X(), _y(), float("nan")), ValueError, "mu"),
    ]


def _adapter_dirs(tmp, *, n_clients=3, **kw):
    """Synthetic PEFT LoRA adapters ``tmp/in/client_00`` ... (one small module each)."""
    from lowrank_fl.adapters.synthetic import write_synthetic_adapters
    opts = dict(n_layers=1, modules=("q_proj",), shape=(6, 5), rank=2, contaminated=0,
                dtype="float32", seed=0)
    return write_synthetic_adapters(tmp / "in", n_clients=n_clients, **{**opts, **kw})


def _damaged(tmp, what):
    dirs = _adapter_dirs(tmp)
    target = dirs[1] / "adapter_model.safetensors"
    if what == "truncated":
        target.write_bytes(target.read_bytes()[:40])
    elif what == "config":
        (dirs[1] / "adapter_config.json").unlink()
    elif what == "shape":          # a fourth client whose module is 7 x 5 instead of 6 x 5
        other = _adapter_dirs(tmp / "other", n_clients=1, shape=(7, 5))[0]
        dirs.append(other.rename(tmp / "in" / "client_99"))
    return dirs


def _reconfigured(tmp, **changes):
    """Three adapters, the second with ``changes`` in its adapter_config.json."""
    import json
    dirs = _adapter_dirs(tmp)
    f = dirs[1] / "adapter_config.json"
    f.write_text(json.dumps({**json.loads(f.read_text()), **changes}))
    return dirs


def _adapters():
    """PEFT LoRA adapters (lowrank_fl.adapters): the Python API and ``lowrank-fl adapters``."""
    from lowrank_fl.adapters import ModuleOptions, aggregate_adapters, load_adapters, reduce_module

    def agg(t, *extra, dirs=None):
        dirs = _adapter_dirs(t) if dirs is None else dirs
        return ["adapters", "aggregate", *dirs, "--out", t / "out", "--quiet", *extra]

    def c(id_, argv, name):
        return Case(id_, lambda t: run_cli(argv(t)), CLI, name)
    return [
        Case("adapters.load_adapters-one-client", lambda t: load_adapters(_adapter_dirs(t, n_clients=1)), ValueError, "2"),
        Case("adapters.load_adapters-missing-dir", lambda t: load_adapters([t / "nope", t / "nope2"]), ValueError, "nope"),
        Case("adapters.ModuleOptions-method-unknown", lambda t: ModuleOptions(method="bogus"), ValueError, "method"),
        Case("adapters.ModuleOptions-lam_L-without-lam_S", lambda t: ModuleOptions(lam_L=0.1), ValueError, "lam_S"),
        Case("adapters.ModuleOptions-alpha-above-one", lambda t: ModuleOptions(alpha=2.0), ValueError, "alpha"),
        Case("adapters.ModuleOptions-tol-negative", lambda t: ModuleOptions(tol=-1.0), ValueError, "tol"),
        Case("adapters.aggregate_adapters-jobs-zero", lambda t: aggregate_adapters(load_adapters(_adapter_dirs(t)), ModuleOptions(), jobs=0), ValueError, "jobs"),
        Case("adapters.ModuleOptions-rank_out-zero", lambda t: ModuleOptions(rank_out=0), ValueError, "rank_out"),
        Case("adapters.reduce_module-energy-above-one",
             lambda t: (lambda a: reduce_module(a.factors(a.modules[0]), energy=1.5))(load_adapters(_adapter_dirs(t))),
             ValueError, "energy"),
        c("cli-adapters-aggregate-one-client", lambda t: agg(t, dirs=_adapter_dirs(t, n_clients=1)), "2"),
        c("cli-adapters-aggregate-missing-dir", lambda t: agg(t, dirs=[t / "nope", t / "nope2"]), "nope"),
        c("cli-adapters-aggregate-no-config", lambda t: agg(t, dirs=_damaged(t, "config")), "adapter_config.json"),
        c("cli-adapters-aggregate-truncated-weights", lambda t: agg(t, dirs=_damaged(t, "truncated")), "adapter_model.safetensors"),
        c("cli-adapters-aggregate-shape-mismatch", lambda t: agg(t, dirs=_damaged(t, "shape")), "q_proj"),
        c("cli-adapters-aggregate-method-unknown", lambda t: agg(t, "--method", "bogus"), "--method"),
        c("cli-adapters-aggregate-out-nonempty", lambda t: agg(t, "--out", _nonempty(t)), "out"),
        c("cli-adapters-aggregate-lam-L-without-lam-S", lambda t: agg(t, "--lam-L", "0.1"), "--lam-S"),
        c("cli-adapters-aggregate-rank-out-zero", lambda t: agg(t, "--rank-out", "0"), "--rank-out"),
        c("cli-adapters-aggregate-energy-above-one", lambda t: agg(t, "--energy", "1.5"), "--energy"),
        c("cli-adapters-aggregate-alpha-nan", lambda t: agg(t, "--alpha", "nan"), "--alpha"),
        c("cli-adapters-aggregate-jobs-zero", lambda t: agg(t, "--jobs", "0"), "--jobs"),
        c("cli-adapters-aggregate-dtype-unknown", lambda t: agg(t, "--dtype", "int8"), "--dtype"),
        c("cli-adapters-aggregate-rank-above-dims", lambda t: agg(t, "--rank", "6"), "min(out, in) = 5"),
        c("cli-adapters-aggregate-names-count", lambda t: agg(t, "--names", "a,b"), "--names"),
        c("cli-adapters-aggregate-init-pissa", lambda t: agg(t, dirs=_reconfigured(t, init_lora_weights="pissa")), "init_lora_weights"),
        c("cli-adapters-aggregate-r-not-int", lambda t: agg(t, dirs=_reconfigured(t, r="four")), "'r'"),
        Case("adapters.load_adapters-names-duplicate", lambda t: load_adapters(_adapter_dirs(t), names=["a", "a", "b"]), ValueError, "names"),
        c("cli-adapters-inspect-figure-without-summary", lambda t: ["adapters", "inspect", *_adapter_dirs(t), "--figure", t / "f.png"], "--summary"),
        c("cli-adapters-inspect-summary-missing", lambda t: ["adapters", "inspect", *_adapter_dirs(t), "--summary", t / "s.json", "--figure", t / "f.png"], "s.json"),
    ]


# ----------------------------------------------------------------------------- the command line
def run_cli(argv) -> tuple[int, str]:
    """``lowrank-fl ARGV`` in this process: (exit status, stderr)."""
    from verify.cli import lowrank_fl_main
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            code = lowrank_fl_main([str(a) for a in argv])
        except SystemExit as exc:  # argparse's own usage errors
            code = exc.code
    return code, err.getvalue()


def _w_hat(tmp, **arrays):
    path = tmp / "W_hat.npz"
    np.savez(path, **(arrays or {"W_hat": _rng().standard_normal((4, 3, 3))}))
    return path


def _write(tmp, name, data: bytes):
    path = tmp / name
    path.write_bytes(data)
    return path


def _truncated(tmp):
    good = _w_hat(tmp)
    return _write(tmp, "cut.npz", good.read_bytes()[:200])


def _nonempty(tmp):
    out = tmp / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    return out


def _fit(tmp, path, *extra, out=None):
    return ["clair", "fit", path, "--rank", "1", "--lam-L", "0.1", "--lam-S", "0.1",
            "--out", tmp / "out" if out is None else out, *extra]


def _xy(tmp, **arrays):
    path = tmp / "Xy.npz"
    np.savez(path, **(arrays or {"X": _X(), "y": _y()}))
    return path


def _cli():
    def c(id_, argv, name):
        return Case(id_, lambda t: run_cli(argv(t)), CLI, name)
    return [
        c("cli-clair-fit-missing-file", lambda t: _fit(t, t / "nope.npz"), "nope.npz"),
        c("cli-clair-fit-empty-file", lambda t: _fit(t, _write(t, "empty.npz", b"")), "W_hat"),
        c("cli-clair-fit-truncated-npz", lambda t: _fit(t, _truncated(t)), "W_hat"),
        c("cli-clair-fit-not-zip", lambda t: _fit(t, _write(t, "text.npz", b"hello world\n" * 10)), "W_hat"),
        c("cli-clair-fit-npy-not-npz", lambda t: _fit(t, (np.save(t / "a.npy", np.ones((4, 3, 3))), t / "a.npy")[1]), "W_hat"),
        c("cli-clair-fit-missing-key", lambda t: _fit(t, _w_hat(t, other=np.ones(3))), "W_hat"),
        c("cli-clair-fit-directory", lambda t: _fit(t, t), "W_hat"),
        c("cli-clair-fit-W_hat-2d", lambda t: _fit(t, _w_hat(t, W_hat=np.ones((4, 3)))), "W_hat"),
        c("cli-clair-fit-W_hat-nan", lambda t: _fit(t, _w_hat(t, W_hat=_nan((4, 3, 3)))), "W_hat"),
        c("cli-clair-fit-out-nonempty", lambda t: _fit(t, _w_hat(t), out=_nonempty(t)), "--out"),
        c("cli-clair-fit-out-empty-string", lambda t: _fit(t, _w_hat(t), out=""), "--out"),
        c("cli-clair-fit-out-is-file", lambda t: _fit(t, _w_hat(t), out=_write(t, "f.txt", b"x")), "--out"),
        c("cli-clair-fit-weights-missing", lambda t: _fit(t, _w_hat(t), "--weights", t / "w.npy"), "--weights"),
        c("cli-clair-fit-method-unknown", lambda t: _fit(t, _w_hat(t), "--method", "bogus"), "method"),
        c("cli-clair-fit-rank-zero", lambda t: _fit(t, _w_hat(t))[:3] + ["--rank", "0", "--lam-L", "0.1", "--lam-S", "0.1", "--out", t / "o"], "rank"),
        c("cli-clair-fit-lam-L-negative", lambda t: ["clair", "fit", _w_hat(t), "--rank", "1", "--lam-L", "-1", "--lam-S", "0.1", "--out", t / "o"], "lam_L"),
        c("cli-clair-fit-tau-unknown", lambda t: _fit(t, _w_hat(t), "--tau", "bogus"), "--tau"),
        c("cli-clair-fit-alpha-out-of-range", lambda t: _fit(t, _w_hat(t), "--alpha", "1.5"), "alpha"),
        c("cli-compare-clair-methods-unknown", lambda t: ["compare", "clair", _w_hat(t), "--lam-L", "0.1", "--lam-S", "0.1", "--methods", "bogus", "--out", t / "o"], "method"),
        c("cli-compare-nuclear-missing-key", lambda t: ["compare", "nuclear", _xy(t, X=_X()), "--mu", "0.1", "--out", t / "o"], "y"),
        c("cli-compare-nuclear-out-nonempty", lambda t: ["compare", "nuclear", _xy(t), "--mu", "0.1", "--out", _nonempty(t)], "--out"),
        c("cli-compare-noiseless-missing-file", lambda t: ["compare", "noiseless", t / "none.npz", "--lam-L", "1", "--lam-S", "0.5", "--out", t / "o"], "none.npz"),
        c("cli-verify-seed-negative", lambda t: ["verify", "--seed", "-1", "--no-cache", "--out", t / "r"], "--seed"),
        c("cli-verify-seed-text", lambda t: ["verify", "--seed", "abc", "--no-cache", "--out", t / "r"], "--seed"),
        c("cli-verify-claim-unknown", lambda t: ["verify", "--claim", "no.such.claim", "--no-cache", "--out", t / "r"], "no.such.claim"),
        c("cli-verify-paper-unknown", lambda t: ["verify", "--paper", "bogus", "--no-cache", "--out", t / "r"], "--paper"),
        c("cli-verify-scale-unknown", lambda t: ["verify", "--scale", "huge", "--no-cache", "--out", t / "r"], "--scale"),
        c("cli-verify-out-nonempty", lambda t: ["verify", "--claim", "clair.lemma1.rho_vacuous", "--scale", "smoke", "--no-cache", "--out", _nonempty(t)], "--out"),
        c("cli-verify-cache-is-file", lambda t: ["verify", "--claim", "clair.lemma1.rho_vacuous", "--scale", "smoke", "--cache", _write(t, "c", b"x"), "--out", t / "r"], "--cache"),
        c("cli-verify-jobs-zero", lambda t: ["verify", "--claim", "clair.lemma1.rho_vacuous", "--scale", "smoke", "--jobs", "0", "--no-cache", "--out", t / "r"], "--jobs"),
        c("cli-conditions-paper-unknown", lambda t: ["conditions", "bogus"], "bogus"),
        c("cli-conditions-param-no-equals", lambda t: ["conditions", "fedrep", "--param", "d"], "--param"),
        c("cli-conditions-param-unknown", lambda t: ["conditions", "fedrep", "--param", "bogus=3"], "bogus"),
        c("cli-conditions-instance-missing", lambda t: ["conditions", "fedrep", "--instance", t / "inst.npz"], "inst.npz"),
        c("cli-report-diff-missing-file", lambda t: ["report", "diff", t / "a.json", t / "b.json"], "a.json"),
        c("cli-report-diff-not-json", lambda t: ["report", "diff", _write(t, "a.json", b"{not json"), _write(t, "b.json", b"{}")], "a.json"),
        c("cli-cache-clear-cache-is-file", lambda t: ["cache", "clear", "--cache", _write(t, "c", b"x")], "--cache"),
        c("cli-clair-fit-max-iter-zero", lambda t: _fit(t, _w_hat(t), "--max-iter", "0"), "max_iter"),
        c("cli-clair-fit-tol-negative", lambda t: _fit(t, _w_hat(t), "--tol", "-1"), "tol"),
        c("cli-clair-fit-weights-shape", lambda t: _fit(t, _w_hat(t), "--weights", (np.save(t / "w.npy", np.ones(2)), t / "w.npy")[1]), "weights"),
        c("cli-clair-fit-weights-npz", lambda t: _fit(t, _w_hat(t), "--weights", _xy(t)), "--weights"),
        c("cli-clair-fit-one-client", lambda t: _fit(t, _w_hat(t, W_hat=np.ones((1, 3, 3)))), "W_hat"),
        c("cli-compare-clair-time-limit-negative", lambda t: ["compare", "clair", _w_hat(t), "--lam-L", "0.1", "--lam-S", "0.1", "--time-limit", "-1", "--out", t / "o"], "time_limit"),
        c("cli-compare-clair-out-empty-string", lambda t: ["compare", "clair", _w_hat(t), "--lam-L", "0.1", "--lam-S", "0.1", "--out", ""], "--out"),
        c("cli-compare-noiseless-missing-key", lambda t: ["compare", "noiseless", _xy(t), "--lam-L", "1", "--lam-S", "0.5", "--out", t / "o"], "W"),
        c("cli-compare-nuclear-y-mismatch", lambda t: ["compare", "nuclear", _xy(t, X=_X(), y=np.ones((4, 7))), "--mu", "0.1", "--out", t / "o"], "y"),
        c("cli-verify-out-empty-string", lambda t: ["verify", "--claim", "clair.lemma1.rho_vacuous", "--scale", "smoke", "--no-cache", "--out", ""], "--out"),
        c("cli-verify-backend-unknown", lambda t: ["verify", "--backend", "bogus", "--no-cache", "--out", t / "r"], "--backend"),
        c("cli-claims-paper-unknown", lambda t: ["claims", "--paper", "bogus"], "--paper"),
        c("cli-conditions-seed-negative", lambda t: ["conditions", "fedrep", "--seed", "-1"], "--seed"),
        c("cli-conditions-param-not-a-number", lambda t: ["conditions", "fedrep", "--param", "d=abc"], "d"),
        c("cli-unknown-command", lambda t: ["bogus"], "bogus"),
        c("cli-clair-fit-rank-not-int", lambda t: ["clair", "fit", _w_hat(t), "--rank", "2.5", "--lam-L", "0.1", "--lam-S", "0.1", "--out", t / "o"], "--rank"),
        c("cli-clair-fit-weights-directory", lambda t: _fit(t, _w_hat(t), "--weights", t), "--weights"),
        c("cli-clair-fit-lam-S-nan", lambda t: ["clair", "fit", _w_hat(t), "--rank", "1", "--lam-L", "0.1", "--lam-S", "nan", "--out", t / "o"], "lam_S"),
        c("cli-compare-clair-memory-limit-zero", lambda t: ["compare", "clair", _w_hat(t), "--lam-L", "0.1", "--lam-S", "0.1", "--memory-limit", "0", "--out", t / "o"], "--memory-limit"),
        c("cli-compare-clair-tau-unknown", lambda t: ["compare", "clair", _w_hat(t), "--lam-L", "0.1", "--lam-S", "0.1", "--tau", "bogus", "--out", t / "o"], "--tau"),
        c("cli-compare-nuclear-mu-zero", lambda t: ["compare", "nuclear", _xy(t), "--mu", "0", "--out", t / "o"], "mu"),
        c("cli-compare-noiseless-rank-zero", lambda t: ["compare", "noiseless", _w_hat(t), "--lam-L", "1", "--lam-S", "0.5", "--rank", "0", "--out", t / "o"], "rank"),
        c("cli-compare-clair-truncated-npz", lambda t: ["compare", "clair", _truncated(t), "--lam-L", "0.1", "--lam-S", "0.1", "--out", t / "o"], "W_hat"),
        c("cli-verify-refresh-without-cache", lambda t: ["verify", "--no-cache", "--refresh", "--out", t / "r"], "--refresh"),
        c("cli-verify-scheduler-without-dask", lambda t: ["verify", "--backend", "sequential", "--scheduler", "tcp://h:1", "--no-cache", "--out", t / "r"], "--scheduler"),
        c("cli-conditions-instance-directory", lambda t: ["conditions", "fedrep", "--instance", t], "--instance"),
        c("cli-conditions-instance-empty", lambda t: ["conditions", "fedrep", "--instance", _write(t, "i.npz", b"")], "--instance"),
        c("cli-conditions-instance-truncated", lambda t: ["conditions", "fedrep", "--instance", _truncated(t)], "--instance"),
        c("cli-conditions-param-float-for-int", lambda t: ["conditions", "fedrep", "--param", "k=1.5"], "k"),
        c("cli-report-diff-directory-without-results", lambda t: ["report", "diff", t, _write(t, "b.json", b"{}")], "results.json"),
        c("cli-report-diff-not-results", lambda t: ["report", "diff", _write(t, "a.json", b"{}"), _write(t, "b.json", b"{}")], "a.json"),
        c("cli-clair-fit-weights-negative", lambda t: _fit(t, _w_hat(t), "--weights", (np.save(t / "w.npy", -np.ones(6)), t / "w.npy")[1]), "weights"),
        c("cli-clair-fit-alpha-nan", lambda t: _fit(t, _w_hat(t), "--alpha", "nan"), "alpha"),
        c("cli-clair-fit-out-under-a-file", lambda t: _fit(t, _w_hat(t), out=_write(t, "f", b"x") / "sub"), "--out"),
        c("cli-compare-clair-methods-bad-solver", lambda t: ["compare", "clair", _w_hat(t), "--lam-L", "0.1", "--lam-S", "0.1", "--methods", "cvxpy:BOGUS", "--out", t / "o"], "cvxpy:BOGUS"),
        c("cli-compare-nuclear-tol-zero", lambda t: ["compare", "nuclear", _xy(t), "--mu", "0.1", "--tol", "0", "--out", t / "o"], "tol"),
        c("cli-verify-out-is-file", lambda t: ["verify", "--claim", "clair.lemma1.rho_vacuous", "--scale", "smoke", "--no-cache", "--out", _write(t, "r", b"x")], "--out"),
        c("cli-conditions-param-K-one", lambda t: ["conditions", "clair", "--param", "n_clients=1"], "n_clients"),
        c("cli-conditions-instance-missing-key", lambda t: ["conditions", "fedrep", "--instance", _xy(t, other=np.ones(3))], "--instance"),
    ]


CASES = (_problems() + _algorithms() + _exact() + _linalg_compare() + _keyword_options()
         + _ignored_options_and_starts() + _objects() + _regimes() + _clair() + _adapters() + _cli())


# ----------------------------------------------------------------------------- the checks
def names(name: str, message: str) -> bool:
    """``name`` occurs in ``message`` as a whole word (``d`` in "d must be", not in "data")."""
    return re.search(rf"(?<![\w-]){re.escape(name)}(?!\w)", message) is not None


def check_case(case: Case, tmp) -> None:
    """Perform ``case`` and assert its outcome (used by the test and by the census)."""
    if case.expect is CLI:
        code, err = case.call(tmp)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert code == 2, f"exit status {code}, stderr: {err!r}"
        assert "Traceback" not in err, err
        errors = [ln for ln in lines if "error:" in ln]
        assert len(errors) == 1, f"expected one error line, got {lines}"
        # argparse prints its usage before its own error line; the library's errors are one line
        assert len(lines) == 1 or lines[0].startswith("usage:"), lines
        assert names(case.name, errors[0]), f"{case.name!r} not in {errors[0]!r}"
    elif case.expect is DeprecationWarning:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            case.call(tmp)
        messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
        assert messages, f"no DeprecationWarning; warnings: {[str(w.message) for w in caught]}"
        assert any(names(case.name, m) for m in messages), messages
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(case.expect) as info:
                case.call(tmp)
        assert names(case.name, str(info.value)), f"{case.name!r} not in {str(info.value)!r}"


def test_at_least_100_distinct_cases():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))
    assert len(ids) >= 100


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_names_the_argument(case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LOWRANK_FL_CACHE", str(tmp_path / "cache"))
    check_case(case, tmp_path)
