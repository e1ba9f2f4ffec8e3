"""One replicate of CLAIR's §8 experiment, end to end (Table 3, Figures 2-3).

``K = n_clients`` clients (§8.2: 9 benign, 1 contaminated, the contaminated one last) fine-tune
the frozen backbone with LoRA (:func:`lowrank_fl.nn.clients.train_client`), each adapter is
written with PEFT's ``save_pretrained`` and read back (:mod:`lowrank_fl.nn.aggregate`), the eight
attention matrices are aggregated per matrix (local, FedAvg, oracle FedAvg, CLAIR; the output
layer stays local, S5) and every benign client's merged model is scored by the masked next-token
accuracy (§8.2).

Regimes (§8.2, S5): ``"homogeneous"`` — every client has ``t = 1.1``, ``L = 16``, evaluation on
that common task; ``"heterogeneous"`` — each client draws ``t ~ U[0.95, 1.6]`` and
``L ~ U{10..26}``, evaluation on its own task. The contaminated client draws its ``(t, L)`` the
same way but learns a mismatched copying rule, ``contamination`` (the paper leaves it unspecified;
default ``"reverse"``, see :data:`lowrank_fl.nn.copying.CONTAMINATIONS`).

CLAIR's tuning (§8.2): ``(λ_L, λ_S) = (0.5, 0.4)``, ``τ = 0.5`` homogeneous; ``(0.5, 0.2)``,
``τ = 0.01`` heterogeneous; ``α = 0.5``; ``rank = 3`` (the LoRA rank). CLAIR uses the
layer's own estimated set ``Ĉ`` on each matrix (how the paper combines layers into client-level
sets is unstated).
"""
from __future__ import annotations

import copy
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from ..validation import as_generator, check_choice, check_int
from . import copying
from .aggregate import METHODS, aggregate, load_factors, stack_deltas
from .clients import LoraSettings, TaskSpec, accuracy, train_client
from .transformer import ATTENTION_MODULES, OUTPUT_MODULE

__all__ = ["REGIMES", "PAPER_TUNING", "Sec8Replicate", "client_tasks", "merged_model", "run_replicate"]

REGIMES = ("homogeneous", "heterogeneous")
#: (lam_L, lam_S, tau) of §8.2 per regime
PAPER_TUNING = {"homogeneous": (0.5, 0.4, 0.5), "heterogeneous": (0.5, 0.2, 0.01)}


@dataclass(frozen=True)
class Sec8Replicate:
    """Result of :func:`run_replicate`.

    accuracy : dict method → ndarray (K,)
        Masked next-token accuracy of each client's merged model (NaN for contaminated clients).
    benign : ndarray of bool, shape (8, K)
        CLAIR's estimated set ``Ĉ`` per attention matrix (rows in :data:`ATTENTION_MODULES` order).
    truth : ndarray of bool, shape (K,)
    tasks : list of TaskSpec
    clair_status : list of str, one per attention matrix
    block_norms : ndarray, shape (8, G)
        CLAIR's pair norms compared with ``τ`` in (8), pairs in eq. (6) order.
    benign_auto : ndarray of bool, shape (8, K), or None
        The estimated sets of ``"clair-auto"`` (automatic λ, largest-gap ``τ``).
    """

    accuracy: dict
    benign: np.ndarray
    truth: np.ndarray
    tasks: list
    clair_status: list = field(default_factory=list)
    block_norms: np.ndarray | None = None
    benign_auto: np.ndarray | None = None


def client_tasks(regime: str, *, n_clients: int = 10, contaminated: int = 1,
                 contamination: str = "reverse", background: str = "power-law", seed) -> list[TaskSpec]:
    """The clients' tasks; the last ``contaminated`` clients get the mismatched rule.
    ``background``: the background tokens of fuzzy copying (:func:`lowrank_fl.nn.copying.sample`)."""
    check_choice(regime, "regime", REGIMES)
    check_choice(contamination, "contamination", copying.CONTAMINATIONS)
    check_choice(background, "background", copying.BACKGROUNDS)
    K = check_int(n_clients, "n_clients", minimum=2)
    c = check_int(contaminated, "contaminated", minimum=0, maximum=K - 1)
    rng = as_generator(seed, "sec8-tasks")
    tasks = []
    for k in range(K):
        kind = contamination if k >= K - c else "fuzzy"
        if regime == "homogeneous":
            tasks.append(TaskSpec(16, 1.1, kind, background))
        else:
            tasks.append(TaskSpec(int(rng.integers(10, 27)), float(rng.uniform(0.95, 1.6)), kind, background))
    return tasks


def merged_model(backbone, deltas: dict):
    """A copy of ``backbone`` with ``W <- W + ΔW`` for each ``{module: ΔW (q, p)}``."""
    model = copy.deepcopy(backbone)
    modules = dict(model.named_modules())
    with torch.no_grad():
        for name, dW in deltas.items():
            w = modules[name].weight
            w += torch.as_tensor(dW, dtype=w.dtype)
    return model.eval()


