"""The backbone of the CLAIR §8 claims: pretraining recipe per scale, pretraining seeds with
checkpoints, the copying threshold and the selection rule. Nothing here imports torch at import time.

Copying threshold (derived, fixed before running): a backbone that has not learned to copy predicts
the most frequent letter, whose share of the masked positions is ``u = P(X = 1; t)`` (25.9 % at
S5's ``t = 1.1``, 1.9 % for uniform letters); a perfect copier scores 100 %. A backbone *copies*
when its masked accuracy (§8.2's ``M_i``) on its own pretraining task is at least the midpoint
``(u + 100 %) / 2`` (63.0 % at ``t = 1.1``), otherwise it sits on a *plateau*.

Selection rule (the §8 claims use the backbone it picks): pretraining seeds
``base_seed·1000 + 0, 1, 2, …`` in this order, each trained once with checkpoints every 500 steps.

* Quick and smoke (fixed before running): the first checkpoint of the first seed that copies by
  the threshold above.
* Full (:func:`select_calibrated`): Song, Xu & Zhong's recipe (the "standard practice" S5 points
  to: loss on every position, AdamW, no final layer norm, see
  :meth:`lowrank_fl.nn.pretrain.PretrainSettings.recipe`), **calibrated to Table 3's homogeneous
  Local level** (78.27 %), not reproduced from S5's 5500 steps (Song's recipe is at 43–49 % there).
  The level of a checkpoint is Local after LoRA: the mean over ``calibration_reps`` calibration
  replicates (seeds of their own, never Table 3's) of the benign clients' masked accuracy in Table
  3's homogeneous design. The chosen checkpoint is the first, on a ``fine_step`` grid from S5's
  5500 steps, that copies and whose level reaches 78.27 %, searched coarse then fine: the first
  500-step checkpoint that does, then the ``fine_step`` checkpoints of the 500 steps before it in
  order (the first on the fine grid whenever the level crosses the target once in that interval;
  the backbone claim lists every level computed). **Changed after a full-scale run**: the first
  full-scale rule put the target on the *backbone's* own accuracy on the common task at 500-step
  checkpoints; the backbone crossed it between 77.7 % (7000 steps) and 85.0 % (7500), LoRA adds
  about 5 points, and Table 3's Local came out at 87.9 %. The rule now calibrates what the target
  is (Local after LoRA) on a grid fine enough for it.

Quick and smoke:
quick uses our recipe (loss on the second copy, which learns in ~2000 steps) and smoke clean copying
with uniform letters at learning rate 3e-3 (copies in 150–200 steps), so that smoke runs the §8
claims past their baseline check; neither says anything about the paper's numbers.
"""
from __future__ import annotations

import functools

import numpy as np

__all__ = ["BACKBONE_CLAIM", "LOCAL_LEVEL", "SCALES", "checkpoint_base", "chosen", "copying_threshold",
           "pretrain_seeds", "pretrain_settings", "seed_curve", "select", "select_calibrated", "split_seeds",
           "unigram_share"]

BACKBONE_CLAIM = "clair.sec8.backbone_seeds"
#: Table 3, homogeneous Local (%): the calibration target of the full-scale rule
LOCAL_LEVEL = 78.27

#: per scale: the recipe (PretrainSettings.recipe name and overrides), the checkpoints (steps of the
#: task; the last one is the pretraining length), how many seeds the backbone claim reports, and the
#: rule's from_step and target (None: the first copying checkpoint)
SCALES = {
    "smoke": {"recipe": "ours", "overrides": {"kind": "clean", "exponent": 0.0, "lr": 3e-3, "batch_size": 32},
              "checkpoints": (100, 150, 200), "seeds": 5, "from_step": 0, "target": None, "n_eval": 200},
    # quick: 3 seeds to 1500 steps (it was 5 to 2500, 60 % of the quick §8 run's time): the rule picks
    # the same checkpoint (seed 1 at 1000 steps; a checkpoint is the same whatever the run's length)
    "quick": {"recipe": "ours", "overrides": {}, "checkpoints": tuple(range(500, 1501, 500)), "seeds": 3,
              "from_step": 0, "target": None, "n_eval": 300},
    "full": {"recipe": "song", "overrides": {}, "checkpoints": tuple(range(500, 12001, 500)), "seeds": 6,
             "from_step": 5500, "target": LOCAL_LEVEL, "n_eval": 500,
             "calibrate": True, "fine_step": 100, "calibration_reps": 4},
}


