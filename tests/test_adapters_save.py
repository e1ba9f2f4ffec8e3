"""save_adapter: the library's (A, B, scaling) triples and (B, A) pairs both write the update
scaling · B A, read back exactly by the library's reader; an existing adapter is never replaced
without overwrite=True; malformed entries are errors naming the module."""
import json

import numpy as np
import pytest
from safetensors.numpy import load_file

from lowrank_fl.adapters import ModuleOptions, aggregate_factors, load_adapters, save_adapter
from lowrank_fl.adapters.synthetic import write_synthetic_adapters

M0 = "base_model.model.model.layers.0.self_attn.q_proj"
M1 = "base_model.model.model.layers.0.self_attn.v_proj"


def _cfg(tmp_path):
    src = write_synthetic_adapters(tmp_path / "src", n_clients=2, n_layers=1, modules=("q_proj", "v_proj"),
                                   shape=(12, 10), rank=3, contaminated=0, dtype="float32", seed=0)
    return src, json.loads((src[0] / "adapter_config.json").read_text())


def _read_delta(path):
    """B A per module, read with safetensors itself (the written configs have lora_alpha = r per
    module: scaling 1, checked here)."""
    cfg = json.loads((path / "adapter_config.json").read_text())
    assert cfg["lora_alpha"] == cfg["r"] and cfg["alpha_pattern"] == cfg["rank_pattern"]
    t = load_file(str(path / "adapter_model.safetensors"))
    return {k[:-len(".lora_A.weight")]: t[k.replace("lora_A", "lora_B")].astype(float) @ v.astype(float)
            for k, v in t.items() if k.endswith(".lora_A.weight")}


def test_triples_and_pairs_write_the_same_update(tmp_path):
    _, cfg = _cfg(tmp_path)
    rng = np.random.default_rng(1)
    A0, B0 = rng.standard_normal((3, 10)), rng.standard_normal((12, 3))
    A1, B1 = rng.standard_normal((2, 10)), rng.standard_normal((12, 2))
    save_adapter(tmp_path / "tri", cfg, {M0: (A0, B0, 2.5), M1: (A1, B1, 1.0)}, dtype="float64")
    save_adapter(tmp_path / "pair", cfg, {M0: (2.5 * B0, A0), M1: (B1, A1)}, dtype="float64")
    tri, pair = _read_delta(tmp_path / "tri"), _read_delta(tmp_path / "pair")
    # the reference: the products formed here, independently of the writer and reader
    for m, ref in ((M0, 2.5 * B0 @ A0), (M1, B1 @ A1)):
        np.testing.assert_allclose(tri[m], ref, rtol=0, atol=1e-12 * np.abs(ref).max())
        np.testing.assert_allclose(pair[m], ref, rtol=0, atol=1e-12 * np.abs(ref).max())
    written = json.loads((tmp_path / "tri" / "adapter_config.json").read_text())
    # one module's rank is r, the other's in rank_pattern (escaped: an exact name)
    assert written["r"] == 2 and written["rank_pattern"] == {r"model\.layers\.0\.self_attn\.q_proj": 3}


@pytest.mark.parametrize("output", ["merged", "split"])
def test_aggregate_factors_outputs_save_as_they_are(tmp_path, output):
    """Every output of a K = 6 aggregate saves and reads back exactly, those whose factors would
    stack above min(out, in) = 10 included (the split layout's shared part: 5 clients of rank 3; a
    merged refined client: its update beside the correction): they are stored at rank 10
    (lowrank_fl.linalg.compact_factors), the same product."""
    src = write_synthetic_adapters(tmp_path / "src", n_clients=6, n_layers=1, modules=("q_proj", "v_proj"),
                                   shape=(12, 10), rank=3, contaminated=1, dtype="float32", seed=0)
    cfg = json.loads((src[0] / "adapter_config.json").read_text())
    res = aggregate_factors(load_adapters(src), ModuleOptions(output_dtype="float64"), output=output)
    assert max(A.shape[0] for f in res.outputs.values() for A, _, _ in f.values()) == 10
    for name, factors in res.outputs.items():
        save_adapter(tmp_path / output / name, cfg, factors, dtype="float64")
        got = _read_delta(tmp_path / output / name)
        for m, (A, B, s) in factors.items():
            ref = s * np.asarray(B, float) @ np.asarray(A, float)
            assert np.linalg.norm(got[m] - ref) <= 1e-12 * np.linalg.norm(ref), (name, m)


def test_the_bytes_do_not_depend_on_the_order_the_modules_come_in(tmp_path):
    # several workers finish modules in any order: the file must be the same
    src, cfg = _cfg(tmp_path)
    rng = np.random.default_rng(0)
    mods = [M0.replace("q_proj", m) for m in ("v_proj", "q_proj", "k_proj")]
    f = {m: (rng.standard_normal((3, 10)), rng.standard_normal((12, 3)), 1.0) for m in mods}
    save_adapter(tmp_path / "a", cfg, f)
    save_adapter(tmp_path / "b", cfg, dict(reversed(list(f.items()))))
    a, b = ((tmp_path / d / "adapter_model.safetensors").read_bytes() for d in "ab")
    assert a == b
    assert list(load_file(str(tmp_path / "a" / "adapter_model.safetensors"))) == sorted(
        f"{m}.lora_{s}.weight" for m in mods for s in "AB")
    cfg_a, cfg_b = ((tmp_path / d / "adapter_config.json").read_bytes() for d in "ab")
    assert cfg_a == cfg_b


def test_an_existing_adapter_is_not_replaced_without_overwrite(tmp_path):
    src, cfg = _cfg(tmp_path)
    before = (src[0] / "adapter_model.safetensors").read_bytes()
    f = {M0: (np.ones((3, 10)), np.ones((12, 3)), 1.0)}
    with pytest.raises(FileExistsError, match="overwrite=True"):
        save_adapter(src[0], cfg, f)
    assert (src[0] / "adapter_model.safetensors").read_bytes() == before
    save_adapter(src[0], cfg, f, overwrite=True)
    np.testing.assert_allclose(_read_delta(src[0])[M0], np.full((12, 10), 3.0))


@pytest.mark.parametrize("entry, match", [
    ((np.ones((3, 10)),), "must be \\(A, B, scaling\\) or \\(B, A\\)"),
    ((np.ones((3, 10)), np.ones((12, 4)), 1.0), "not the factors"),
    ((np.ones((3, 10)), np.ones((12, 3)), float("nan")), "scaling must be finite"),
    ((np.ones((12, 3)), np.ones((3, 10)), 1.0), "not the factors"),       # (B, A, s): the order swapped
    ((np.ones((3, 10)), np.ones((12, 3)), None), "scaling must be a finite number"),
    ((np.ones((3, 10)), np.ones((12, 4))), "not the factors"),           # (A, B) given as a pair
])
def test_malformed_entries_name_the_module(tmp_path, entry, match):
    _, cfg = _cfg(tmp_path)
    with pytest.raises(ValueError, match=match) as err:
        save_adapter(tmp_path / "bad", cfg, {M0: entry})
    assert M0 in str(err.value)
    assert not (tmp_path / "bad").exists()


def test_a_config_that_is_not_one_is_refused(tmp_path):
    with pytest.raises(TypeError, match="base_config must be an adapter config"):
        save_adapter(tmp_path / "o", ["r", 4], {M0: (np.ones((3, 10)), np.ones((12, 3)), 1.0)})
    assert not (tmp_path / "o").exists()
