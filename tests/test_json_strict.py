"""The files the commands write are strict JSON: non-finite numbers become ``null`` / ``"inf"`` /
``"-inf"`` (:mod:`lowrank_fl.jsontext`), never the ``NaN`` / ``Infinity`` tokens strict parsers refuse."""
import json
import shutil
import warnings

import numpy as np
import pytest

from lowrank_fl.adapters.synthetic import write_synthetic_adapters
from lowrank_fl.cli import main
from lowrank_fl.jsontext import finite_json, strict_dumps


def _strict_load(text):
    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")
    return json.loads(text, parse_constant=refuse)


def test_finite_json_maps_each_non_finite_value_and_keeps_the_rest():
    value = {"a": float("nan"), "b": [np.inf, -np.inf, 1.5, np.float32(2.0)], "c": (np.int64(3), True, None),
             "d": np.array([[0.0, np.nan], [np.inf, 7.0]]), "e": np.float64("-inf"), "f": "nan", "g": 1e308}
    out = finite_json(value)
    assert out == {"a": None, "b": ["inf", "-inf", 1.5, 2.0], "c": [3, True, None],
                   "d": [[0.0, None], ["inf", 7.0]], "e": "-inf", "f": "nan", "g": 1e308}
    assert type(out["c"][0]) is int and type(out["c"][1]) is bool     # np.int64 -> int, bools stay bools
    assert _strict_load(strict_dumps(value)) == out
    with pytest.raises(ValueError):                                    # what plain json.dumps would have written
        _strict_load(json.dumps({"a": float("nan")}))


def test_aggregate_summary_of_identical_clients_is_strict_json(tmp_path):
    """Four identical clients: every module's gap ratio is undefined (NaN in the result); the summary
    holds ``null`` there and reads with a strict parser."""
    dirs = write_synthetic_adapters(tmp_path / "in", n_clients=4, n_layers=1, shape=(16, 12), rank=2,
                                    contaminated=0, seed=0)
    for d in dirs[1:]:
        shutil.rmtree(d)
        shutil.copytree(dirs[0], d)
    with warnings.catch_warnings():                                    # rank and tie warnings: not this test's
        warnings.simplefilter("ignore")
        assert main(["adapters", "aggregate", *map(str, dirs), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    text = (tmp_path / "out" / "summary.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    summary = _strict_load(text)
    assert [m["gap_ratio"] for m in summary["modules"].values()] == [None] * 4
