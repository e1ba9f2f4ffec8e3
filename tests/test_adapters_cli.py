"""``lowrank-fl adapters``: loading, bad input, outputs, summary, backends."""
import json
import shutil
import struct

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from lowrank_fl.adapters import load_adapters
from lowrank_fl.adapters.io import AdapterError
from lowrank_fl.adapters.synthetic import write_synthetic_adapters
from lowrank_fl.cli import main

K = 5


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return write_synthetic_adapters(root, n_clients=K, n_layers=2, modules=("q_proj", "v_proj"),
                                    shape=(24, 20), rank=3, contaminated=1, dtype="float32",
                                    seed=0)


def _copy(src, tmp_path):
    dst = []
    for p in src:
        shutil.copytree(p, tmp_path / "in" / p.name)
        dst.append(tmp_path / "in" / p.name)
    return dst


def _run(args, capsys=None):
    rc = main(["adapters", *map(str, args)])
    return rc


def test_aggregate_writes_peft_dirs_and_summary(src, tmp_path, capsys):
    out = tmp_path / "out"
    assert _run(["aggregate", *src, "--out", out, "--quiet"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["method"] == "clair"
    assert s["clients"] == [p.name for p in src]
    assert len(s["modules"]) == 4
    for name, m in s["modules"].items():
        assert name.startswith("base_model.model.model.layers.")
        assert not name.endswith("weight")
        assert m["shape"] == [24, 20]
        assert m["benign"] == [True] * (K - 1) + [False]
        assert len(m["weights"]) == K * (K - 1) // 2
        assert m["rank"] == 3 and m["status"] == "optimal"
        assert m["reduced_dims"] == [15, 15]
        assert m["lam_L"] > 0 and m["lam_S"] > 0 and m["relative_gap"] <= 1e-6
    assert s["client_benign"]["majority"][src[-1].name] is False
    for p in src:
        assert (out / p.name / "adapter_config.json").is_file()
        assert (out / p.name / "adapter_model.safetensors").is_file()
    # the contaminated client keeps its own adapter exactly
    ad = load_adapters(src)
    got = load_file(str(out / src[-1].name / "adapter_model.safetensors"))
    m = ad.modules[0]
    f = ad.factors(m)
    cfg = json.loads((out / src[-1].name / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["lora_alpha"] == cfg["r"]
    dw = got[f"{m}.lora_B.weight"].astype(float) @ got[f"{m}.lora_A.weight"].astype(float)
    np.testing.assert_allclose(dw, f.delta(K - 1), rtol=1e-5, atol=1e-6)
    assert "client_00" in capsys.readouterr().out


def test_backends_identical(src, tmp_path):
    outs = {}
    for tag, extra in [("seq", []), ("joblib", ["--jobs", "2"])]:
        out = tmp_path / tag
        assert _run(["aggregate", *src, "--out", out, "--quiet", *extra]) == 0
        outs[tag] = out
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster:
        out = tmp_path / "dask"
        assert _run(["aggregate", *src, "--out", out, "--quiet", "--scheduler",
                     cluster.scheduler_address]) == 0
        outs["dask"] = out
    ref = json.loads((outs["seq"] / "summary.json").read_text())
    for tag in ("joblib", "dask"):
        s = json.loads((outs[tag] / "summary.json").read_text())
        for m in ref["modules"]:
            for key in ("benign", "lam_L", "lam_S", "relative_gap", "block_norms"):
                assert s["modules"][m][key] == ref["modules"][m][key], (tag, key)
        for p in src:
            a = load_file(str(outs["seq"] / p.name / "adapter_model.safetensors"))
            b = load_file(str(outs[tag] / p.name / "adapter_model.safetensors"))
            for key in a:
                np.testing.assert_array_equal(a[key], b[key])


@pytest.mark.parametrize("method", ["fedavg", "fedavg-factors", "flexlora"])
def test_single_output_methods_cli(src, tmp_path, method):
    out = tmp_path / "o"
    assert _run(["aggregate", *src, "--method", method, "--out", out, "--quiet"]) == 0
    assert (out / "aggregated" / "adapter_model.safetensors").is_file()
    s = json.loads((out / "summary.json").read_text())
    assert s["method"] == method and s["outputs"] == ["aggregated"]


def test_rank_out_reports_error(src, tmp_path, capsys):
    out = tmp_path / "o"
    assert _run(["aggregate", *src, "--out", out, "--quiet", "--rank-out", "2"]) == 0
    s = json.loads((out / "summary.json").read_text())
    errs = [e for d in s["rank_out_relative_error"].values() for e in d.values()]
    assert max(errs) > 0
    t = load_file(str(out / src[0].name / "adapter_model.safetensors"))
    assert all(v.shape[0] == 2 for k, v in t.items() if k.endswith("lora_A.weight"))
    assert "--rank-out 2" in capsys.readouterr().out


def test_client_rule_and_inspect_heatmap(src, tmp_path, capsys):
    out = tmp_path / "o"
    assert _run(["aggregate", *src, "--out", out, "--quiet", "--client-rule", "majority"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["client_rule"] == "majority"
    fig = tmp_path / "heat.png"
    assert _run(["inspect", *src, "--summary", out / "summary.json", "--figure", fig]) == 0
    assert fig.stat().st_size > 0
    text = capsys.readouterr().out
    assert "15x15" in text and "flagged" in text


def test_bf16_and_fp16_inputs(src, tmp_path):
    torch = pytest.importorskip("torch")     # the [peft] extra (CI installs it) writes bf16
    from safetensors.torch import save_file as save_torch

    dirs = _copy(src, tmp_path)
    t = load_file(str(dirs[0] / "adapter_model.safetensors"))
    save_torch({k: torch.from_numpy(v).to(torch.bfloat16) for k, v in t.items()},
               str(dirs[0] / "adapter_model.safetensors"))
    t1 = load_file(str(dirs[1] / "adapter_model.safetensors"))
    save_file({k: v.astype(np.float16) for k, v in t1.items()},
              str(dirs[1] / "adapter_model.safetensors"))
    ad = load_adapters(dirs)
    m = ad.modules[0]
    a = ad.clients[0].read(f"{m}.lora_A.weight")
    ref = torch.from_numpy(t[f"{m}.lora_A.weight"]).to(torch.bfloat16).double().numpy()
    np.testing.assert_array_equal(a, ref)
    np.testing.assert_array_equal(ad.clients[1].read(f"{m}.lora_A.weight"),
                                  t1[f"{m}.lora_A.weight"].astype(np.float16).astype(float))


# ------------------------------------------------------------------------------------------
# bad input: one clear line naming the file or module, exit 2, nothing written
def _corrupt(kind, dirs):
    d = dirs[1]
    w = d / "adapter_model.safetensors"
    if kind == "missing":
        w.unlink()
        return "adapter_model.safetensors"
    if kind == "peft_type":
        cfg = json.loads((d / "adapter_config.json").read_text())
        cfg["peft_type"] = "IA3"
        (d / "adapter_config.json").write_text(json.dumps(cfg))
        return "IA3"
    t = load_file(str(w))
    key = sorted(t)[0]
    if kind == "module_set":
        del t[key]
        t.pop(key.replace("lora_A", "lora_B"), None)
        save_file(t, str(w))
        return "module set differs"
    if kind == "shape":
        for k in list(t):
            if k.endswith("q_proj.lora_A.weight"):
                t[k] = np.zeros((3, 21), np.float32)
        save_file(t, str(w))
        return "shape"
    if kind == "nonfinite":
        t[key] = t[key].copy()
        t[key][0, 0] = np.nan
        save_file(t, str(w))
        return "non-finite"
    if kind == "truncated":
        raw = w.read_bytes()
        w.write_bytes(raw[: len(raw) - 100])
        return "truncated"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["missing", "peft_type", "module_set", "shape", "nonfinite",
                                  "truncated"])
def test_bad_input_exit_2_nothing_written(src, tmp_path, capsys, kind):
    dirs = _copy(src, tmp_path)
    needle = _corrupt(kind, dirs)
    out = tmp_path / "out"
    assert _run(["aggregate", *dirs, "--out", out, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lowrank-fl: error:")
    assert needle in err[0]
    if kind != "nonfinite":
        assert dirs[1].name in err[0]
    else:
        assert "lora_" in err[0]
    assert not out.exists()


def test_bad_input_other(src, tmp_path, capsys):
    out = tmp_path / "out"
    assert _run(["aggregate", src[0], "--out", out, "--quiet"]) == 2
    assert "at least 2" in capsys.readouterr().err
    assert _run(["aggregate", *src, "--out", out, "--method", "nope"]) == 2
    assert "nope" in capsys.readouterr().err
    assert not out.exists()
    out.mkdir()
    (out / "keep.txt").write_text("x")
    assert _run(["aggregate", *src, "--out", out, "--quiet"]) == 2
    assert "not empty" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    # --overwrite replaces only a previous lowrank-fl output (tests/test_output_safety.py)
    assert _run(["aggregate", *src, "--out", out, "--quiet", "--overwrite"]) == 2
    assert "does not hold a previous lowrank-fl output" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    out.joinpath("keep.txt").unlink()
    assert _run(["aggregate", *src, "--out", out, "--quiet"]) == 0
    assert _run(["aggregate", *src, "--out", out, "--quiet", "--overwrite"]) == 0
    assert (out / "summary.json").exists()
    assert _run(["aggregate", *src, "--out", tmp_path / "o2", "--lam-L", "0.1"]) == 2
    assert "lam_S" in capsys.readouterr().err


def test_load_errors_are_value_errors(src):
    with pytest.raises(AdapterError, match="at least 2"):
        load_adapters(src[:1])
    with pytest.raises(ValueError, match="not a directory"):
        load_adapters([src[0], src[0] / "nothing"])


def test_scaling_honours_patterns_and_rslora(src, tmp_path):
    dirs = _copy(src, tmp_path)
    cfg_file = dirs[0] / "adapter_config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg.update(lora_alpha=6, use_rslora=True, alpha_pattern={r"layers\.1\.self_attn\.q_proj": 9})
    cfg_file.write_text(json.dumps(cfg))
    ad = load_adapters(dirs)
    c = ad.clients[0]
    m1 = "base_model.model.model.layers.1.self_attn.q_proj"
    m0 = "base_model.model.model.layers.0.self_attn.q_proj"
    assert c.scaling(m1, 3) == pytest.approx(9 / np.sqrt(3))
    assert c.scaling(m0, 3) == pytest.approx(6 / np.sqrt(3))
    assert ad.clients[1].scaling(m0, 3) == pytest.approx(6 / 3)     # lora_alpha 2r, r = 3
    cfg.update(rank_pattern={r"layers\.1\.self_attn\.q_proj": 5})
    cfg_file.write_text(json.dumps(cfg))
    with pytest.raises(AdapterError, match="rank 3 in the weights but r = 5"):
        load_adapters(dirs)