def run_replicate(backbone, regime: str, *, n_clients: int = 10, contaminated: int = 1,
                  contamination: str = "reverse", background: str = "power-law",
                  lora: LoraSettings = LoraSettings(),
                  n_test: int = 500, lam_L: float | None = None, lam_S: float | None = None,
                  tau=None, alpha: float = 0.5, methods=METHODS, adapter_dir=None,
                  solver_options=None, metric: str = "paper", seed) -> Sec8Replicate:
    """Train, aggregate and evaluate one replicate (see the module docstring).

    ``metric``: the masked accuracy's convention (:data:`lowrank_fl.nn.copying.METRICS`: §8.2's
    ``M_i``, default, or Song et al.'s). ``lora.alpha_reading`` picks the reading of S5's
    "LoRA scale 16" (:data:`lowrank_fl.nn.clients.ALPHA_READINGS`).

    ``lam_L``, ``lam_S``, ``tau`` default to :data:`PAPER_TUNING` of ``regime``. ``background``:
    the background tokens of every task, the evaluation task included. ``adapter_dir``:
    where the clients' PEFT adapter directories are written (default: a temporary directory).
    """
    with threadpool_limits(limits=1):      # one BLAS thread: the SVDs of (7) are 20-50x slower shared
        return _run_replicate(backbone, regime, n_clients=n_clients, contaminated=contaminated,
                              contamination=contamination, background=background, lora=lora,
                              n_test=n_test, lam_L=lam_L,
                              lam_S=lam_S, tau=tau, alpha=alpha, methods=methods, adapter_dir=adapter_dir,
                              solver_options=solver_options, metric=metric, seed=seed)


def _run_replicate(backbone, regime, *, n_clients, contaminated, contamination, background, lora,
                   n_test, lam_L, lam_S, tau, alpha, methods, adapter_dir, solver_options,
                   metric, seed) -> Sec8Replicate:
    torch.set_num_threads(1)
    check_choice(metric, "metric", copying.METRICS)
    tasks = client_tasks(regime, n_clients=n_clients, contaminated=contaminated,
                         contamination=contamination, background=background, seed=seed)
    K = len(tasks)
    truth = np.array([t.kind == "fuzzy" for t in tasks])
    pl, ps, pt = PAPER_TUNING[regime]
    lam_L, lam_S, tau = (pl if lam_L is None else lam_L, ps if lam_S is None else lam_S,
                         pt if tau is None else tau)
    n_test = check_int(n_test, "n_test", minimum=1)
    ss = np.random.SeedSequence(int(as_generator(seed, "sec8").integers(2**63)))
    init_seed, *client_ss = ss.spawn(K + 1)
    init_seed = int(init_seed.generate_state(1)[0])
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(adapter_dir) if adapter_dir is not None else Path(tmp)
        dirs = [train_client(backbone, task, root / f"client{k}", settings=lora, init_seed=init_seed,
                             seed=client_ss[k]) for k, task in enumerate(tasks)]
        factors = load_factors(dirs)
        stacks = stack_deltas(dirs, factors)
    agg = aggregate(stacks, ATTENTION_MODULES, truth, lam_L=lam_L, lam_S=lam_S, tau=tau, alpha=alpha,
                    rank=lora.rank, methods=methods, solver_options=solver_options, factors=factors)
    test_rng = as_generator(seed, "sec8-test")
    common = (TaskSpec(16, 1.1, "fuzzy", background).sample(n_test, seed=test_rng)
              if regime == "homogeneous" else None)
    acc = {m: np.full(K, np.nan) for m in methods}
    for k in range(K):
        if not truth[k]:
            continue
        test = common if common is not None else tasks[k].sample(n_test, seed=test_rng)
        for m in methods:
            deltas = {name: agg.deltas[m][name][k] for name in (*ATTENTION_MODULES, OUTPUT_MODULE)}
            acc[m][k] = accuracy(merged_model(backbone, deltas), test, metric=metric)
    has_clair = bool(agg.benign)
    benign = (np.stack([agg.benign[n] for n in ATTENTION_MODULES]) if has_clair
              else np.zeros((len(ATTENTION_MODULES), K), dtype=bool))
    norms = np.stack([agg.block_norms[n] for n in ATTENTION_MODULES]) if has_clair else None
    return Sec8Replicate(accuracy=acc, benign=benign, truth=truth, tasks=tasks,
                         clair_status=[agg.clair_status.get(n, "") for n in ATTENTION_MODULES],
                         block_norms=norms,
                         benign_auto=(np.stack([agg.benign_auto[n] for n in ATTENTION_MODULES])
                                      if agg.benign_auto else None))
