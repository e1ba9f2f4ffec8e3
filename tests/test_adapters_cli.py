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


def test_inspect_shows_what_the_client_rule_decided_not_only_each_modules_set(src, tmp_path, capsys):
    """The heatmap and counts show who was left out of the set the refinement used (the client
    rule's decision, ``benign_applied``), which under a client-level rule can differ from each
    module's own set of CLAIR's (8) (``benign``): here every module's own set is edited to keep everyone."""
    out = tmp_path / "o"
    assert _run(["aggregate", *src, "--out", out, "--quiet"]) == 0
    s = json.loads((out / "summary.json").read_text())
    bad = src[-1].name
    assert s["client_rule"] == "updates" and s["detection"]["flagged"] == [bad]
    for m in s["modules"].values():
        m["benign"] = [True] * K
        assert m["benign_applied"] == [True] * (K - 1) + [False]
    edited = tmp_path / "summary.json"
    edited.write_text(json.dumps(s))
    capsys.readouterr()
    assert _run(["inspect", *src, "--summary", edited]) == 0
    text = capsys.readouterr().out
    left = {p.name: 0 for p in src} | {bad: 4}
    assert ("left out of the collaborative set, modules per client (the updates rule, what the "
            f"refinement used): {left}") in text
    assert f"outside each module's own set of CLAIR's (8), modules per client: { {p.name: 0 for p in src} }" in text
    # a summary without benign_applied (older): each module's own set, with a warning
    for m in s["modules"].values():
        del m["benign_applied"]
    edited.write_text(json.dumps(s))
    assert _run(["inspect", *src, "--summary", edited]) == 0
    cap = capsys.readouterr()
    assert "records no benign_applied" in cap.err and "left out of the collaborative set" not in cap.out


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
    assert "--lam-S" in capsys.readouterr().err


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


# ------------------------------------------------------------------------------------------
# issue 17: wrong results that used to pass silently, clear messages, usability
def _one_line_error(capsys, *needles):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lowrank-fl: error:"), err
    for n in needles:
        assert n in err[0], (n, err[0])
    return err[0]


def _edit_config(d, **changes):
    f = d / "adapter_config.json"
    cfg = json.loads(f.read_text())
    cfg.update(changes)
    f.write_text(json.dumps(cfg))


def test_config_field_of_wrong_type_names_field_and_file(src, tmp_path, capsys):
    dirs = _copy(src, tmp_path)
    _edit_config(dirs[1], r="four")
    assert _run(["aggregate", *dirs, "--out", tmp_path / "o", "--quiet"]) == 2
    _one_line_error(capsys, "field 'r'", "'four'", str(dirs[1] / "adapter_config.json"))
    _edit_config(dirs[1], r=3, lora_alpha="x")
    assert _run(["aggregate", *dirs, "--out", tmp_path / "o", "--quiet"]) == 2
    _one_line_error(capsys, "lora_alpha", dirs[1].name)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("init", ["pissa", "pissa_niter_4", "olora", "corda", "loftq", "lora_ga",
                                  "bogus"])
def test_base_rewriting_init_refused(src, tmp_path, capsys, init):
    dirs = _copy(src, tmp_path)
    _edit_config(dirs[2], init_lora_weights=init)
    assert _run(["aggregate", *dirs, "--out", tmp_path / "o", "--quiet"]) == 2
    line = _one_line_error(capsys, f"init_lora_weights={init!r}", dirs[2].name)
    if init != "bogus":
        assert "rewrites the base weight" in line


@pytest.mark.parametrize("init", [True, False, "gaussian", "orthogonal", "eva", "mica"])
def test_plain_inits_accepted(src, tmp_path, init):
    dirs = _copy(src, tmp_path)
    _edit_config(dirs[2], init_lora_weights=init)
    assert len(load_adapters(dirs).clients) == K


@pytest.mark.parametrize("key,value", [("use_qalora", True), ("alora_invocation_tokens", [1, 2]),
                                       ("use_dora", True)])
def test_lora_variants_refused(src, tmp_path, capsys, key, value):
    dirs = _copy(src, tmp_path)
    _edit_config(dirs[0], **{key: value})
    assert _run(["aggregate", *dirs, "--out", tmp_path / "o", "--quiet"]) == 2
    _one_line_error(capsys, key, dirs[0].name)


def _zero_B(d, modules=None):
    w = d / "adapter_model.safetensors"
    t = load_file(str(w))
    for k in t:
        if "lora_B" in k and (modules is None or any(m in k for m in modules)):
            t[k] = np.zeros_like(t[k])
    save_file(t, str(w))


