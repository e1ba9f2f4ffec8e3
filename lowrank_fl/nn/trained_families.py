"""Families of trained adapter sets that look like federated LoRA as it is run: settings drawn per
set (:class:`lowrank_fl.nn.trained_sets.TrainedSetSettings`), so that a rule is chosen on some
families and reported on others.

Every family trains its clients from the server's common LoRA initialization (PEFT's default:
the same ``A``, ``B = 0``; :mod:`.trained_sets`). The *realistic* families add what the first
benchmark lacked:

* ``"llama-federated"``, ``"gpt2-federated"``: few noisy examples (32 sequences, 10 % label
  noise), uneven training (a third of the clients train 3× the steps, a third with 3× the
  learning rate), ranks 4 / 8 / 16, rsLoRA or not, ``K`` = 10 or 20, 0 % (a clean federation,
  one set in four) or 10-40 % contaminated with a near miss (``"rotate"``: every letter copied one
  position early) or a reversed copy, benign heterogeneity from per-client task variations or
  disjoint input letters per client;
* ``"llama-collab"``, ``"gpt2-collab"``: federations where collaboration pays: every benign
  client holds 8 noisy examples of one shared task (where the FedAvg of the benign clients beats
  their own adapters), 0-20 % contaminated. Measured (seeds 1700-1703; the verifier's fresh
  seeds alike): in these and the ``*-federated`` families every benign adapter is below the base
  model on its own task, and the contaminated ones barely beat the base on theirs (none by more
  than 0.02 on seeds 1700-1703, one of 13 on the verifier's seeds); the benign FedAvg's gain over
  the own adapters is about what the base model alone gains (a median 1.03 of it): the average
  mostly undoes what fitting a few noisy examples cost;
* ``"llama-personal"``, ``"gpt2-personal"``: federations where averaging *hurts*, built to check
  that a no-harm rule leaves the benign clients their own adapters where collaboration does not
  pay. Every benign client learns ``"rotate"`` (copy one position early: the base's copying gets
  it wrong at the segment's wrap-around, and more often on a small alphabet) on its own 8 input
  letters (``letters="disjoint"``) and its own segment length, from a large noisy data set (fresh
  sequences every step, 10 % label noise): its adapter beats the base on its own task, and the
  benign FedAvg dilutes what each learned (the updates of clients on different letters are
  nearly orthogonal, cosine about 0.03). Seeds 0-2 and 100-102, the benign clients' mean
  held-out accuracy per set, Llama: own 0.61-0.72, base 0.49-0.55, benign FedAvg 0.49-0.56
  (0.09-0.22 below own); GPT-2: own 0.51-0.57, base 0.43-0.49, benign FedAvg 0.42-0.50
  (0.07-0.10 below own); 1-2 minutes a set on one core. ``K`` = 10, 1-3 contaminated
  (``"reverse"`` / ``"shift"``), ranks 4 / 8 / 16 with ``lora_alpha = 2r``, uneven training
  (×3 steps or learning rate), 150 steps at 3e-3. No rsLoRA: at rank 16 it scales
  the update ×4 over ``alpha / r`` and a client with 3× the learning rate diverged (update norm
  186 against 10-20, own accuracy 0.15).

* ``"llama-uneven"``, ``"gpt2-uneven"``: the first benchmark's tasks (fresh data every step, so
  the benign clients share a direction) with uneven training (a third ×3 steps, a third ×3
  learning rate), ``K`` = 8 or 10, 0-3 contaminated: a family far from the update rule's design
  (added after it, to report it on), where the honest clients' sizes are bimodal;

* ``"llama-federated-long"``, ``"gpt2-federated-long"``: the ``*-federated`` draw of the same seed
  trained 150 steps instead of 30 (many passes over each client's 32 noisy examples), everything
  else alike. Added after every rule was chosen, to report on: a family far from the design,
  where each client overfits its own examples, the benign FedAvg beats the clients' own adapters
  by 0.08-0.34 of accuracy on seeds 2000-2007, and 3 of about 200 3×-learning-rate clients of
  seeds 2000-2031 diverged to 9-11 times the typical update;

and ``"llama"``, ``"gpt2"``, ``"sec8"`` are the first benchmark's families (fresh data every step,
even training: :func:`lowrank_fl.nn.trained_sets.TrainedSetSettings.for_base` with drawn ``K``,
contamination and heterogeneity).

:func:`family_settings` draws a set's settings from a family and a seed (deterministic).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..validation import as_generator
from .trained_sets import TrainedSetSettings

__all__ = ["FAMILIES", "REALISTIC", "PERSONAL", "UNEVEN", "LONG", "LONG_STEPS", "family_settings", "benign_fedavg"]

REALISTIC = ("llama-federated", "gpt2-federated", "llama-collab", "gpt2-collab")
#: families where the benign clients' own adapters beat their FedAvg (the no-harm check)
PERSONAL = ("llama-personal", "gpt2-personal")
#: the first families' tasks with uneven training (reported on, never used to choose a rule)
UNEVEN = ("llama-uneven", "gpt2-uneven")
#: the ``*-federated`` draws trained :data:`LONG_STEPS` steps (reported on, never used to choose a rule)
LONG = ("llama-federated-long", "gpt2-federated-long")
LONG_STEPS = 150
FAMILIES = REALISTIC + PERSONAL + UNEVEN + LONG + ("llama", "gpt2", "sec8")
_PERSONAL_CONTAMINATION = (("reverse",), ("shift",), ("reverse", "shift"))


def _pick(rng, options):
    return options[int(rng.integers(0, len(options)))]


def family_settings(family: str, seed: int) -> TrainedSetSettings:
    """The settings of set ``seed`` of ``family`` (module docstring); the client seed is
    ``seed`` too, so every set's clients are trained afresh."""
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    if family in LONG:          # the same draw as the short family's, trained longer
        return replace(family_settings(family.removesuffix("-long"), seed), steps=LONG_STEPS)
    rng = as_generator(int(seed), f"trained-family-{family}")
    base = family.split("-")[0]
    if family in ("llama", "gpt2", "sec8"):
        K = _pick(rng, (6, 8, 10))
        return TrainedSetSettings.for_base(base, n_clients=K, n_contaminated=_pick(rng, (0, 1, 2, 3)),
                                           heterogeneous=bool(_pick(rng, (True, False))), seed=int(seed))
    if family.endswith("-uneven"):
        K = _pick(rng, (8, 10))
        return TrainedSetSettings.for_base(base, n_clients=K, n_contaminated=_pick(rng, (0, 1, 2, 3)),
                                           heterogeneous=bool(_pick(rng, (True, False))), uneven=3.0,
                                           seed=int(seed))
    if family.endswith("-collab"):
        K = _pick(rng, (8, 10))
        return TrainedSetSettings(base=base, n_clients=K, n_contaminated=_pick(rng, (0, 1, 2)),
                                  contamination=(_pick(rng, ("reverse", "rotate")),),
                                  heterogeneous=False, n_examples=8, label_noise=0.1,
                                  steps=30, lr=3e-3, rank=_pick(rng, (4, 8)), seed=int(seed))
    if family.endswith("-personal"):
        rank = _pick(rng, (4, 8, 16))
        bad = _pick(rng, (1, 2, 3))
        return TrainedSetSettings(base=base, n_clients=10, n_contaminated=bad,
                                  contamination=_pick(rng, _PERSONAL_CONTAMINATION),
                                  benign_task="rotate", heterogeneous=True, letters="disjoint",
                                  n_examples=0, label_noise=0.1, uneven=3.0, steps=150, lr=3e-3,
                                  rank=rank, lora_alpha=float(2 * rank), seed=int(seed))
    K = _pick(rng, (10, 10, 20))
    clean = rng.random() < 0.25
    frac = _pick(rng, (0.1, 0.2, 0.3, 0.4))
    bad = 0 if clean else max(1, int(round(frac * K)))
    kinds = _pick(rng, (("rotate",), ("reverse",), ("rotate", "reverse")))
    rank = _pick(rng, (4, 8, 16))
    return TrainedSetSettings(base=base, n_clients=K, n_contaminated=bad, contamination=kinds,
                              heterogeneous=True, letters=_pick(rng, ("all", "disjoint")),
                              n_examples=32, label_noise=0.1, uneven=3.0, steps=30,
                              lr=3e-3, rank=rank, lora_alpha=float(2 * rank),
                              use_rslora=bool(rng.random() < 0.5), seed=int(seed))


def benign_fedavg(factors: dict, benign) -> dict:
    """The exact FedAvg of the ``benign`` clients' updates per module, as one client's
    ``{module: (A, B, 1.0)}`` (a stacked factorization: ``mean_k s_k B_k A_k``): the reference
    of "where collaboration helps"."""
    benign = list(benign)
    if not benign:
        raise ValueError("benign must name at least one client")
    out = {}
    for m in factors[benign[0]]:
        A = np.vstack([factors[n][m][0] for n in benign])
        B = np.hstack([factors[n][m][2] * factors[n][m][1] for n in benign]) / len(benign)
        out[m] = (A, B, 1.0)
    return out
