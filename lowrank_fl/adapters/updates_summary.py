"""``summary.json["detection"]["updates"]``: the update rule's evidence per client, as the summary
writes it (:mod:`.decision` composes the rest of the detection block and the sentence)."""
from __future__ import annotations

import numpy as np

from .detect_updates import FARTHER_RATIO, PROFILE_GROUP_RATIO, SHARED_ALPHA, SHARED_FLOOR
from .feature_profile import off_reason
from .init_reversal import (REVERSED_COSINE, modules_reversed, modules_tested, reversed_init_flags,
                            typical_init_cosines)
from .updates import zero_module_counts

__all__ = ["updates_block", "names_where"]


def names_where(names, mask) -> list:
    """The names whose ``mask`` entry is true, in order."""
    return [n for n, f in zip(names, mask) if f]


def updates_block(uv, grams, names, results, cosines) -> dict:
    """``summary["detection"]["updates"]``: the update rule's evidence per client (exact floats; None
    where a value is undefined, so the JSON is strict). ``uv``: :func:`.detect_updates.update_evidence`'s
    result; ``grams`` (modules, K, K); ``results`` the CLAIR module results; ``cosines`` their
    :func:`.init_reversal.init_cosines` (None where not tested)."""
    K = len(names)
    reversed_ = reversed_init_flags(cosines, K)
    return {
        "direction_scores": dict(zip(names, uv.direction_scores.tolist())),
        "agreement_ratios": {n: (None if np.isnan(v) else float(v))
                             for n, v in zip(names, uv.agreement_ratios)},
        "outside_scores": dict(zip(names, uv.outside_scores.tolist())),
        "outside_ratios": dict(zip(names, uv.outside_ratios.tolist())),
        # the row-space flag's third condition: most of the update outside (rms share > 1/sqrt 2)
        "outside_rms_shares": dict(zip(names, np.sqrt(np.mean(
            np.array([r.outside for r in results], float) ** 2, axis=0)).tolist())),
        "agreement_bounds": dict(zip(names, uv.agreement_bounds.tolist())),
        "shortfall_bounds": {n: (float(v) if np.isfinite(v) else None)
                             for n, v in zip(names, uv.shortfall_bounds)},
        "size_scores": dict(zip(names, uv.size_scores.tolist())),
        "size_ratios": dict(zip(names, uv.size_ratios.tolist())),
        "profile_scores": dict(zip(names, uv.profile_scores.tolist())),
        "profile_ratios": {n: (None if not np.isfinite(v) else float(v))
                           for n, v in zip(names, uv.profile_ratios)},
        "profile_cutoff": uv.profile_cutoff if np.isfinite(uv.profile_cutoff) else None,
        "profile_distances": dict(zip(names, uv.profile_distances.tolist())),
        # the profile flag's last condition: no two other clients spread alike (inf below 3 clients)
        "profile_second_nearest": {n: (float(v) if np.isfinite(v) else None)
                                   for n, v in zip(names, uv.profile_second_nearest)},
        **zero_module_counts(grams, names),
        "shared_floor": SHARED_FLOOR,
        "typical_agreement": uv.typical_agreement,
        "shared_direction_p": uv.shared_direction_p,
        "shared_alpha": SHARED_ALPHA,
        "farther_ratio": FARTHER_RATIO,
        "farther_agreement": uv.farther_agreement,
        "profile_group_ratio": PROFILE_GROUP_RATIO,
        # far out by their profiles, but one of three or more spread alike: not flagged by it
        "profile_grouped": names_where(names, uv.profile_grouped),
        # the feature profile, reported (not a flag: lowrank_fl.adapters.feature_profile; None where the
        # results carry no feature norms or the clients' ranks differ)
        "feature_scores": None if uv.feature_scores is None else dict(zip(names, uv.feature_scores.tolist())),
        "feature_ratios": None if uv.feature_ratios is None else {
            n: (None if not np.isfinite(v) else float(v)) for n, v in zip(names, uv.feature_ratios)},
        "feature_distances": None if uv.feature_distances is None else dict(
            zip(names, uv.feature_distances.tolist())),
        "column_ratios": None if uv.column_ratios is None else {
            n: (None if not np.isfinite(v) else float(v)) for n, v in zip(names, uv.column_ratios)},
        "feature_profile_off": off_reason(results),
        "cutoff": uv.cutoff if np.isfinite(uv.cutoff) else None,
        "joint_cutoff": uv.joint_cutoff if np.isfinite(uv.joint_cutoff) else None,
        # the joint evidence, reported wherever it holds; it flags (by_joint) at an agreement of at most
        # joint_agreement (1/4; 1/rho with joint_flag=True: detect_updates)
        "joint_evidence": names_where(names, uv.joint_evidence),
        "joint_flag": uv.joint_flag, "joint_agreement": uv.joint_agreement,
        "min_ratio": uv.min_ratio, "size_ratio": uv.size_ratio,
        # A reversed against the common LoRA initialization (lowrank_fl.adapters.init_reversal)
        "init_cosines": {n: (None if np.isnan(v) else float(v))
                         for n, v in zip(names, typical_init_cosines(cosines, K))},
        "init_modules": dict(zip(names, modules_tested(cosines, K).tolist())),
        "init_reversed_modules": dict(zip(names, modules_reversed(cosines, K).tolist())),
        "reversed_cosine": REVERSED_COSINE, "by_reversed_init": names_where(names, reversed_),
        "flagged": names_where(names, uv.flagged | reversed_),
        **{key: names_where(names, getattr(uv, key)) for key in
           ("by_direction", "by_outside", "by_size", "by_joint", "by_opposed", "by_profile", "by_farther")},
    }
