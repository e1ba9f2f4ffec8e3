"""benchmarks/bench_adapters.py on real directories: its synthetic sets and the CLI's output are
replaced only when the benchmark (or the CLI) wrote them; a user's folder of the same name, and
files in it, survive."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_adapters", ROOT / "benchmarks" / "bench_adapters.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


TINY = dict(K=4, layers=1, shape=(32, 32), contaminated=1, modules=("q_proj",))


def test_a_users_folder_named_like_the_set_survives(bench, tmp_path):
    data = tmp_path / "adapters_K4_L1_1x32"
    data.mkdir()
    (data / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="--workdir"):
        bench._synthetic(tmp_path, TINY["K"], TINY["layers"], TINY["shape"], TINY["contaminated"],
                         TINY["modules"])
    assert (data / "notes.txt").read_text() == "mine" and sorted(p.name for p in data.iterdir()) == ["notes.txt"]


def test_cli_run_reuses_its_set_cleans_its_output_and_spares_a_users_out(bench, tmp_path):
    res = bench.part1(tmp_path, True, 1, **TINY)
    assert res["flagged_clients"] == ["client_03"] and res["output_over_input"] > 0
    assert not (tmp_path / "out").exists()                   # its own output, removed after
    assert all("OUT" in line or str(tmp_path) not in line for line in res["stdout"])
    data = tmp_path / "adapters_K4_L1_1x32"
    stamp = (data / "client_00" / "adapter_model.safetensors").stat().st_mtime_ns
    bench._synthetic(tmp_path, 4, 1, (32, 32), 1, ("q_proj",))     # reused, not rewritten
    assert (data / "client_00" / "adapter_model.safetensors").stat().st_mtime_ns == stamp
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.csv").write_text("a user's file")
    with pytest.raises(RuntimeError, match="CLI failed"):
        bench.part1(tmp_path, True, 1, **TINY)
    assert (out / "results.csv").read_text() == "a user's file"
