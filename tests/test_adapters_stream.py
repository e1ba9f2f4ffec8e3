"""Streaming outputs: safetensors written tensor by tensor, staged directories, and
``aggregate_to_dir`` (write while solving) against ``aggregate_adapters`` + ``write_outputs``."""
import json

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from lowrank_fl.adapters import (ModuleOptions, aggregate_adapters, aggregate_to_dir, load_adapters,
                                 write_outputs)
from lowrank_fl.adapters import run as run_mod
from lowrank_fl.adapters.io import AdapterError
from lowrank_fl.adapters.save import STORAGE
from lowrank_fl.adapters.stream import SafetensorsStreamWriter
from lowrank_fl.outdir import MARKER, OutputDir
from lowrank_fl.adapters.synthetic import write_synthetic_adapters


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return write_synthetic_adapters(root, n_clients=4, n_layers=2, modules=("q_proj", "v_proj"),
                                    shape=(24, 20), rank=3, contaminated=1, dtype="float16", seed=3)


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_stream_writer_matches_save_file(tmp_path, dtype):
    rng = np.random.default_rng(0)
    tensors = {f"m{i}.lora_{x}.weight": rng.standard_normal((3 + i, 5 + 2 * i))
               for i in range(4) for x in "AB"}
    tensors["scalar_like"] = rng.standard_normal((1,))
    names = list(tensors)
    w = SafetensorsStreamWriter(tmp_path / "s.safetensors", names)
    for n in reversed(names):                        # any order
        w.add(n, tensors[n], dtype)
    w.close()
    save_file({k: v.astype(dtype) for k, v in tensors.items()}, str(tmp_path / "ref.safetensors"))
    got, ref = load_file(str(tmp_path / "s.safetensors")), load_file(str(tmp_path / "ref.safetensors"))
    assert sorted(got) == sorted(ref)
    for k in ref:
        assert got[k].dtype == ref[k].dtype and np.array_equal(got[k], ref[k])
    with safe_open(str(tmp_path / "s.safetensors"), framework="numpy") as f:
        assert sorted(f.keys()) == sorted(names)
    # the data start is 8-byte aligned, as safetensors writes it
    n = int.from_bytes((tmp_path / "s.safetensors").read_bytes()[:8], "little")
    assert n % 8 == 0


def test_stream_writer_refuses_undeclared_duplicate_and_missing(tmp_path):
    path = tmp_path / "s.safetensors"
    w = SafetensorsStreamWriter(path, ["a", "b"])
    with pytest.raises(ValueError, match="not declared"):
        w.add("c", np.zeros(2))
    w.add("a", np.zeros(2))
    with pytest.raises(ValueError, match="already written"):
        w.add("a", np.zeros(2))
    with pytest.raises(ValueError, match="dtype"):
        w.add("b", np.zeros(2), "int8")
    with pytest.raises(ValueError, match="never written"):
        w.close()
    assert not path.exists()                          # nothing partial is left
    with pytest.raises(ValueError, match="duplicate"):
        SafetensorsStreamWriter(path, ["a", "a"])


