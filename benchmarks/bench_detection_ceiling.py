"""How much the update rule's statistics can tell at all: a classifier fitted to the ground truth of
the other families, on every statistic the rule reads, scored on a held-out family.

Per trained set (lowrank_fl.nn.trained_families) the default run (``aggregate_factors``) gives each
client's update evidence (lowrank_fl.adapters.detect_updates.update_evidence, the feature profile
included) and the issue's raw statistic. Those 16 numbers per client (:data:`FEATURES`) go into an
L2-penalised logistic regression (scipy L-BFGS, standardised features, heavy-tailed scores as
sign·log1p|x|), fitted leave-one-family-out: on the clients of every other family, scored on the
held-out one. The score is added to the default rule (a client is flagged if either flags it) at
two thresholds per held-out family, each the largest score of a benign client *that the default
leaves unflagged* (a client whose training diverged, which the default flags already, sets none):

* ``fitted``: among the *training* families' clients: a rule chosen on other families with no
  benign flag there beyond the default's, as a rule would be chosen;
* ``oracle``: among the *held-out* family's own clients: what the default and the score find
  together with no benign flag beyond the default's, the threshold chosen on the labels it is judged
  on (so never fewer than the default finds). Not a proof that no rule finds more (the fit
  maximises a likelihood, not this count), but a measure of what these statistics carry: where it
  is near the default, the clients' updates do not tell the remaining contaminated clients from the
  benign ones by any combination of them that a linear score can see.

Each family is held out on its own (a grouped row, such as both bases' ``*-personal``, adds up two
runs in each of which the other base's family was in the training set), and the ``all`` row adds
up the families' rows: a different threshold per family, not one threshold.

Usage::

    python benchmarks/bench_detection_ceiling.py --families llama-federated gpt2-personal --seeds 3300 3301 \
        --cache CACHE_DIR --out ceiling.json
    python benchmarks/bench_detection_ceiling.py --sets sets.json --out ceiling.json   # [[family, seed, cache], ...]
    python benchmarks/bench_detection_ceiling.py --table ceiling.json

Sets absent from the cache are trained (1-2 minutes each on one core).
"""
from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import numpy as np
from scipy import optimize

from lowrank_fl.adapters import ModuleOptions, aggregate_factors
from lowrank_fl.adapters.detect import pooled_scores
from lowrank_fl.adapters.detect_updates import update_evidence
from lowrank_fl.adapters.feature_profile import results_features
from lowrank_fl.adapters.updates import raw_distances
from lowrank_fl.nn.trained_families import FAMILIES, family_settings
from lowrank_fl.nn.trained_sets import trained_set

#: per client: (name, heavy-tailed score?) — every statistic the update rule reads, and the raw one
FEATURES = (("direction_score", True), ("agreement_bound", False), ("shortfall_bound", False),
            ("outside_score", True), ("log_outside_ratio", False), ("size_score", True),
            ("log_size_ratio", False), ("profile_score_over_cutoff", True), ("log_profile_ratio", False),
            ("profile_distance", False), ("feature_score", True), ("log_feature_ratio", False),
            ("log_column_ratio", False), ("typical_agreement", False), ("shared_direction_p", False),
            ("raw_score", True))
PENALTY = 1.0          # L2 on the standardised coefficients (scikit-learn's default C = 1)


