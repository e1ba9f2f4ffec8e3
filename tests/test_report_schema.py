"""results.json is strict JSON (null for non-finite values, explained in ``nonfinite``) and
validates against the published schema ``verify/report/results.schema.json``."""
from __future__ import annotations

import copy
import json

import jsonschema
import numpy as np
import pytest

from _dummy_tasks import dummy_claims
from verify.claim import Claim, Context, Evidence, jsonable
from verify.report.results_json import SCHEMA_PATH, load_schema
from verify.report.write import write_report
from verify.runner import run_claims


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    out = tmp_path_factory.mktemp("schema-report")
    results = run_claims(dummy_claims(), Context(scale="smoke", out_dir=out))
    c = Claim(id="flute.dummy.nonfinite", paper="flute", reference="Theorem 5.1", kind="bound",
              statement="s", experiment=lambda ctx: None)
    results.append((c, Evidence(verdict="fails", summary="diverged", measured={
        "rate": np.inf, "per_seed": np.array([0.5, np.nan, -np.inf]), "a/b": {"x~y": float("inf")}},
        table=[{"k": 2, "err": np.float64(np.inf)}])))
    write_report(results, out, "smoke", meta={"base_seed": 0, "backend": "sequential"})
    text = (out / "results.json").read_text()
    return json.loads(text), text


def test_results_json_validates_against_the_published_schema(doc):
    document, _ = doc
    assert SCHEMA_PATH.is_file() and SCHEMA_PATH.name == "results.schema.json"
    jsonschema.Draft202012Validator.check_schema(load_schema())
    jsonschema.validate(document, load_schema(), cls=jsonschema.Draft202012Validator)
    assert document["schema_version"] == 2 and document["totals_by_paper"]["flute"]["claims"] == 2


def test_non_finite_values_are_null_with_a_note(doc):
    document, text = doc
    assert "Infinity" not in text and "NaN" not in text and '"inf"' in text
    entry = next(c for c in document["claims"] if c["id"] == "flute.dummy.nonfinite")
    assert entry["measured"]["rate"] is None and entry["measured"]["per_seed"] == [0.5, None, None]
    assert entry["table"][0]["err"] is None
    assert entry["nonfinite"] == {"/measured/rate": "inf", "/measured/per_seed/1": "nan",
                                  "/measured/per_seed/2": "-inf", "/measured/a~1b/x~0y": "inf",
                                  "/table/0/err": "inf"}
    clean = next(c for c in document["claims"] if c["id"] == "fedrep.dummy.mean")
    assert clean["nonfinite"] == {}


def test_the_schema_rejects_what_other_tools_could_not_read(doc):
    document, _ = doc
    schema = load_schema()
    for mutate in (lambda d: d["claims"][0].update(verdict="passes"),           # unknown verdict
                   lambda d: d["claims"][0].update(seconds="1.0"),              # number as a string
                   lambda d: d["claims"][0]["nonfinite"].update({"/x": "Infinity"}),
                   lambda d: d["claims"][0].pop("reference"),                   # theorem/eq. missing
                   lambda d: d["totals"].pop("fails"),
                   lambda d: d.update(scale="medium")):
        bad = copy.deepcopy(document)
        mutate(bad)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema, cls=jsonschema.Draft202012Validator)


def test_jsonable_without_a_collector_still_writes_null():
    assert jsonable({"a": [1.0, float("nan")], "b": np.float32(np.inf)}) == {"a": [1.0, None], "b": None}