def unigram_share(exponent: float) -> float:
    """Share (%) of the most frequent letter under ``P(X = a; t) ∝ a^{-t}``, ``a = 1..52`` (§8.2)."""
    p = np.arange(1, 53, dtype=np.float64) ** (-float(exponent))
    return float(100 * p[0] / p.sum())


def copying_threshold(exponent: float) -> float:
    """Midpoint (%) between the most-frequent-letter share and a perfect copier (100 %)."""
    return (unigram_share(exponent) + 100.0) / 2


def split_seeds(accuracies, threshold: float) -> dict:
    """``{"copying": [indices], "plateau": [indices]}`` of ``accuracies`` (%) at/above vs below
    ``threshold``."""
    acc = np.asarray(accuracies, dtype=float)
    return {"copying": np.flatnonzero(acc >= threshold).tolist(),
            "plateau": np.flatnonzero(~(acc >= threshold)).tolist()}


def select(curves, *, threshold: float, target: float | None, from_step: int = 0):
    """The rule: ``(i, step)`` of the first curve (in order) and its first checkpoint at or after
    ``from_step`` whose ``base`` accuracy reaches ``threshold`` and whose ``common`` accuracy
    reaches ``target`` (ignored when None); ``None`` when no checkpoint qualifies.

    curves : list of dicts with ``steps``, ``base`` and ``common`` (accuracies in %, one per step).
    """
    for i, c in enumerate(curves):
        for step, base, common in zip(c["steps"], c["base"], c["common"]):
            if step >= from_step and base >= threshold and (target is None or common >= target):
                return i, int(step)
    return None


def select_calibrated(curve: dict, level, *, threshold: float, target: float, from_step: int,
                      fine_step: int):
    """The full-scale rule on one seed's ``curve`` (module docstring): ``(step, levels)`` of the
    chosen checkpoint, or ``(None, levels)`` when none qualifies.

    ``level(step)`` → ``{"local": %, "base": %, ...}``: the calibration Local level and the
    checkpoint's accuracy on its own pretraining task (called only where needed, in search order;
    every call's result is in ``levels``, keyed by step). A coarse checkpoint below ``threshold``
    on ``curve["base"]`` is not evaluated.
    """
    levels = {}
    prev = None
    for step, base in zip(curve["steps"], curve["base"]):
        step = int(step)
        if step >= from_step and base >= threshold:
            levels[step] = level(step)
            if levels[step]["local"] >= target:
                lo = from_step if prev is None else max(prev + fine_step, from_step)
                for f in range(lo, step, fine_step):
                    levels[f] = level(f)
                    if levels[f]["base"] >= threshold and levels[f]["local"] >= target:
                        return f, levels
                return step, levels
        prev = step
    return None, levels


def pretrain_settings(scale: str, seed: int):
    """The PretrainSettings of ``scale``'s recipe for pretraining seed ``seed`` (steps = the last checkpoint)."""
    from lowrank_fl.nn.pretrain import PretrainSettings

    s = SCALES[scale]
    return PretrainSettings.recipe(s["recipe"], **s["overrides"], steps=s["checkpoints"][-1], seed=int(seed))


def pretrain_seeds(scale: str, base_seed: int = 0) -> list[int]:
    """The pretraining seeds in the rule's order."""
    return [1000 * int(base_seed) + i for i in range(SCALES[scale]["seeds"])]


def _evaluation_rng(seed: int) -> np.random.Generator:
    """The evaluation data of pretraining seed ``seed``'s checkpoints (own task first, then the
    common task): one stream, so a checkpoint scores the same wherever it is evaluated."""
    return np.random.default_rng([int(seed), 8, 2])