def client_features(factors: dict) -> tuple[list, np.ndarray, list]:
    """``(names, X (K, len(FEATURES)), default flags)`` of one set of client factors."""
    res = aggregate_factors(factors, ModuleOptions(output_dtype="float64"))
    results = res.aggregation.results
    names = list(factors)
    grams = np.array([r.gram for r in results], float)
    outside = np.array([r.outside for r in results], float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ev = update_evidence(grams, outside, features=results_features(results))
        raw, _ = pooled_scores(raw_distances(grams), len(names))
    K = len(names)
    cols = {"direction_score": ev.direction_scores, "agreement_bound": ev.agreement_bounds,
            "shortfall_bound": np.clip(ev.shortfall_bounds, -10, 10),
            "outside_score": ev.outside_scores, "log_outside_ratio": np.log(ev.outside_ratios),
            "size_score": ev.size_scores, "log_size_ratio": np.log(ev.size_ratios),
            "profile_score_over_cutoff": ev.profile_scores / ev.profile_cutoff,
            "log_profile_ratio": np.log(np.clip(ev.profile_ratios, 1e-6, 1e6)),
            "profile_distance": ev.profile_distances,
            "feature_score": ev.feature_scores if ev.feature_scores is not None else np.zeros(K),
            "log_feature_ratio": np.log(ev.feature_ratios) if ev.feature_ratios is not None else np.zeros(K),
            "log_column_ratio": np.log(ev.column_ratios) if ev.column_ratios is not None else np.zeros(K),
            "typical_agreement": np.full(K, ev.typical_agreement),
            "shared_direction_p": np.full(K, ev.shared_direction_p), "raw_score": raw}
    X = np.column_stack([np.nan_to_num(np.asarray(cols[f], float), nan=0.0, posinf=50.0, neginf=-50.0)
                         for f, _ in FEATURES])
    return names, X, list(res.summary["detection"]["flagged"])


def _transform(X):
    heavy = np.array([h for _, h in FEATURES])
    return np.where(heavy, np.sign(X) * np.log1p(np.abs(X)), X)


def fit_logistic(X, y, penalty: float = PENALTY):
    """``(mean, scale, w, b)``: L2-penalised logistic regression on standardised features."""
    Z = _transform(X)
    mu, sd = Z.mean(axis=0), Z.std(axis=0)
    sd[sd == 0] = 1.0
    Z = (Z - mu) / sd
    s = np.where(y, 1.0, -1.0)

    def loss(theta):
        w, b = theta[:-1], theta[-1]
        m = s * (Z @ w + b)
        p = np.exp(-np.logaddexp(0, m))                        # sigmoid(-m)
        grad = -(Z * (s * p)[:, None]).sum(axis=0) + w / penalty
        return np.logaddexp(0, -m).sum() + 0.5 * w @ w / penalty, np.append(grad, -(s * p).sum())
    theta = optimize.minimize(loss, np.zeros(Z.shape[1] + 1), jac=True, method="L-BFGS-B").x
    return mu, sd, theta[:-1], theta[-1]


def score(model, X):
    mu, sd, w, b = model
    return ((_transform(X) - mu) / sd) @ w + b


def ceiling_table(recs) -> list[dict]:
    """Leave-one-family-out rows (module docstring), one per family and the total."""
    fams = sorted({r["family"] for r in recs})
    X = np.array([x for r in recs for x in r["X"]], float)
    y = np.array([n in r["truth"] for r in recs for n in r["names"]])
    fam = np.array([r["family"] for r in recs for _ in r["names"]])
    default = np.array([n in r["default"] for r in recs for n in r["names"]])
    if len(fams) < 2:
        raise ValueError(f"leave-one-family-out needs at least 2 families, got {fams}")
    rows = []
    for f in fams:
        tr, te = fam != f, fam == f
        model = fit_logistic(X[tr], y[tr])
        s_tr, s_te = score(model, X[tr]), score(model, X[te])
        # thresholds over the benign clients the default leaves unflagged (module docstring)
        fitted = _largest(s_tr[~y[tr] & ~default[tr]])
        oracle = _largest(s_te[~y[te] & ~default[te]])
        yt, dt = y[te], default[te]
        by_fitted, by_oracle = dt | (s_te > fitted), dt | (s_te > oracle)
        rows.append({"family": f, "contaminated": int(yt.sum()), "benign": int((~yt).sum()),
                     "default_found": int((dt & yt).sum()), "default_benign": int((dt & ~yt).sum()),
                     "fitted_found": int((by_fitted & yt).sum()), "fitted_benign": int((by_fitted & ~yt).sum()),
                     "oracle_found": int((by_oracle & yt).sum())})
    total = {k: sum(r[k] for r in rows) for k in rows[0] if k != "family"}
    return [{"family": "all", **total}] + rows


def _largest(v) -> float:
    return float(v.max()) if v.size else -np.inf


def print_table(rows):
    print("| family | contaminated / benign | default (found, benign) | default + score fitted on the other "
          "families (found, benign) | default + score, threshold on the family's own labels (found) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['family']} | {r['contaminated']} / {r['benign']} | {r['default_found']}, {r['default_benign']} | "
              f"{r['fitted_found']}, {r['fitted_benign']} | {r['oracle_found']} |")


def _read_sets(p, path, cache):
    try:
        entries = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        p.error(f"--sets {path}: cannot read a JSON list: {exc}")
    if not isinstance(entries, list) or not all(isinstance(e, list) and len(e) in (2, 3) for e in entries):
        p.error(f"--sets {path} must hold a JSON list of [family, seed] or [family, seed, cache]")
    sets = []
    for e in entries:
        if e[0] not in FAMILIES or isinstance(e[1], bool) or not isinstance(e[1], int):
            p.error(f"--sets {path}: {e!r} is not [family, integer seed] with a family of {FAMILIES}")
        sets.append((e[0], e[1], e[2] if len(e) > 2 else cache))
    return sets


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Columns: the default rule's flags; the default plus the score at a threshold chosen on the "
               "other families;\nthe default plus the score at its threshold on the held-out family's own "
               "labels (a measure of what\nthe statistics carry, not a rule). Example:\n"
               "  python benchmarks/bench_detection_ceiling.py --families llama-federated gpt2-personal "
               "--seeds 3300 3301 --out ceiling.json")
    p.add_argument("--families", nargs="+", default=[], choices=FAMILIES, metavar="FAMILY",
                   help="families of lowrank_fl.nn.trained_families (with --seeds)")
    p.add_argument("--seeds", nargs="+", type=int, default=[])
    p.add_argument("--cache", default=None, help="trained-set cache folder (default: train in memory)")
    p.add_argument("--sets", default=None, help="JSON list of [family, seed] or [family, seed, cache]")
    p.add_argument("--out", default=None, help="new JSON file for the per-set records and the table")
    p.add_argument("--table", default=None, help="print the table of a previous --out file")
    a = p.parse_args(argv)
    if a.table:
        try:
            rows = json.loads(Path(a.table).read_text())["table"]
            print_table(rows)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            p.error(f"--table {a.table} is not an --out file of this benchmark ({type(exc).__name__}: {exc})")
        return
    if bool(a.families) != bool(a.seeds):
        p.error("--families and --seeds go together")
    sets = [(f, s, a.cache) for s in a.seeds for f in a.families]
    if a.sets:
        sets += _read_sets(p, a.sets, a.cache)
    if len({f for f, _, _ in sets}) < 2:
        p.error("give sets of at least 2 families (--families and --seeds, or --sets), or --table")
    if a.out and (Path(a.out).exists() or not Path(a.out).resolve().parent.is_dir()):
        p.error(f"--out {a.out} exists or its folder does not: choose a new file in an existing folder")
    recs = []
    for i, (f, s, cache) in enumerate(sets):
        print(f"[{i + 1}/{len(sets)}] {f} {s}: loading (training if not cached: 1-2 minutes) ...", flush=True)
        ts = trained_set(family_settings(f, s), cache_dir=cache)
        names, X, default = client_features(ts.factors)
        recs.append({"family": f, "seed": s, "names": names, "truth": list(ts.contaminated),
                     "default": default, "X": X.tolist()})
        print(f"    K = {len(names)}, {len(ts.contaminated)} contaminated, the default flags {len(default)}",
              flush=True)
    rows = ceiling_table(recs)
    print_table(rows)
    if a.out:
        Path(a.out).write_text(json.dumps({"features": [f for f, _ in FEATURES], "sets": recs, "table": rows}))


if __name__ == "__main__":
    main()
