"""``lowrank-fl adapters synthetic``: a federation to try the other commands on, written like every
output of the command line (staged, never over a folder lowrank-fl did not write)."""
import json

import numpy as np
import pytest
from safetensors.numpy import load_file

from lowrank_fl.adapters import load_adapters
from lowrank_fl.adapters.synthetic import write_synthetic_adapters
from lowrank_fl.cli import main
from lowrank_fl.outdir import MARKER


def test_it_writes_the_library_generators_federation_and_the_truth(tmp_path, capsys):
    out = tmp_path / "fed"
    assert main(["adapters", "synthetic", "--out", str(out), "--clients", "6", "--contaminated", "2",
                 "--shape", "24x20", "--rank", "3", "--seed", "5"]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"wrote 6 client adapters (client_00 ... client_05; client_04, client_05 contaminated "
                           f"(an unrelated A)) and truth.json to {out}\n")
    truth = json.loads((out / "truth.json").read_text())
    assert truth["contaminated"] == ["client_04", "client_05"] and truth["clients"][0] == "client_00"
    assert (out / MARKER).is_file()
    # the very tensors of write_synthetic_adapters with the same arguments (an independent call)
    ref = write_synthetic_adapters(tmp_path / "ref", n_clients=6, contaminated=2, n_layers=2,
                                   modules=("q_proj", "v_proj"), shape=(24, 20), rank=3, seed=5)
    for d in ref:
        a = load_file(str(d / "adapter_model.safetensors"))
        b = load_file(str(out / d.name / "adapter_model.safetensors"))
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    ad = load_adapters(sorted(out.glob("client_*")))
    assert ad.n_clients == 6 and len(ad.modules) == 4 and ad.shapes[ad.modules[0]] == (24, 20)
    # and the next command it suggests flags exactly the contaminated clients
    assert main(["adapters", "aggregate", *map(str, sorted(out.glob("client_*"))), "--out", str(tmp_path / "agg"),
                 "--quiet"]) == 0
    summary = json.loads((tmp_path / "agg" / "summary.json").read_text())
    assert summary["detection"]["flagged"] == truth["contaminated"]


def test_it_replaces_only_its_own_output_and_names_options_in_errors(tmp_path, capsys):
    out = tmp_path / "fed"
    assert main(["adapters", "synthetic", "--out", str(out), "--clients", "4"]) == 0
    first = (out / "client_00" / "adapter_model.safetensors").read_bytes()
    assert main(["adapters", "synthetic", "--out", str(out), "--clients", "3"]) == 2
    assert "--out" in capsys.readouterr().err and len(list(out.glob("client_*"))) == 4
    assert main(["adapters", "synthetic", "--out", str(out), "--clients", "3", "--seed", "1", "--overwrite"]) == 0
    assert len(list(out.glob("client_*"))) == 3
    assert (out / "client_00" / "adapter_model.safetensors").read_bytes() != first
    # a folder of the user's is never replaced, --overwrite or not
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    assert main(["adapters", "synthetic", "--out", str(mine), "--overwrite"]) == 2
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    capsys.readouterr()
    for argv, msg in ((["--rank", "100"], "--rank must be at most min(--shape) = 64, got 100"),
                      (["--contaminated", "10"], "--contaminated must be below --clients = 10, got 10"),
                      (["--layers", "0"], "--layers must be >= 1, got 0"),
                      (["--modules", ","], "--modules must name at least one projection")):
        assert main(["adapters", "synthetic", "--out", str(tmp_path / "bad"), *argv]) == 2
        assert msg in capsys.readouterr().err
        assert not (tmp_path / "bad").exists()
    with pytest.raises(SystemExit):
        main(["adapters", "synthetic", "--out", str(tmp_path / "bad"), "--shape", "64"])
    assert "expected OUTxIN, e.g. 64x48, got '64'" in capsys.readouterr().err


def test_clients_and_modules_are_checked_and_few_clients_are_listed(tmp_path, capsys):
    for argv, msg in ((["--clients", "1"], "--clients must be at least 2 (every aggregation needs two), got 1"),
                      (["--modules", "q_proj,q_proj"], "--modules must not repeat a projection"),
                      (["--seed", "-5"], "--seed must be an integer >= 0, got -5")):
        assert main(["adapters", "synthetic", "--out", str(tmp_path / "bad"), *argv]) == 2
        assert msg in capsys.readouterr().err and not (tmp_path / "bad").exists()
    assert main(["adapters", "synthetic", "--out", str(tmp_path / "two"), "--clients", "2", "--contaminated", "0"]) == 0
    assert "wrote 2 client adapters (client_00, client_01; none contaminated)" in capsys.readouterr().out


def test_the_sentence_names_the_row_space_tests_third_condition_and_the_pooled_lead(tmp_path):
    """A contaminated client far outside the shared row space by score and ratio, but with less than
    half of its energy outside (rank 8 on 16 inputs): the sentence gives its root-mean-square share
    against 1/sqrt(2), and names the pooled rule's flag as a lead where the update rule flags nobody."""
    from lowrank_fl.adapters import ModuleOptions, aggregate_factors
    from lowrank_fl.adapters.decision import detection_sentence

    paths = write_synthetic_adapters(tmp_path / "f", n_layers=2, modules=("q_proj", "v_proj"), shape=(64, 16),
                                     rank=8, seed=0)
    det = aggregate_factors(load_adapters(paths), ModuleOptions(output_dtype="float64")).summary["detection"]
    u = det["updates"]
    rms = u["outside_rms_shares"]["client_09"]
    assert det["flagged"] == [] and u["outside_scores"]["client_09"] > u["cutoff"] and rms < np.sqrt(0.5)
    text = detection_sentence(det)
    assert f"(client_09, {u['outside_ratios']['client_09']:.2f}x the typical, root-mean-square share {rms:.2f})" \
        " / above" in text and "1.2x, with a root-mean-square share above 0.71;" in text
    assert det["pooled_flagged"] == ["client_09"]
    assert text.endswith("The pooled rule on (8)'s block norms would flag client_09 (--client-rule pooled; it also "
                         "flags benign clients that trained harder).")