def test_output_dir_discards_on_error_and_commits(tmp_path):
    out = tmp_path / "out"
    with OutputDir(out, command="test") as st:
        (st.dir / "old.txt").write_text("keep me")
        st.commit()
    with pytest.raises(RuntimeError):
        with OutputDir(out, command="test", overwrite=True) as st:
            (st.dir / "new.txt").write_text("x")
            raise RuntimeError("boom")
    assert (out / "old.txt").read_text() == "keep me" and not (out / "new.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]          # no hidden leftovers
    with OutputDir(out, command="test", overwrite=True) as st:
        (st.dir / "new.txt").write_text("x")
        st.commit()
    assert sorted(p.name for p in out.iterdir()) == sorted([MARKER, "new.txt"])


def _tensors(d):
    return {c.name: load_file(str(c / "adapter_model.safetensors")) for c in sorted(d.iterdir())
            if c.is_dir()}


@pytest.mark.parametrize("method,rule,rank_out", [("clair", "per-module", None),
                                                   ("clair", "majority", None),
                                                   ("clair", "per-module", 2),
                                                   ("fedavg", "per-module", None)])
def test_aggregate_to_dir_equals_aggregate_then_write(src, tmp_path, method, rule, rank_out):
    ad = load_adapters(src)
    opts = ModuleOptions(method=method, rank_out=rank_out)
    agg = aggregate_adapters(ad, opts, progress=False)
    ref = write_outputs(agg, tmp_path / "ref", client_rule=rule)
    agg2, got = aggregate_to_dir(ad, opts, tmp_path / "got", client_rule=rule, jobs=2, progress=False)
    for key in ("method", "clients", "outputs", "dtype", "client_benign"):
        assert got.get(key) == ref.get(key), key
    # the truncation errors come from states solved in worker processes (jobs=2) vs in this one:
    # BLAS kernels may round the last bit differently on differently aligned arrays
    errs_ref, errs_got = ref.get("rank_out_relative_error"), got.get("rank_out_relative_error")
    assert (errs_ref is None) == (errs_got is None)
    for c in errs_ref or {}:
        assert errs_got[c] == pytest.approx(errs_ref[c], rel=1e-12, abs=0)
    for m in ref["modules"]:
        a, b = ref["modules"][m], got["modules"][m]
        assert {k: v for k, v in a.items() if k != "seconds"} == {k: v for k, v in b.items() if k != "seconds"}
    t_ref, t_got = _tensors(tmp_path / "ref"), _tensors(tmp_path / "got")
    assert t_ref.keys() == t_got.keys()
    for c in t_ref:
        assert t_ref[c].keys() == t_got[c].keys()
        for k in t_ref[c]:
            assert np.array_equal(t_ref[c][k], t_got[c][k]), (c, k)
        cfg_ref = json.loads((tmp_path / "ref" / c / "adapter_config.json").read_text())
        cfg_got = json.loads((tmp_path / "got" / c / "adapter_config.json").read_text())
        assert cfg_ref == cfg_got
    # the streamed results keep their summary fields but not their outputs
    with pytest.raises(RuntimeError, match="released"):
        agg2.results[0].outputs(0)


def test_aggregate_to_dir_failure_leaves_out_untouched(src, tmp_path, monkeypatch):
    ad = load_adapters(src)
    out = tmp_path / "out"
    aggregate_to_dir(ad, ModuleOptions(method="fedavg"), out, progress=False)
    before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    calls = {"n": 0}
    real = run_mod.aggregate_module

    def failing(f, options):
        calls["n"] += 1
        if calls["n"] == 3:                           # after two modules were written
            raise AdapterError(f"module {f.name!r}: injected failure")
        return real(f, options)

    monkeypatch.setattr(run_mod, "aggregate_module", failing)
    with pytest.raises(AdapterError, match="injected"):
        aggregate_to_dir(ad, ModuleOptions(), out, overwrite=True, progress=False)
    assert {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    with pytest.raises(ValueError, match="not empty"):
        aggregate_to_dir(ad, ModuleOptions(), out, progress=False)


def test_storage_precision_loss_is_an_error_named_by_tensor():
    """Rounding in float16's normal range stays within its unit roundoff 2^-11 (checked against
    numpy's own cast); underflow (subnormals, flush to zero) is refused above STORAGE_REL_ERROR."""
    from lowrank_fl.adapters.io import StorageDtypeError
    from lowrank_fl.adapters.save import STORAGE_REL_ERROR, storage_array
    rng = np.random.default_rng(0)
    x = rng.standard_normal((30, 4))
    for scale in (1.0, 1e-3):                              # normal range: accepted, numpy's bits
        tag, a = storage_array(scale * x, "float16", "t")
        assert tag == "F16" and np.array_equal(a, (scale * x).astype(np.float16))
        assert np.linalg.norm(a - scale * x) / np.linalg.norm(scale * x) <= 2.0 ** -11
    assert storage_array(np.zeros((3, 2)), "float16", "t")[1].sum() == 0    # a zero tensor is exact
    for scale, dtype in ((1e-6, "float16"), (1e-8, "float16"), (1e-44, "float32")):
        want = np.linalg.norm((scale * x).astype(STORAGE[dtype][1]) - scale * x) / np.linalg.norm(scale * x)
        assert want > STORAGE_REL_ERROR
        with pytest.raises(StorageDtypeError, match=rf"^t: storing it as {dtype} changes it by {want:.2g} "
                                                    r".*underflow .*; write with --dtype float32$"):
            storage_array(scale * x, dtype, "t")
    assert storage_array(1e-30 * x, "bfloat16", "t")[0] == "BF16"    # bf16 has float32's range


def test_stream_writer_refuses_a_product_that_underflows(tmp_path):
    """The module's B·A error (from Grams, nothing out x in formed) is the dense one, and the
    message names the output, the module and the worse tensor."""
    from lowrank_fl.adapters.io import StorageDtypeError
    from lowrank_fl.adapters.stream import AdapterStreamWriter
    rng = np.random.default_rng(2)
    B, A = rng.standard_normal((24, 3)) * 1e-6, rng.standard_normal((3, 20)) * 0.3
    dense = np.linalg.norm(B.astype(np.float16).astype(float) @ A.astype(np.float16).astype(float) - B @ A) \
        / np.linalg.norm(B @ A)
    assert dense > 1e-2
    w = AdapterStreamWriter(tmp_path / "c1", {"r": 3, "lora_alpha": 3}, ["m"], dtype="float16", label="client 'c1'")
    with pytest.raises(StorageDtypeError, match=rf"^client 'c1', tensor 'm.lora_B.weight': .* B·A by {dense:.2g} "):
        w.add("m", B, A)
    w.abort()
    w = AdapterStreamWriter(tmp_path / "c2", {"r": 3, "lora_alpha": 3}, ["m"], dtype="float32")
    w.add("m", B, A)                                       # float32 holds them
    w.close()


@pytest.mark.parametrize("method, rule", [("fedavg", "per-module"), ("clair", "per-module")])
def test_streamed_bytes_do_not_depend_on_completion_order(src, tmp_path, monkeypatch, method, rule):
    """The workers finish modules in any order; the files written while they solve hold their
    tensors in the inputs' module order whatever that order (byte for byte, summary aside)."""
    ad = load_adapters(src)
    opts = ModuleOptions(method=method)
    refine = "paper" if method == "clair" else None
    aggregate_to_dir(ad, opts, tmp_path / "inorder", client_rule=rule, refine=refine, progress=False)
    real = run_mod.aggregate_adapters

    def reversed_arrivals(adapters, options, *, on_result=None, **kw):
        agg = real(adapters, options, **kw)          # solve everything, then deliver last-first
        for r in reversed(agg.results):
            on_result(r)
        return agg

    monkeypatch.setattr(run_mod, "aggregate_adapters", reversed_arrivals)
    aggregate_to_dir(ad, opts, tmp_path / "reversed", client_rule=rule, refine=refine, progress=False)
    files = sorted(p.relative_to(tmp_path / "inorder") for p in (tmp_path / "inorder").rglob("*.safetensors"))
    assert len(files) == (1 if method == "fedavg" else len(ad.names) + 1)     # + shared/ (split)
    for f in files:
        assert (tmp_path / "inorder" / f).read_bytes() == (tmp_path / "reversed" / f).read_bytes(), f
