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


def test_weights_are_written_like_the_config_under_the_umask_and_load_bit_for_bit(tmp_path):
    """The weights file gets the mode the config gets (safetensors' save_file would make it 0600),
    and holds the very tensors safetensors' own writer would."""
    import os

    import numpy as np
    from safetensors.numpy import load_file

    old = os.umask(0o022)
    try:
        (d, *_) = write_synthetic_adapters(tmp_path / "fed", **SMALL)
    finally:
        os.umask(old)
    mode = lambda p: os.stat(p).st_mode & 0o777  # noqa: E731
    assert mode(d / "adapter_model.safetensors") == mode(d / "adapter_config.json") == 0o644
    t = load_file(str(d / "adapter_model.safetensors"))
    assert sorted(t) == ["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
                         "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
    assert all(v.dtype == np.float16 for v in t.values())
