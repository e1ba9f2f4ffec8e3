"""Settings every federated method shares, resolved and checked in one place.

* ``data``: the data regime, ``"population"`` (exact expected gradients), ``"fixed"`` (the
  problem's own dataset, reused every round) or ``"fresh"`` (a new batch drawn every round by
  ``problem.sample``). ``None`` picks ``"fixed"`` when the problem carries a dataset and
  ``"population"`` when it does not, so a method never silently ignores a user's dataset.
* ``clients_per_round``: how many clients take part in a round, drawn uniformly *without*
  replacement; ``None`` means all.
* ``local_steps``: local iterations per round, at most :data:`MAX_LOCAL_STEPS`.
"""
from __future__ import annotations

import warnings

import numpy as np

from ..validation import check_choice, check_int

__all__ = ["DATA_REGIMES", "MAX_LOCAL_STEPS", "resolve_data", "check_local_steps", "deprecated_keywords",
           "participation_to_clients", "fresh_samples_to_data", "legacy_participation_and_data",
           "check_clients_per_round", "choose_clients"]

DATA_REGIMES = ("population", "fixed", "fresh")
MAX_LOCAL_STEPS = 100_000  # one cap for every method: beyond it a "round" is a local solve


def resolve_data(data, *, has_dataset: bool, can_sample: bool, has_population: bool = True,
                 batch_size=None, method: str = "this method") -> str:
    """Resolve the ``data`` argument to one of :data:`DATA_REGIMES` and check it is usable.

    Raises ``ValueError`` naming ``data`` when the regime needs what the problem lacks (a dataset
    for ``"fixed"``, a sampler for ``"fresh"``, a population for ``"population"``), and naming
    ``batch_size`` when it is given outside the ``"fresh"`` regime.
    """
    if data is None:
        data = "fixed" if has_dataset else "population"
    data = check_choice(data, "data", DATA_REGIMES)
    if data == "fixed" and not has_dataset:
        raise ValueError("data='fixed' needs a problem with a dataset (samples_per_client); "
                         "this problem has none: use data='population' or 'fresh'")
    if data == "fresh" and not can_sample:
        raise ValueError(f"data='fresh' needs a problem that can draw samples; {method} got one "
                         f"built from fixed data: use data='fixed'")
    if data == "population" and not has_population:
        raise ValueError("data='population' needs a problem with a known population (ground "
                         "truth); this one was built from data: use data='fixed'")
    if batch_size is not None:
        if data != "fresh":
            raise ValueError(f"batch_size is only used with data='fresh' (got data={data!r})")
        check_int(batch_size, "batch_size", minimum=1)
    return data


def check_local_steps(local_steps) -> int:
    """``local_steps`` as an int in [1, MAX_LOCAL_STEPS]."""
    return check_int(local_steps, "local_steps", minimum=1, maximum=MAX_LOCAL_STEPS)


def check_clients_per_round(clients_per_round, n_clients: int, *, rank: int | None = None) -> int:
    """``clients_per_round`` as an int in [1, n_clients] (``None``: all clients).

    With ``rank`` given, fewer participants than the rank is allowed but warned about: one round
    then cannot see the whole representation (FedRep's own Fig. 3 runs one client per round).
    """
    if clients_per_round is None:
        return n_clients
    m = check_int(clients_per_round, "clients_per_round", minimum=1, maximum=n_clients)
    if rank is not None and m < rank:
        warnings.warn(f"clients_per_round={m} is below the rank {rank}: a single round's update "
                      f"cannot span the representation", UserWarning, stacklevel=3)
    return m


def choose_clients(rng: np.random.Generator, n_clients: int, clients_per_round: int) -> np.ndarray | None:
    """Indices of this round's participants, sorted, drawn without replacement (``None``: all)."""
    if clients_per_round >= n_clients:
        return None
    return np.sort(rng.choice(n_clients, size=clients_per_round, replace=False))


def deprecated_keywords(method: str, given: dict, renames: dict) -> dict:
    """Check the ``**deprecated`` keywords a function received against its table of old names.

    ``renames`` maps an old keyword to its new name. Each old keyword given issues a
    ``DeprecationWarning`` naming the new one (the old names stay for one release); an unknown
    keyword raises ``TypeError`` exactly as Python would. Returns ``given`` (old name → value).
    """
    for old in given:
        if old not in renames:
            raise TypeError(f"{method}() got an unexpected keyword argument {old!r}")
    for old in given:
        warnings.warn(f"{method}(): the keyword {old!r} is deprecated and will be removed in the "
                      f"next release; use {renames[old]!r} instead", DeprecationWarning, stacklevel=3)
    return given


def participation_to_clients(participation, n_clients: int) -> int:
    """The old participation *fraction* ``r`` as a client count: ``round(r n)``, at least 1."""
    from ..validation import check_in_interval
    r = check_in_interval(participation, "participation", 0.0, 1.0, closed="right")
    return max(1, int(round(r * n_clients)))


def fresh_samples_to_data(fresh_samples, *, has_samples: bool) -> str:
    """The old ``fresh_samples`` bool as a ``data`` regime: False → ``"fixed"``; True →
    ``"fresh"`` when a batch size is known (``has_samples``), else ``"population"`` (the old
    behaviour of a fresh-sample run without any sample size)."""
    if not isinstance(fresh_samples, (bool, np.bool_)):
        raise TypeError(f"fresh_samples must be a bool, got {fresh_samples!r}")
    if not fresh_samples:
        return "fixed"
    return "fresh" if has_samples else "population"


def legacy_participation_and_data(method: str, old: dict, *, clients_per_round, data, batch_size,
                                  problem) -> tuple:
    """Map the deprecated ``participation`` (a fraction) and ``fresh_samples`` (a bool) of the
    multitask methods onto ``clients_per_round`` and ``data``; giving an old keyword together with
    its new one is a ``TypeError``. Returns ``(clients_per_round, data)``."""
    if "participation" in old:
        if clients_per_round is not None:
            raise TypeError(f"{method}() got both clients_per_round and its deprecated alias "
                            "participation")
        clients_per_round = participation_to_clients(old["participation"], problem.n_clients)
    if "fresh_samples" in old:
        if data is not None:
            raise TypeError(f"{method}() got both data and its deprecated alias fresh_samples")
        data = fresh_samples_to_data(old["fresh_samples"], has_samples=batch_size is not None
                                     or problem.samples_per_client is not None)
    return clients_per_round, data
