"""write_synthetic_adapters: its arguments are checked by name, and it never writes over a folder."""
from __future__ import annotations

import pytest

from lowrank_fl.adapters import load_adapters
from lowrank_fl.adapters.synthetic import write_synthetic_adapters

SMALL = dict(n_clients=3, n_layers=1, modules=("q_proj",), shape=(8, 6), rank=2, contaminated=1)


@pytest.mark.parametrize("change, match", [
    (dict(n_clients=0), "n_clients"),
    (dict(n_layers=0), "n_layers"),
    (dict(rank=0), "rank"),
    (dict(rank=7), r"rank must be at most min\(shape\) = 6"),
    (dict(ranks=[2, 2]), r"ranks must give one rank per client \(3\)"),
    (dict(contaminated=3), "contaminated must be below n_clients = 3"),
    (dict(contaminated=-1), "contaminated"),
    (dict(delta=-1.0), "delta"),
    (dict(b_scale=0.0), "b_scale"),
    (dict(dtype="bfloat16"), "dtype must be 'float16' or 'float32'"),
    (dict(modules=()), "modules"),
])
def test_bad_arguments_are_named_and_nothing_is_written(tmp_path, change, match):
    with pytest.raises(ValueError, match=match):
        write_synthetic_adapters(tmp_path / "fed", **{**SMALL, **change})
    assert not (tmp_path / "fed").exists()


def test_an_existing_federation_is_not_overwritten(tmp_path):
    dirs = write_synthetic_adapters(tmp_path / "fed", **SMALL)
    before = {d: (d / "adapter_model.safetensors").read_bytes() for d in dirs}
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_synthetic_adapters(tmp_path / "fed", **{**SMALL, "shape": (4, 4), "seed": 1})
    assert all((d / "adapter_model.safetensors").read_bytes() == b for d, b in before.items())
    again = write_synthetic_adapters(tmp_path / "fed", **{**SMALL, "seed": 1}, overwrite=True)
    assert again == dirs and len(load_adapters(again).names) == 3
    assert (dirs[0] / "adapter_model.safetensors").read_bytes() != before[dirs[0]]