@functools.lru_cache(maxsize=16)
def seed_curve(scale: str, seed: int, cache_dir: str) -> dict:
    """Pretrain seed ``seed`` under ``scale``'s recipe (checkpoints cached in ``cache_dir``) and score
    every checkpoint: masked accuracy (%) on its own pretraining task (``base``) and on the common
    task (``common``; ``common_song``: Song et al.'s metric convention), on evaluation data drawn
    from ``seed`` (the same numbers wherever it is computed)."""
    from lowrank_fl.nn import copying
    from lowrank_fl.nn.clients import predict
    from lowrank_fl.nn.pretrain import copy_accuracy, pretrained_checkpoints

    settings = pretrain_settings(scale, seed)
    n = SCALES[scale]["n_eval"]
    models = pretrained_checkpoints(settings, SCALES[scale]["checkpoints"], cache_dir=cache_dir)
    out = {"seed": int(seed), "steps": [], "base": [], "common": [], "common_song": []}
    for step, model in models.items():
        rng = _evaluation_rng(seed)
        out["steps"].append(int(step))
        out["base"].append(100 * copy_accuracy(model, settings, n=n, seed=rng))
        batch = copying.sample(n, length=16, exponent=1.1, seed=rng)
        pred = predict(model, batch)
        out["common"].append(100 * (1 - copying.masked_error(pred, batch)))
        out["common_song"].append(100 * (1 - copying.masked_error(pred, batch, metric="song")))
    return out


def checkpoint_base(scale: str, seed: int, step: int, cache_dir: str) -> float:
    """Masked accuracy (%) of seed ``seed``'s checkpoint at ``step`` on its own pretraining task,
    on :func:`seed_curve`'s evaluation data (the same number the curve has at its checkpoints)."""
    from dataclasses import replace

    from lowrank_fl.nn.pretrain import copy_accuracy, pretrained_backbone

    settings = pretrain_settings(scale, seed)
    model = pretrained_backbone(replace(settings, steps=int(step)), cache_dir=cache_dir)
    return 100 * copy_accuracy(model, settings, n=SCALES[scale]["n_eval"], seed=_evaluation_rng(seed))


def chosen(scale: str, base_seed: int, cache_dir: str, level=None) -> dict:
    """The backbone the rule picks at ``scale``: seeds are pretrained in order until one
    qualifies. ``{"settings", "seed", "step", "curves", "selected", "threshold", "calibration"}``;
    when no seed qualifies, ``selected`` is False and the last checkpoint of the first seed is
    returned (its baseline check then fails and the §8 claims say inconclusive).

    ``level(seed, step)`` → ``{"local": %, "base": %, ...}``: the calibration level of the
    full-scale rule (:func:`select_calibrated`); needed where the scale calibrates.
    ``calibration``: ``[{"seed", "levels": {step: level}}]`` of the seeds searched."""
    from dataclasses import replace

    s = SCALES[scale]
    base = pretrain_settings(scale, 0)
    threshold = copying_threshold(base.exponent)
    if s.get("calibrate") and level is None:
        raise ValueError(f"scale {scale!r} calibrates the backbone on Local: pass level(seed, step)")
    curves, calibration = [], []
    for seed in pretrain_seeds(scale, base_seed):
        curves.append(seed_curve(scale, seed, cache_dir))
        if s.get("calibrate"):
            step, levels = select_calibrated(
                curves[-1], functools.partial(level, seed), threshold=threshold, target=s["target"],
                from_step=s["from_step"], fine_step=s["fine_step"])
            calibration.append({"seed": seed, "levels": levels})
            pick = None if step is None else (0, step)
        else:
            pick = select(curves[-1:], threshold=threshold, target=s["target"], from_step=s["from_step"])
        if pick is not None:
            return {"settings": replace(pretrain_settings(scale, seed), steps=pick[1]), "seed": seed,
                    "step": pick[1], "curves": curves, "selected": True, "threshold": threshold,
                    "calibration": calibration}
    seed = pretrain_seeds(scale, base_seed)[0]
    return {"settings": pretrain_settings(scale, seed), "seed": seed, "step": s["checkpoints"][-1],
            "curves": curves, "selected": False, "threshold": threshold, "calibration": calibration}