def test_a_module_nobody_trained_is_aggregated_as_zero_and_named(src, tmp_path, capsys):
    # every client's lora_B of one module is PEFT's initial zeros: the mean of zero updates is zero
    # (it used to end the run, and a Flower federation with it)
    dirs = _copy(src, tmp_path)
    for d in dirs:
        _zero_B(d, ["layers.1.self_attn.v_proj"])
    mod = "base_model.model.model.layers.1.self_attn.v_proj"
    for method in ("clair", "fedavg"):
        out = tmp_path / method
        capsys.readouterr()
        assert _run(["aggregate", *dirs, "--out", out, "--quiet", "--method", method, "--output", "merged"]
                    if method == "clair" else ["aggregate", *dirs, "--out", out, "--quiet", "--method", method]) == 0
        err = capsys.readouterr().err
        assert (f"warning: 1 module(s) where every client's update is zero (nobody trained them): their "
                f"outputs are zero: {mod}") in err
        s = json.loads((out / "summary.json").read_text())
        assert s["modules"][mod]["zero_updates"] == list(range(len(dirs)))
        for o in s["outputs"]:
            t = load_file(str(out / o / "adapter_model.safetensors"))
            assert not np.any(t[f"{mod}.lora_B.weight"] @ t[f"{mod}.lora_A.weight"])
            other = "base_model.model.model.layers.0.self_attn.q_proj"
            assert np.any(t[f"{other}.lora_B.weight"] @ t[f"{other}.lora_A.weight"])
    assert _run(["inspect", *dirs]) == 0


def test_one_untrained_client_warns(src, tmp_path, capsys):
    dirs = _copy(src, tmp_path)
    _zero_B(dirs[0])
    out = tmp_path / "o"
    assert _run(["aggregate", *dirs, "--out", out, "--quiet", "--method", "fedavg"]) == 0
    err = capsys.readouterr().err
    assert f"warning: {dirs[0].name}: lora_B (or lora_A) is all zeros in every module" in err
    s = json.loads((out / "summary.json").read_text())
    assert all(m["zero_updates"] == [0] for m in s["modules"].values())


def test_impossible_rank_is_an_error_boundary_accepted(src, tmp_path, capsys):
    # modules are 24 x 20: rank 20 = min(out, in) is the largest possible
    assert _run(["aggregate", *src, "--out", tmp_path / "o", "--quiet", "--rank", "21"]) == 2
    _one_line_error(capsys, "rank = 21", "min(out, in) = 20", "base_model.model.model.layers.")
    assert _run(["aggregate", *src, "--out", tmp_path / "o", "--quiet", "--rank-out", "21"]) == 2
    _one_line_error(capsys, "rank_out = 21")
    assert not (tmp_path / "o").exists()
    out = tmp_path / "o20"
    assert _run(["aggregate", *src, "--out", out, "--quiet", "--rank", "20"]) == 0
    s = json.loads((out / "summary.json").read_text())
    # P_A = I on the joint row space: every contrast lies in it, nothing is detected and every
    # client is kept (it used to exclude every client: rounding-level norms above τ = 0)
    for m in s["modules"].values():
        assert m["separated"] is False and m["benign"] == [True] * K
        assert max(m["block_norms"]) <= 1e-9 * 1e3


def test_client_rank_above_module_dims_is_an_error(tmp_path, capsys):
    rng = np.random.default_rng(0)
    key = "base_model.model.model.layers.0.self_attn.q_proj"
    dirs = []
    for k, r in enumerate([48, 48, 49]):               # module 64 x 48: r = 48 possible, 49 not
        d = tmp_path / f"c{k}"
        d.mkdir()
        save_file({f"{key}.lora_A.weight": rng.standard_normal((r, 48)).astype(np.float32),
                   f"{key}.lora_B.weight": rng.standard_normal((64, r)).astype(np.float32)},
                  str(d / "adapter_model.safetensors"))
        (d / "adapter_config.json").write_text(json.dumps(
            {"peft_type": "LORA", "r": r, "lora_alpha": r, "target_modules": ["q_proj"]}))
        dirs.append(d)
    assert len(load_adapters(dirs[:2]).modules) == 1
    assert _run(["aggregate", *dirs, "--out", tmp_path / "o", "--quiet"]) == 2
    _one_line_error(capsys, "c2", "q_proj", "rank 49", "64 x 48", "min(out, in) = 48")


def test_summary_of_another_run_or_not_json(src, tmp_path, capsys):
    out = tmp_path / "o"
    assert _run(["aggregate", *src[:3], "--out", out, "--quiet"]) == 0
    capsys.readouterr()
    assert _run(["inspect", *src, "--summary", out / "summary.json"]) == 2
    _one_line_error(capsys, "written for 3 clients", "5 clients")
    assert _run(["inspect", *src[:3], "--names", "a,b,c", "--summary", out / "summary.json"]) == 2
    _one_line_error(capsys, "['a', 'b', 'c']")
    bad = tmp_path / "bad.json"
    bad.write_text("not json {")
    assert _run(["inspect", *src, "--summary", bad]) == 2
    _one_line_error(capsys, "not JSON", "bad.json")
    bad.write_text("[1, 2]")
    assert _run(["inspect", *src, "--summary", bad]) == 2
    _one_line_error(capsys, "not an aggregate's summary.json")
    assert _run(["inspect", *src[:3], "--summary", out / "summary.json"]) == 0     # the right one
    s = json.loads((out / "summary.json").read_text())
    dropped = sorted(s["modules"])[0]
    del s["modules"][dropped]
    bad.write_text(json.dumps(s))
    assert _run(["inspect", *src[:3], "--summary", bad]) == 2
    _one_line_error(capsys, "modules differ", "3 vs 4", dropped)
    assert _run(["inspect", *src[:3], "--summary", tmp_path / "nope.json"]) == 2
    _one_line_error(capsys, "--summary", "nope.json: no such file")


