"""Families of trained adapter sets (lowrank_fl.nn.trained_families): the settings drawn per seed
(no training here) and the benign FedAvg reference."""
from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("torch")

from lowrank_fl.nn.trained_families import (FAMILIES, LONG, LONG_STEPS, PERSONAL, benign_fedavg,  # noqa: E402
                                            family_settings)
from lowrank_fl.nn.trained_sets import TrainedSetSettings, client_tasks  # noqa: E402


@pytest.mark.parametrize("family", PERSONAL)
def test_personal_family_is_deterministic_and_valid(family):
    draws = [family_settings(family, seed) for seed in range(12)]
    again = [family_settings(family, seed) for seed in range(12)]
    assert draws == again and [s.key() for s in draws] == [s.key() for s in again]
    assert len({s.key() for s in draws}) == 12                     # every seed a set of its own
    assert family in FAMILIES
    for seed, s in enumerate(draws):
        assert isinstance(s, TrainedSetSettings) and s.seed == seed
        assert s.base == family.split("-")[0] and s.n_clients == 10
        assert 1 <= s.n_contaminated <= 3                          # 10-30 % contaminated
        assert s.benign_task == "rotate" and set(s.contamination) <= {"reverse", "shift"}
        assert s.letters == "disjoint" and s.heterogeneous and s.n_examples == 0
        assert s.label_noise == 0.1 and s.uneven == 3.0 and s.steps == 150 and s.lr == 3e-3
        assert s.rank in (4, 8, 16) and s.lora_alpha == 2 * s.rank and not s.use_rslora
        tasks = client_tasks(s)
        kinds = [t.kind for t in tasks.values()]
        assert kinds[:10 - s.n_contaminated] == ["rotate"] * (10 - s.n_contaminated)
        assert set(kinds[10 - s.n_contaminated:]) <= set(s.contamination)
        # each client draws its segments from 8 letters of its own group (6 groups of 8)
        for k, t in enumerate(tasks.values()):
            assert t.alphabet == tuple(range(8 * (k % 6), 8 * (k % 6) + 8))
    # the draws vary what the family says they vary
    assert {s.rank for s in draws} == {4, 8, 16} and {s.n_contaminated for s in draws} == {1, 2, 3}
    assert {s.contamination for s in draws} == {("reverse",), ("shift",), ("reverse", "shift")}


def test_family_names_are_checked():
    with pytest.raises(ValueError, match="family"):
        family_settings("llama-personnal", 0)


def test_benign_fedavg_is_the_mean_of_the_benign_updates():
    rng = np.random.default_rng(0)
    factors = {f"c{k}": {"m": (rng.normal(size=(2 + k, 5)), rng.normal(size=(3, 2 + k)), 0.5 + k)}
               for k in range(4)}
    out = benign_fedavg(factors, ["c0", "c2", "c3"])
    A, B, s = out["m"]
    want = np.mean([f["m"][2] * f["m"][1] @ f["m"][0] for n, f in factors.items() if n != "c1"], axis=0)
    np.testing.assert_allclose(s * B @ A, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="benign"):
        benign_fedavg(factors, [])


@pytest.mark.parametrize("family", ["llama-uneven", "gpt2-uneven"])
def test_uneven_family_is_the_first_tasks_with_uneven_training(family):
    draws = [family_settings(family, seed) for seed in range(16)]
    assert draws == [family_settings(family, seed) for seed in range(16)]
    base = family.split("-")[0]
    seen = set()
    for seed, s in enumerate(draws):
        ref = TrainedSetSettings.for_base(base, n_clients=s.n_clients, n_contaminated=s.n_contaminated,
                                          heterogeneous=s.heterogeneous, uneven=3.0, seed=seed)
        assert s == ref and s.n_clients in (8, 10) and 0 <= s.n_contaminated <= 3
        factors = {(t.steps_factor, t.lr_factor) for t in client_tasks(s).values()}
        assert factors <= {(1.0, 1.0), (3.0, 1.0), (1.0, 3.0)} and len(factors) >= 2   # uneven
        seen |= factors
    assert len(seen) == 3                                          # ×3 steps and ×3 lr both occur
    assert len({s.n_contaminated for s in draws}) >= 3 and {s.n_clients for s in draws} == {8, 10}


@pytest.mark.parametrize("family", ["llama-federated-long", "gpt2-federated-long"])
def test_long_family_is_the_federated_draw_trained_longer(family):
    short = family.removesuffix("-long")
    for seed in range(12):
        s, ref = family_settings(family, seed), family_settings(short, seed)
        assert s.steps == 150 and ref.steps == 30
        # everything but the steps is the short family's draw of the same seed
        assert replace(s, steps=ref.steps) == ref and s.key() != ref.key()
        assert s == family_settings(family, seed)
    assert family in FAMILIES and family in LONG and LONG_STEPS == 150
