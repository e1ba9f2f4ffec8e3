"""The options of a module's aggregation (:class:`ModuleOptions`), the method and rule names they
accept, and the rank check against the modules' shapes (:func:`check_rank`)."""
from __future__ import annotations

import numbers
import warnings
from dataclasses import dataclass

import numpy as np

from ..validation import check_gap_tolerance, check_in_interval, check_int
from . import detect_updates, robust
from .io import AdapterError

__all__ = ["METHODS", "BYZANTINE_METHODS", "OUTPUT_DTYPES", "CONTRASTS", "CLIENT_RULES",
           "DEFAULT_CLIENT_RULE", "CLIP", "ModuleOptions", "check_rank"]

METHODS = ("clair", "fedavg", "fedavg-factors", "ffa", "flexlora") + robust.ROBUST_METHODS
#: the methods that read :attr:`ModuleOptions.byzantine`
BYZANTINE_METHODS = ("krum", "multikrum", "trimmed-mean")
#: what :attr:`ModuleOptions.output_dtype` may be (the precision of the computed outputs; the
#: storage dtype of the files is chosen when writing)
OUTPUT_DTYPES = ("float32", "float64")
#: how CLAIR holds the pair contrasts: "factored" (``D″_g = T_g [X_j; X_k]``, never formed:
#: :mod:`lowrank_fl.clair.factored`), "dense" (the (G h × p′) matrix and FISTA of
#: :mod:`lowrank_fl.clair.penalized`), "auto" (factored: faster at every K measured,
#: ``benchmarks/bench_k_scaling.py``)
CONTRASTS = ("auto", "factored", "dense")
CLIENT_RULES = ("per-module", "majority", "any", "pooled", "updates", "raw")
#: the default client-level decision: the update rule (:mod:`.detect_updates`: direction and size
#: of the clients' raw updates), which the realistic federations of
#: :mod:`lowrank_fl.nn.trained_families` need (common LoRA init, few noisy examples, uneven
#: training: README, "Client-level detection" and "The realistic federations")
DEFAULT_CLIENT_RULE = "updates"
#: the default of :attr:`ModuleOptions.clip`: the update rule's size floor
CLIP = detect_updates.SIZE_RATIO


@dataclass(frozen=True)
class ModuleOptions:
    """Options of :func:`aggregate_module` (picklable, shared by every module).

    Fields (each checked here, naming it): ``method`` (:data:`METHODS`); CLAIR's ``rank`` (of
    ``P_Â``; default the clients' most common LoRA rank), ``lam_L`` and ``lam_S`` (both or neither:
    automatic, :mod:`.tuning`), ``alpha`` (the voting level of (8), in [0.5, 1)), ``tol`` and
    ``max_iter`` (the solve of (7): relative duality gap and iteration cap), ``contrasts``
    (:data:`CONTRASTS`) and ``clip``; ``energy`` (in (0, 1]: truncate the joint subspaces to this
    fraction of the updates' energy; None: exact); ``rank_out`` (truncate every output to this rank
    by SVD); ``output_dtype`` (:data:`OUTPUT_DTYPES`); ``byzantine`` (``f`` of
    :data:`BYZANTINE_METHODS`; a warning for the others). The comments below say more.
    """

    method: str = "clair"
    rank: int | None = None
    lam_L: float | None = None
    lam_S: float | None = None
    alpha: float = 0.5
    energy: float | None = None
    rank_out: int | None = None
    tol: float = 1e-6
    max_iter: int = 20000
    #: precision of the stored bases and output factors ("float32": what is written; "float64"
    #: for exactness checks)
    output_dtype: str = "float32"
    #: CLAIR's representation of the contrasts (:data:`CONTRASTS`)
    contrasts: str = "auto"
    #: ``f``, the Byzantine clients tolerated by krum / multikrum / trimmed-mean (default
    #: :func:`lowrank_fl.adapters.robust.default_f`)
    byzantine: int | None = None
    #: CLAIR: the solve of (7) (and the sets (8)) see each update clipped to this many times the
    #: module's median update norm, the update rule's size floor (:data:`SIZE_RATIO`): a client
    #: sending a scaled update would otherwise own ``P_Â`` (the row-space evidence of every other
    #: client is measured against it) and the solver's conditioning (one solve took 155 s instead
    #: of 1 s with an update scaled by 1e6). Every federation whose updates are within that factor
    #: of the median gets the paper's (7) unchanged; None: never clip. Detection's size and
    #: direction evidence and the refinement always use the raw updates.
    clip: float | None = CLIP

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {list(METHODS)}, got {self.method!r}")
        if self.output_dtype not in OUTPUT_DTYPES:
            raise ValueError(f"output_dtype must be one of {list(OUTPUT_DTYPES)}, got {self.output_dtype!r}")
        if self.energy is not None and (isinstance(self.energy, bool) or not isinstance(self.energy, numbers.Real)
                                        or not 0 < self.energy <= 1):
            raise ValueError(f"energy must be a number in (0, 1] or None, got {self.energy!r}")
        if self.byzantine is not None and self.method not in BYZANTINE_METHODS:
            warnings.warn(f"byzantine={self.byzantine!r} is ignored: only {', '.join(BYZANTINE_METHODS)} read it, "
                          f"not method {self.method!r}", UserWarning, stacklevel=3)
        if self.contrasts not in CONTRASTS:
            raise ValueError(f"contrasts must be one of {list(CONTRASTS)}, got "
                             f"{self.contrasts!r}")
        if (self.lam_L is None) != (self.lam_S is None):
            raise ValueError("give both lam_L and lam_S, or neither (automatic tuning)")
        for name in ("lam_L", "lam_S"):
            v = getattr(self, name)
            if v is not None and not (np.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {v}")
        for name in ("rank", "rank_out"):
            v = getattr(self, name)
            if v is not None and (int(v) != v or v < 1):
                raise ValueError(f"{name} must be an integer >= 1, got {v}")
        # checked here, not first inside the per-module solve (after the adapters are read)
        check_in_interval(self.alpha, "alpha", 0.5, 1.0, closed="left")
        check_gap_tolerance(self.tol, "tol")
        check_int(self.max_iter, "max_iter", minimum=1)
        if self.clip is not None and not (isinstance(self.clip, (int, float)) and not isinstance(self.clip, bool)
                                          and np.isfinite(self.clip) and self.clip >= 1):
            raise ValueError(f"clip (--clip) must be a finite number >= 1 (times the median update norm) or "
                             f"None ('none' on the command line), got {self.clip!r}")


def check_rank(options: ModuleOptions, shapes: dict) -> None:
    """Refuse ``options.rank`` / ``options.rank_out`` above ``min(out, in)`` of a module
    (``shapes``: ``{module: (out, in)}``); the message names the first such module. Rank
    ``min(out, in)`` itself is accepted (for CLAIR it makes ``P_Â = I`` on the joint row space,
    so nothing can be detected and every client is kept)."""
    for name in ("rank", "rank_out"):
        v = getattr(options, name)
        if v is None:
            continue
        for m, (q, p) in shapes.items():
            if v > min(q, p):
                flag = "--" + name.replace("_", "-")
                raise AdapterError(f"module {m!r} is {q} x {p}: {name} = {v} ({flag}) is above "
                                   f"its largest possible rank min(out, in) = {min(q, p)}")