def test_inspect_names_a_missing_folder_and_a_figure_format_before_any_work(src, tmp_path, capsys):
    assert _run(["inspect", tmp_path / "nope"]) == 2
    _one_line_error(capsys, "need at least 2 client adapter directories, got 1", "nope: no such directory")
    out = tmp_path / "o"
    assert _run(["aggregate", *src[:3], "--out", out, "--quiet"]) == 0
    capsys.readouterr()
    for fig, what in ((tmp_path / "heat.xyz", "'xyz' is not a figure format"), (tmp_path / "heat", "no suffix")):
        assert _run(["inspect", *src[:3], "--summary", out / "summary.json", "--figure", fig]) == 2
        err = capsys.readouterr()
        assert err.out == ""                                      # refused before the table is printed
        assert what in err.err and ".png" in err.err and len(err.err.strip().splitlines()) == 1
        assert not fig.exists()


def test_different_base_models_warn(src, tmp_path, capsys):
    from lowrank_fl.adapters.io import AdapterWarning

    dirs = _copy(src, tmp_path)
    _edit_config(dirs[3], base_model_name_or_path="meta-llama/Llama-2-7b-hf")
    with pytest.warns(AdapterWarning, match="different base models.*Llama-2-7b-hf.*" + dirs[3].name):
        load_adapters(dirs)
    assert _run(["aggregate", *dirs, "--out", tmp_path / "o", "--quiet"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert [x for x in err if "different base models" in x][0].startswith("warning:")


def test_an_error_during_the_solves_ends_the_progress_bar_first(src, tmp_path, capsys, monkeypatch):
    """Without --quiet the progress bar is on stderr: an error must be the last line there, not
    followed by the bar's redraw (a module whose reduction fails, in process: --jobs 1)."""
    from lowrank_fl.adapters import aggregate as agg_mod
    from lowrank_fl.adapters.io import AdapterError

    real = agg_mod.reduce_module

    def failing(f, **kw):
        if f.name.endswith("layers.1.self_attn.v_proj"):
            raise AdapterError(f"module {f.name!r}: broken on purpose")
        return real(f, **kw)

    monkeypatch.setattr(agg_mod, "reduce_module", failing)
    capsys.readouterr()
    assert _run(["aggregate", *src, "--out", tmp_path / "o", "--jobs", "1"]) == 2
    err = capsys.readouterr().err.rstrip().splitlines()
    assert err[-1].startswith("lowrank-fl: error:") and "broken on purpose" in err[-1], err[-3:]
    assert any("modules" in x for x in err[:-1])                   # the bar was there, before it


def test_a_client_copied_under_another_path_warns(src, tmp_path, capsys):
    """Byte-identical adapter directories (a copy, not a link: paths differ) are named in a
    warning; distinct clients and a one-byte difference are not."""
    import warnings

    from lowrank_fl.adapters.io import AdapterWarning, identical_dirs

    dirs = _copy(src, tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AdapterWarning)             # distinct clients: no warning
        load_adapters(dirs)
    copy = tmp_path / "elsewhere" / "copy0"
    shutil.copytree(dirs[0], copy)
    names = [d.name for d in dirs] + ["copy0"]
    assert identical_dirs([*dirs, copy], names) == [[dirs[0].name, "copy0"]]
    with pytest.warns(AdapterWarning, match=f"byte-identical adapters.*{dirs[0].name} = copy0.*counts twice"):
        load_adapters([*dirs, copy])
    assert _run(["aggregate", *dirs, copy, "--out", tmp_path / "o", "--quiet"]) == 0
    err = [x for x in capsys.readouterr().err.splitlines() if "byte-identical" in x]
    assert len(err) == 1 and err[0].startswith("warning:") and "copy0" in err[0]
    # the same tensors with one config value changed are not identical
    _edit_config(copy, lora_dropout=0.05)
    assert identical_dirs([*dirs, copy], names) == []


def test_scheduler_without_dask_is_one_line(src, tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "distributed", None)      # import fails as if not installed
    assert _run(["aggregate", *src, "--out", tmp_path / "o", "--quiet", "--scheduler",
                 "tcp://127.0.0.1:1"]) == 2
    _one_line_error(capsys, "--scheduler", "dask extra")


def test_adapter_model_bin_says_safe_serialization(src, tmp_path, capsys):
    dirs = _copy(src, tmp_path)
    w = dirs[1] / "adapter_model.safetensors"
    w.rename(dirs[1] / "adapter_model.bin")
    assert _run(["aggregate", *dirs, "--out", tmp_path / "o", "--quiet"]) == 2
    _one_line_error(capsys, "adapter_model.bin", "safe_serialization=True", dirs[1].name)


def test_embedding_lora_refused(src, tmp_path, capsys):
    dirs = _copy(src, tmp_path)
    w = dirs[0] / "adapter_model.safetensors"
    t = load_file(str(w))
    t["base_model.model.model.embed_tokens.lora_embedding_A"] = np.ones((3, 10), np.float32)
    t["base_model.model.model.embed_tokens.lora_embedding_B"] = np.ones((8, 3), np.float32)
    save_file(t, str(w))
    assert _run(["aggregate", *dirs, "--out", tmp_path / "o", "--quiet"]) == 2
    _one_line_error(capsys, "embedding LoRA", "not supported", "save_embedding_layers")
    t = {k: v for k, v in t.items() if "lora_embedding" not in k}
    t["base_model.model.model.embed_tokens.base_layer.weight"] = np.ones((8, 10), np.float32)
    save_file(t, str(w))
    assert _run(["aggregate", *dirs, "--out", tmp_path / "o", "--quiet"]) == 2
    _one_line_error(capsys, "full base-model weight", "save_embedding_layers=False")


def test_out_that_cannot_be_created_names_out(src, tmp_path, capsys):
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("/proc is Linux's")
    assert _run(["aggregate", *src, "--out", "/proc/x", "--quiet"]) == 2
    _one_line_error(capsys, "--out /proc/x")


def test_names_default_unique_for_site_layout_and_override(src, tmp_path, capsys):
    dirs = []
    for k, p in enumerate(src[:3]):
        shutil.copytree(p, tmp_path / f"site{k}" / "adapter")
        dirs.append(tmp_path / f"site{k}" / "adapter")
    out = tmp_path / "o"
    assert _run(["aggregate", *dirs, "--out", out, "--quiet"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["clients"] == ["site0_adapter", "site1_adapter", "site2_adapter"]
    # the split layout (default): each client's part and the shared adapter
    assert sorted(p.name for p in out.iterdir()) == sorted(s["clients"] + ["shared", "summary.json", ".lowrank-fl-output"])
    out2 = tmp_path / "o2"
    assert _run(["aggregate", *dirs, "--out", out2, "--quiet", "--names", "a,b,c"]) == 0
    assert json.loads((out2 / "summary.json").read_text())["clients"] == ["a", "b", "c"]
    assert (out2 / "b" / "adapter_model.safetensors").is_file()
    # the same inputs under other names give the same tensors
    for old, new in [("site0_adapter", "a"), ("site2_adapter", "c")]:
        x, y = (load_file(str(o / n / "adapter_model.safetensors"))
                for o, n in [(out, old), (out2, new)])
        assert all(np.array_equal(x[k], y[k]) for k in x)
    capsys.readouterr()
    for names, needle in [("a,b", "got 2 names for 3"), ("a,a,b", "'a' is given twice"),
                          ("a,../x,b", "'../x'"), ("a,summary.json,b", "summary.json"),
                          ("A,b,a", "'A' and 'a' differ only in case")]:
        assert _run(["aggregate", *dirs, "--out", tmp_path / "o3", "--names", names]) == 2
        _one_line_error(capsys, "names", needle)
    assert _run(["aggregate", dirs[0], dirs[1], dirs[0], "--out", tmp_path / "o3"]) == 2
    _one_line_error(capsys, "given twice")
    assert not (tmp_path / "o3").exists()


def test_quiet_silences_per_client_lines_and_size_is_printed(src, tmp_path, capsys):
    out = tmp_path / "o"
    assert _run(["aggregate", *src, "--out", out, "--quiet"]) == 0
    text = capsys.readouterr().out
    assert not any(p.name + ":" in text for p in src)
    lines = text.strip().splitlines()
    # the result line, the output size, the detection and refinement sentences (kept by --quiet)
    assert len(lines) == 4 and lines[1].startswith("  output:")
    assert "client_04" in lines[2] and "flagged" in lines[2]
    assert lines[3].startswith("refinement (exchangeable")
    n_in = sum((p / f).stat().st_size for p in src
               for f in ("adapter_model.safetensors", "adapter_config.json"))
    # the split layout (default): each client's part and the shared adapter
    n_out = sum((out / name / f).stat().st_size for name in [p.name for p in src] + ["shared"]
                for f in ("adapter_model.safetensors", "adapter_config.json"))
    assert f"{n_out / 1000:.1f} kB in {K + 1} adapter(s), {n_out / n_in:.1f}x the inputs' " \
           f"{n_in / 1000:.1f} kB; dtype float32 (the inputs' F32)" in lines[1]
    assert _run(["aggregate", *src, "--out", tmp_path / "o2"]) == 0
    text = capsys.readouterr().out
    assert all(p.name + ": benign in" in text for p in src)


def test_client_rule_any_explained_in_help(capsys):
    with pytest.raises(SystemExit):
        main(["adapters", "aggregate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "'any' excludes a client from every module as soon as one module flags it" in text
    assert "'majority' keeps a client in every module iff it is benign in at least half" in text


def _dtypes(d):
    with open(d / "adapter_model.safetensors", "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        header = json.loads(fh.read(n))
    return {v["dtype"] for k, v in header.items() if k != "__metadata__"}


def test_output_dtype_defaults_to_inputs(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file as save_torch

    fp16 = write_synthetic_adapters(tmp_path / "h", n_clients=3, n_layers=1, modules=("q_proj",),
                                    shape=(24, 20), rank=3, contaminated=1, dtype="float16", seed=1)
    out = tmp_path / "oh"
    assert _run(["aggregate", *fp16, "--out", out, "--quiet"]) == 0
    assert "dtype float16 (the inputs' F16)" in capsys.readouterr().out
    assert all(_dtypes(out / p.name) == {"F16"} for p in fp16)
    bf = _copy(fp16, tmp_path / "b")
    for d in bf:
        t = load_file(str(d / "adapter_model.safetensors"))
        save_torch({k: torch.from_numpy(v.astype(np.float32)).to(torch.bfloat16)
                    for k, v in t.items()}, str(d / "adapter_model.safetensors"))
    out = tmp_path / "ob"
    assert _run(["aggregate", *bf, "--out", out, "--quiet", "--method", "fedavg"]) == 0
    assert "dtype bfloat16 (the inputs' BF16)" in capsys.readouterr().out
    assert _dtypes(out / "aggregated") == {"BF16"}
    # the stored bf16 values are torch's round-to-nearest-even of the float32 result
    ref = tmp_path / "of"
    assert _run(["aggregate", *bf, "--out", ref, "--quiet", "--method", "fedavg", "--dtype",
                 "float32"]) == 0
    from safetensors.torch import load_file as load_torch

    got = load_torch(str(out / "aggregated" / "adapter_model.safetensors"))
    want = load_torch(str(ref / "aggregated" / "adapter_model.safetensors"))
    for k in want:
        assert got[k].dtype == torch.bfloat16
        assert torch.equal(got[k], want[k].to(torch.bfloat16)), k
    # mixed inputs: float32 (neither half type holds the other)
    mixed = [fp16[0], bf[1], bf[2]]
    out = tmp_path / "om"
    assert _run(["aggregate", *mixed, "--out", out, "--quiet", "--names", "x,y,z"]) == 0
    assert "dtype float32 (the inputs hold BF16, F16)" in capsys.readouterr().out
    assert _dtypes(out / "x") == {"F32"}


def test_float16_overflow_is_an_error_not_inf(tmp_path, capsys):
    # b_scale 1e4: ΔW entries ~1e4..1e5, the refined factors exceed float16's 65504
    dirs = write_synthetic_adapters(tmp_path / "in", n_clients=3, n_layers=1, modules=("q_proj",),
                                    shape=(24, 20), rank=3, contaminated=0, b_scale=3e5,
                                    dtype="float32", seed=2)
    out = tmp_path / "o"
    assert _run(["aggregate", *dirs, "--out", out, "--quiet", "--dtype", "float16"]) == 2
    _one_line_error(capsys, "q_proj", "do not fit float16", "inf", "--dtype")
    assert not out.exists()
    assert _run(["aggregate", *dirs, "--out", out, "--quiet", "--dtype", "float32"]) == 0
    t = load_file(str(out / dirs[0].name / "adapter_model.safetensors"))
    assert max(float(np.abs(v).max()) for v in t.values()) > 65504       # so float16 was wrong


def test_summary_of_other_adapters_with_the_same_names_is_refused(src, tmp_path, capsys):
    """Same client and module names, other weights: the summary's input sha256 tells them apart."""
    out = tmp_path / "o"
    assert _run(["aggregate", *src[:3], "--out", out, "--quiet"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert sorted(s["input_sha256"]) == sorted(s["clients"])
    assert all(v.startswith("sha256:") and len(v) == 71 for v in s["input_sha256"].values())
    other = write_synthetic_adapters(tmp_path / "other", n_clients=3, n_layers=2,
                                     modules=("q_proj", "v_proj"), shape=(24, 20), rank=3,
                                     contaminated=1, dtype="float32", seed=1)
    assert [p.name for p in other] == [p.name for p in src[:3]]
    capsys.readouterr()
    assert _run(["inspect", *other, "--summary", out / "summary.json"]) == 2
    _one_line_error(capsys, f"client {other[0].name!r}", "not the adapter this summary was written for")
    # only the config differs (one byte of lora_alpha): refused too, naming that client
    moved = _copy(src[:3], tmp_path)
    cfg = json.loads((moved[1] / "adapter_config.json").read_text())
    (moved[1] / "adapter_config.json").write_text(json.dumps(dict(cfg, lora_alpha=cfg["lora_alpha"] + 1)))
    assert _run(["inspect", *moved, "--summary", out / "summary.json"]) == 2
    _one_line_error(capsys, f"client {moved[1].name!r}")
    # copies of the same files elsewhere are the same inputs
    same = _copy(src[:3], tmp_path / "same")
    assert _run(["inspect", *same, "--summary", out / "summary.json"]) == 0
    assert "warning" not in capsys.readouterr().err
    # an older summary without fingerprints: accepted with a warning that it cannot be checked
    del s["input_sha256"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(s))
    assert _run(["inspect", *other, "--summary", old]) == 0
    err = capsys.readouterr().err
    assert "records no input fingerprints" in err and "cannot check" in err and len(err.splitlines()) == 1


def test_float16_underflow_is_an_error_and_auto_falls_back_to_float32(tmp_path, capsys):
    # b_scale 1e-6: the refined factors hold values in float16's subnormal range (B·A off by > 1 %)
    kw = dict(n_clients=3, n_layers=2, modules=("q_proj",), shape=(24, 20), rank=3, contaminated=0,
              b_scale=1e-6, seed=2)
    dirs = write_synthetic_adapters(tmp_path / "in", dtype="float16", **kw)
    out = tmp_path / "o"
    # the merged layout's refined factors (the split layout keeps the inputs' own values)
    assert _run(["aggregate", *dirs, "--out", out, "--quiet", "--dtype", "float16", "--jobs", "2",
                 "--output", "merged"]) == 2
    _one_line_error(capsys, "client 'client_", "q_proj.lora_", "underflow float16", "above 0.01",
                    "--dtype float32")
    assert not out.exists()
    # auto (the inputs are float16): float32 instead, one note line, the --dtype float32 bytes
    assert _run(["aggregate", *dirs, "--out", out, "--quiet", "--output", "merged"]) == 0
    cap = capsys.readouterr()
    assert cap.err.count("\n") == 1 and cap.err.startswith("note: client '") and "writes float32" in cap.err
    assert "dtype float32 (the inputs' float16 cannot hold them)" in cap.out
    ref = tmp_path / "ref"
    assert _run(["aggregate", *dirs, "--out", ref, "--quiet", "--dtype", "float32",
                 "--output", "merged"]) == 0
    for d in dirs:
        assert _dtypes(out / d.name) == {"F32"}
        got, want = (load_file(str(o / d.name / "adapter_model.safetensors")) for o in (out, ref))
        assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in got)


def test_overflow_error_is_one_line_with_workers(tmp_path, capsys):
    # two modules on two workers: the cancelled task must not add joblib's warning
    dirs = write_synthetic_adapters(tmp_path / "in", n_clients=3, n_layers=2, modules=("q_proj",),
                                    shape=(24, 20), rank=3, contaminated=0, b_scale=3e5,
                                    dtype="float32", seed=2)
    assert _run(["aggregate", *dirs, "--out", tmp_path / "o", "--quiet", "--dtype", "float16",
                 "--jobs", "2"]) == 2
    _one_line_error(capsys, "client 'client_0", "do not fit float16", "--dtype float32")


def test_default_names_prefix_only_the_colliding_names(tmp_path):
    from lowrank_fl.adapters.io import default_names
    paths = [tmp_path / "w" / "s1" / "adapter", tmp_path / "w" / "s2" / "adapter",
             tmp_path / "w" / "ad" / "client_03", tmp_path / "x" / "s1" / "Adapter"]
    assert default_names(paths[:3]) == ["s1_adapter", "s2_adapter", "client_03"]
    # equal up to case collide; the minimal distinct suffixes are w_s1_adapter / x_s1_Adapter
    assert default_names(paths) == ["w_s1_adapter", "s2_adapter", "client_03", "x_s1_Adapter"]


def test_rank_errors_name_the_option_and_summary_lists_end_with_an_ellipsis(src, tmp_path, capsys):
    for flag in ("--rank", "--rank-out"):
        assert _run(["aggregate", *src, "--out", tmp_path / "o", flag, "0"]) == 2
        _one_line_error(capsys, f"{flag} must be an integer >= 1, got 0")
    assert not (tmp_path / "o").exists()
    fake = tmp_path / "summary.json"
    fake.write_text(json.dumps({"method": "clair", "clients": [f"c{k}" for k in range(8)], "modules": {}}))
    assert _run(["inspect", *src, "--summary", fake]) == 2
    _one_line_error(capsys, "written for 8 clients ['c0', 'c1', 'c2', 'c3', 'c4', ...], but",
                    f"{K} clients {[p.name for p in src]};")


def test_a_client_untrained_in_some_modules_warns_and_is_named(src, tmp_path, capsys):
    dirs = _copy(src, tmp_path)
    _zero_B(dirs[1], ["layers.1.self_attn.v_proj"])
    out = tmp_path / "o"
    assert _run(["aggregate", *dirs, "--out", out]) == 0
    captured = capsys.readouterr()
    s = json.loads((out / "summary.json").read_text())
    n_mod = len(s["modules"])
    assert f"warning: {dirs[1].name} (1 of {n_mod}): the update is all zeros in some modules" in captured.err
    zero = s["detection"]["updates"]["zero_modules"]
    assert zero == {d.name: (1 if d == dirs[1] else 0) for d in dirs}
    # spread unlike the others (the profile flags it), and the sentence says why in plain words
    assert s["detection"]["updates"]["by_profile"] == [dirs[1].name]
    assert "all zeros in 1 module(s)" in captured.out


@pytest.mark.parametrize("extra, needles", [
    (["--lam-L", "0.1"], ["give both --lam-L and --lam-S"]),
    (["--alpha", "1"], ["--alpha must lie in [0.5, 1.0), got 1.0"]),
    (["--tol", "-1"], ["--tol must be finite and > 0"]),
    (["--method", "krum", "--byzantine", "-1"], ["--byzantine must be an integer f with 0 <= f and 2 f < K"]),
    (["--method", "trimmed-mean", "--byzantine", str((K + 1) // 2)], [f"2 f < K = {K} clients, got {(K + 1) // 2}"]),
    (["--names", ",".join(["a"] * K)], ["--names: 'a' is given twice"]),
    (["--jobs", "2", "--scheduler", "tcp://127.0.0.1:1"], ["--jobs and --scheduler are alternatives"]),
])
def test_option_errors_name_the_flag(src, tmp_path, capsys, extra, needles):
    """The options' checks live in ModuleOptions and load_adapters, whose messages name Python fields:
    the command names the flag the user typed, in one line, and writes nothing."""
    assert _run(["aggregate", *src, "--out", tmp_path / "o", "--quiet", *extra]) == 2
    line = _one_line_error(capsys, *needles)
    assert "lam_L" not in line and "byzantine (f)" not in line
    assert not (tmp_path / "o").exists()


def test_options_the_method_does_not_read_are_warned_about(src, tmp_path, capsys):
    """Each option given that --method does not read is one warning line; the output is the one
    without them (fedavg reads none of CLAIR's options; clair does not read --byzantine)."""
    assert _run(["aggregate", *src, "--out", tmp_path / "a", "--quiet", "--method", "fedavg", "--lam-L", "1",
                 "--lam-S", "1", "--alpha", "0.7", "--tol", "1e-3", "--rank", "2", "--byzantine", "1"]) == 0
    err = [x for x in capsys.readouterr().err.splitlines() if "is ignored" in x]
    assert err == [f"warning: {flag} {v} is ignored: --method fedavg does not read it (only {only})"
                   for flag, v, only in (("--lam-L", "1", "clair does"), ("--lam-S", "1", "clair does"),
                                         ("--alpha", "0.7", "clair does"), ("--tol", "0.001", "clair does"),
                                         ("--rank", "2", "clair, flexlora do"),
                                         ("--byzantine", "1", "krum, multikrum, trimmed-mean do"))]
    # ignored means not checked either: values fedavg would never use do not fail the run
    assert _run(["aggregate", *src, "--out", tmp_path / "c", "--quiet", "--method", "fedavg", "--rank", "99",
                 "--alpha", "2", "--lam-L", "0.1"]) == 0
    assert capsys.readouterr().err.count("is ignored") == 3
    assert _run(["aggregate", *src, "--out", tmp_path / "b", "--quiet", "--method", "fedavg"]) == 0
    assert "is ignored" not in capsys.readouterr().err
    assert (tmp_path / "a" / "aggregated" / "adapter_config.json").read_bytes() == \
        (tmp_path / "b" / "aggregated" / "adapter_config.json").read_bytes()
    a, b = (load_file(str(tmp_path / d / "aggregated" / "adapter_model.safetensors")) for d in "ab")
    assert a.keys() == b.keys()                 # the tensors' order in the file follows the modules' completion
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])


def test_api_dtype_auto_is_the_commands_default(tmp_path):
    """``aggregate_to_dir(dtype="auto")`` stores the outputs in the inputs' shared dtype, as the command's
    default does (float16 here: the files hold F16 tensors); the API's default stays float32."""
    from lowrank_fl.adapters import ModuleOptions
    from lowrank_fl.adapters.run import aggregate_to_dir
    dirs = write_synthetic_adapters(tmp_path / "in", n_clients=4, n_layers=1, modules=("q_proj",), shape=(12, 10),
                                    rank=2, contaminated=0, dtype="float16", seed=3)
    ad = load_adapters(dirs)
    for dtype, want, tag in (("auto", "float16", "F16"), ("float32", "float32", "F32")):
        _, summary = aggregate_to_dir(ad, ModuleOptions(method="fedavg"), tmp_path / dtype, dtype=dtype, progress=False)
        assert summary["dtype"] == want
        raw = (tmp_path / dtype / "aggregated" / "adapter_model.safetensors").read_bytes()
        header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
        assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {tag}
    assert main(["adapters", "aggregate", *map(str, dirs), "--method", "fedavg", "--out", str(tmp_path / "cli"),
                 "--quiet"]) == 0
    assert json.loads((tmp_path / "cli" / "summary.json").read_text())["dtype"] == "float16"


def test_inspect_refuses_a_summary_directory_and_an_empty_figure_naming_them(src, tmp_path, capsys):
    out = tmp_path / "agg"
    assert _run(["aggregate", *src, "--out", out, "--quiet"]) == 0
    capsys.readouterr()
    assert _run(["inspect", *src, "--summary", out]) == 2
    _one_line_error(capsys, f"--summary {out} is a directory", str(out / "summary.json"))
    with pytest.raises(SystemExit) as exc:              # argparse's own type error: usage, then one error line
        _run(["inspect", *src, "--summary", out / "summary.json", "--figure", ""])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith("argument --figure: must name a file, got ''")


def test_inspect_shows_a_module_nobody_trained_as_empty(tmp_path, capsys):
    """A module whose every update is zero spans nothing: 0x0 and said, not the reduction's 1-D
    placeholder; a trained module beside it keeps its reduced size (4 clients of rank 3: 12x12)."""
    paths = write_synthetic_adapters(tmp_path / "in", n_clients=4, n_layers=1, modules=("q_proj", "v_proj"),
                                     shape=(32, 24), rank=3, contaminated=1, seed=0)
    for p in paths:
        f = p / "adapter_model.safetensors"
        t = load_file(f)
        save_file({k: (0 * v if "v_proj.lora_B" in k else v) for k, v in t.items()}, f)
    assert _run(["inspect", *paths]) == 0
    lines = capsys.readouterr().out.splitlines()
    v = next(ln for ln in lines if "v_proj" in ln)
    q = next(ln for ln in lines if "q_proj" in ln)
    assert v.split()[5] == "0x0" and v.endswith("(every update is zero)")
    assert q.split()[5] == "12x12" and "zero" not in q
    # the aggregate's summary says the same
    assert _run(["aggregate", *paths, "--out", tmp_path / "o", "--quiet"]) == 0
    dims = {m.rsplit(".", 1)[-1]: d["reduced_dims"]
            for m, d in json.loads((tmp_path / "o" / "summary.json").read_text())["modules"].items()}
    assert dims == {"q_proj": [12, 12], "v_proj": [0, 0]}


def test_a_large_federation_lists_its_outputs_in_one_short_line(tmp_path, capsys):
    paths = write_synthetic_adapters(tmp_path / "in", n_clients=12, n_layers=1, modules=("q_proj",),
                                     shape=(16, 12), rank=2, contaminated=1, seed=0)
    assert _run(["aggregate", *paths, "--out", tmp_path / "o", "--quiet"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert (f"wrote 13 adapters (client_00, client_01, client_02, ..., client_11, shared) and summary.json "
            f"to {tmp_path / 'o'}") in first
    # ten or fewer are named in full
    assert _run(["aggregate", *paths[:4], "--out", tmp_path / "o4", "--quiet"]) == 0
    assert "wrote client_00, client_01, client_02, client_03" in capsys.readouterr().out


def test_small_inputs_are_aggregated_in_this_process_by_default(src, tmp_path, monkeypatch):
    """Below IN_PROCESS_BYTES of inputs the default --jobs starts no workers (their start-up costs
    more than the work); an explicit --jobs, or inputs above the threshold, keep the workers."""
    from lowrank_fl.adapters import cli as adapters_cli
    from lowrank_fl.adapters import run as run_mod

    seen = []
    real = run_mod.aggregate_to_dir

    def spy(*a, **kw):
        seen.append(kw["jobs"])
        return real(*a, **{**kw, "jobs": 1})           # keep the test in this process

    monkeypatch.setattr(run_mod, "aggregate_to_dir", spy)
    assert _run(["aggregate", *src, "--out", tmp_path / "a", "--quiet"]) == 0
    assert _run(["aggregate", *src, "--out", tmp_path / "b", "--quiet", "--jobs", "2"]) == 0
    monkeypatch.setattr(adapters_cli, "IN_PROCESS_BYTES", 1)
    assert _run(["aggregate", *src, "--out", tmp_path / "c", "--quiet"]) == 0
    assert seen == [1, 2, None]
