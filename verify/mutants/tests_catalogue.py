"""Mutants checked by the tests (``python -m verify.mutants --target tests``), in the modules the
verifier's claims do not exercise at smoke scale: adapters/, compare/, conic.py, clair/program7.py,
clair/pipeline.py and clair/stages.py, verify/cache.py and nn/.

Most are *source edits*: :func:`_edit` recompiles the target function from its own source with
one textual change (``old`` → ``new``, which must occur exactly once), in the function's module
globals, so the bug is the one-token slip a reviewer would see in a diff. Each names the test
files that cover its target (:attr:`~verify.mutants.harness.Mutant.tests`); none is run by the
claims mode (``papers`` is empty).
"""
from __future__ import annotations

import __future__
import ast
import functools
import inspect
import textwrap

from .harness import Mutant

__all__ = ["TESTS_CATALOGUE", "edit_source"]


def edit_source(original, old: str, new: str):
    """``original`` (a function) recompiled with ``old`` replaced by ``new`` in its source.

    The copy shares the original's module globals, defaults and name; line numbers in tracebacks
    point at the original file. ``ValueError`` unless ``old`` occurs exactly once.
    """
    fn = inspect.unwrap(original)
    src = textwrap.dedent(inspect.getsource(fn))
    n = src.count(old)
    if n != 1:
        raise ValueError(f"mutant edit of {fn.__module__}.{fn.__qualname__}: {old!r} occurs {n} "
                         "times in its source, expected exactly once")
    tree = ast.parse(src.replace(old, new))
    ast.increment_lineno(tree, fn.__code__.co_firstlineno - 1)
    code = compile(tree, inspect.getsourcefile(fn) or "<mutant>", "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    namespace: dict = {}
    exec(code, fn.__globals__, namespace)       # noqa: S102 - the library's own source, edited
    mutant = namespace[fn.__name__]
    mutant.__qualname__ = fn.__qualname__
    return mutant


def _edit(old: str, new: str):
    """``make`` for a one-token bug in the target's source (:func:`edit_source`)."""
    return lambda original: edit_source(original, old, new)


def _noiseless_scale_max(original):
    """``NoiselessCertifier.__init__`` whose scale is the larger trivial objective."""
    @functools.wraps(original)
    def __init__(self, D, q, K, lam_L, lam_S, **kwargs):
        original(self, D, q, K, lam_L, lam_S, **kwargs)
        from lowrank_fl.clair import as_blocks
        from lowrank_fl.linalg import block_norms, nuclear_norm

        self.scale = max(lam_L * nuclear_norm(D), lam_S * float(block_norms(as_blocks(D, q)).sum())) or 1.0
    return __init__


_A = "lowrank_fl.adapters"
T_NUM = "tests/test_adapters_numbers.py"
T_RED = "tests/test_adapters_reduce.py"
T_PEFTCFG = "tests/test_adapters_peft_config.py"
T_CMP = "tests/test_compare_numbers.py"
T_CP7 = "tests/test_conic_program7_numbers.py"
T_NNC = "tests/test_nn_cache_numbers.py"
T_PIPE = "tests/test_clair_pipeline_numbers.py"

_M = [
    # ---------------------------------------------------------------- adapters/reduce
    Mutant("reduce.energy_one_direction_too_few", f"{_A}.reduce:_energy_rotation",
           "The truncated reduction keeps one direction fewer than the energy needs.", (),
           _edit("m = int(np.searchsorted(np.cumsum(ev) / total, energy - 1e-15)) + 1",
                 "m = max(int(np.searchsorted(np.cumsum(ev) / total, energy - 1e-15)), 1)"),
           tests=(T_NUM, T_RED)),
    Mutant("reduce.energy_threshold_strict", f"{_A}.reduce:_energy_rotation",
           "Energy exactly at the threshold is not enough: one more direction is kept.", (),
           _edit("energy - 1e-15", "energy + 1e-15"), tests=(T_NUM, T_RED)),
    Mutant("reduce.discarded_relative_to_kept", f"{_A}.reduce:reduce_module",
           "The discarded energy is divided by the kept energy instead of the total.", (),
           _edit("max(exact_total - kept, 0.0) / exact_total", "max(exact_total - kept, 0.0) / kept"),
           tests=(T_NUM, T_RED)),
    # ---------------------------------------------------------------- adapters/aggregate, run
    Mutant("aggregate.factors_core_over_K", f"{_A}.aggregate:aggregate_module",
           "fedavg-factors / ffa: the rank_out core sum(Y) sum(X) is divided by K instead of K^2.", (),
           _edit("/ K**2", "/ K"), tests=(T_NUM, T_RED)),
    Mutant("aggregate.majority_strict", f"{_A}.aggregate:client_decision",
           "The majority rule needs more than half of the modules (a client benign in exactly half "
           "is flagged).", (), _edit("flags.mean(axis=0) >= 0.5", "flags.mean(axis=0) > 0.5"),
           tests=(T_NUM,)),
    Mutant("aggregate.any_rule_inverted", f"{_A}.aggregate:client_decision",
           "The 'any' rule keeps a client benign in any module instead of excluding a client "
           "flagged in any module.", (), _edit("flags.all(axis=0)", "flags.any(axis=0)"),
           tests=(T_NUM,)),
    Mutant("aggregate.truncation_error_squared", f"{_A}.aggregate:_factorize",
           "The rank_out truncation error is reported squared (the square root forgotten).", (),
           _edit("float(np.sqrt(s[rank_out:rho] @ s[rank_out:rho] / tot))",
                 "float(s[rank_out:rho] @ s[rank_out:rho] / tot)"), tests=(T_NUM, T_RED)),
    Mutant("run.streams_under_majority", f"{_A}.run:aggregate_to_dir",
           "The streaming writer also streams under 'majority', writing each module with its own "
           "set (8) instead of the client-level set.", (),
           _edit('client_rule == "per-module"', 'client_rule in ("per-module", "majority")'),
           tests=(T_NUM,)),
    # ---------------------------------------------------------------- adapters/tuning
    Mutant("tuning.scale_sqrt_r", f"{_A}.tuning:data_scale",
           "The data scale divides the median block norm by sqrt(r) instead of sqrt(2r).", (),
           _edit("np.sqrt(2.0 * rank)", "np.sqrt(rank)"), tests=(T_NUM, T_RED)),
    Mutant("tuning.arithmetic_midpoint", f"{_A}.tuning:auto_lambdas",
           "The ratio lam_S/lam_L is the arithmetic midpoint of the rank band, not the geometric.", (),
           _edit("float(np.sqrt(band[0] * band[1]))", "float((band[0] + band[1]) / 2)"),
           tests=(T_NUM, T_RED)),
    Mutant("tuning.lambda_L_without_K", f"{_A}.tuning:auto_lambdas",
           "lam_L starts at the data scale without its K^(-1/2) factor.", (),
           _edit("lam_L = K ** -0.5 * s", "lam_L = s"), tests=(T_NUM, T_RED)),
    # ---------------------------------------------------------------- adapters/io
    Mutant("io.rslora_not_written", f"{_A}.save:peft_config",
           "The output config keeps the input's use_rslora (not set to false for scaling 1).", (),
           _edit('if key in cfg or key in ("init_lora_weights", "use_rslora"):',
                 'if key != "use_rslora" and (key in cfg or key == "init_lora_weights"):'),
           tests=(T_PEFTCFG,)),
    Mutant("io.pattern_unanchored", f"{_A}.io:pattern_value",
           "rank_pattern / alpha_pattern keys matched by an unanchored search instead of PEFT's rule.",
           (), _edit('re.match(rf"(.*\\.)?({key})$", name)', "re.search(key, name)"),
           tests=(T_PEFTCFG,)),
    Mutant("io.rslora_scaling_ignored", f"{_A}.io:config_scaling",
           "Reading a client, the scaling ignores use_rslora (alpha/r instead of alpha/sqrt(r)).", (),
           _edit('(math.sqrt(rank) if config.get("use_rslora") else rank)', "rank"),
           tests=(T_PEFTCFG,)),
    Mutant("io.alpha_pattern_ignored", f"{_A}.io:config_scaling",
           "Reading a client, alpha_pattern is ignored (lora_alpha for every module).", (),
           _edit('pattern_value(config.get("alpha_pattern"), module,',
                 'pattern_value(None, module,'), tests=(T_PEFTCFG,)),
    Mutant("io.bf16_read_as_float16", f"{_A}.io:ClientAdapter.read",
           "bf16 tensors are read as IEEE half precision (same width, other exponent/mantissa split).",
           (), _edit("(raw.astype(np.uint32) << 16).view(np.float32)",
                     "raw.view(np.float16).astype(np.float32)"), tests=(T_PEFTCFG,)),
    # ---------------------------------------------------------------- compare
    Mutant("compare.noiseless_scale_max", "lowrank_fl.compare.certify:NoiselessCertifier.__init__",
           "The noiseless certifier's scale is the larger trivial objective instead of the smaller.",
           (), _noiseless_scale_max, tests=(T_CMP,)),
    Mutant("compare.rank_from_worst", "lowrank_fl.compare.engine:_assemble",
           "The comparison's rank is the numerical rank of the worst-certified method's point.", (),
           _edit('best = min(done, key=lambda r: r["relative_gap"])',
                 'best = max(done, key=lambda r: r["relative_gap"])'), tests=(T_CMP,)),
    Mutant("compare.lower_bound_smallest_dual", "lowrank_fl.compare.engine:_assemble",
           "The comparison's lower bound is the smallest certified dual instead of the largest.", (),
           _edit('lower = max(done, key=lambda r: r["dual"])', 'lower = min(done, key=lambda r: r["dual"])'),
           tests=(T_CMP,)),
    Mutant("compare.schur_one_cone", "lowrank_fl.compare.methods:estimate_memory",
           "The block-Schur memory estimate counts one semidefinite cone instead of G.", (),
           _edit('int(sizes["block_rows"]) + cols, int(sizes["blocks"])',
                 'int(sizes["block_rows"]) + cols, 1'), tests=(T_CMP,)),
    # ---------------------------------------------------------------- conic, program (7)
    Mutant("conic.data_scale_without_abs", "lowrank_fl.conic:data_scale",
           "data_scale takes the largest entry instead of the largest absolute entry.", (),
           _edit("np.max(np.abs(a))", "np.max(a)"), tests=(T_CP7,)),
    Mutant("conic.decide_accepts_inaccurate", "lowrank_fl.conic:decide",
           "Without a certificate, decide accepts CVXPY's optimal_inaccurate as optimal.", (),
           _edit('ok = raw_status == "optimal"', 'ok = raw_status in ("optimal", "optimal_inaccurate")'),
           tests=(T_CP7,)),
    Mutant("program7.zero_objective_without_half", "lowrank_fl.clair.program7:zero_objective",
           "F(0, 0) misses its 1/2: relative gaps are reported half their size.", (),
           _edit("f0 = 0.5 * float(", "f0 = float("), tests=(T_CP7,)),
    # ---------------------------------------------------------------- clair/pipeline
    Mutant("pipeline.longest_run_short_end", "lowrank_fl.clair.pipeline:longest_run",
           "The longest run's upper end is the value before its last element.", (),
           _edit("float(x[i - 1])), i - start", "float(x[max(i - 2, start)])), i - start"),
           tests=(T_NUM,)),
    Mutant("pipeline.votes_strict", "lowrank_fl.clair.stages:collaborative_set",
           "Rule (8) needs a vote fraction above alpha instead of at least alpha.", (),
           _edit("Votes(votes >= alpha, votes)", "Votes(votes > alpha, votes)"),
           tests=(T_PIPE, "tests/test_clair_pipeline.py")),
    Mutant("pipeline.majority_pairs_floor", "lowrank_fl.clair.stages:majority_pairs",
           "The smallest set (8) can keep is sized with floor(alpha (K - 1)) instead of the ceiling.",
           (), _edit("np.ceil(alpha * (K - 1) - 1e-12)", "np.floor(alpha * (K - 1) + 1e-12)"),
           tests=(T_PIPE,)),
    # ---------------------------------------------------------------- adapters/stream
    Mutant("stream.header_padded_with_nul", f"{_A}.stream:SafetensorsStreamWriter.close",
           "The streamed safetensors header is padded with NUL bytes instead of spaces.", (),
           _edit('header.ljust(self._reserved, b" ")', 'header.ljust(self._reserved, b"\\0")'),
           tests=(T_NUM,)),
    # ---------------------------------------------------------------- verify/cache, sweep
    Mutant("sweep.cache_key_without_seed", "verify.sweep:Sweep._path",
           "The task cache key leaves out the seed: replicates share one entry.", (),
           _edit("dict(params), int(seed), version", "dict(params), version"),
           tests=("tests/test_sweep.py",)),
    Mutant("cache.header_not_checked", "verify.cache:load_entry",
           "A cache entry is accepted when its format matches, whatever its task, seed and key.", (),
           _edit('doc.get("header") != {"format": FORMAT, **header}',
                 'doc.get("header", {}).get("format") != FORMAT'),
           tests=("tests/test_sweep.py",)),
    Mutant("cache.entry_by_name_only", "verify.cache:_is_entry_file",
           "A file named like a cache entry counts as one without its content being checked (a "
           "user's archive named <hex>.npz makes a folder a cache, and clear deletes it).", (),
           _edit("if not _ENTRY.fullmatch(path.name):\n        return False",
                 "if _ENTRY.fullmatch(path.name):\n        return True"), tests=(T_NNC,)),
    # ---------------------------------------------------------------- nn
    Mutant("nn.cuts_among_n_bg", "lowrank_fl.nn.copying:sample",
           "Fuzzy copying draws its cut points among n_bg boundaries instead of n_bg + 1 (the "
           "second copy never ends at the last position).", (),
           _edit("rng.random((n, n_bg + 1))", "rng.random((n, n_bg))"), tests=(T_NNC,)),
    Mutant("nn.clair_auto_drops_alpha", "lowrank_fl.nn.aggregate:aggregate",
           "'clair-auto' runs the adapters aggregator with the default alpha, not the given one.", (),
           _edit('method="clair", rank=rank, alpha=alpha,', 'method="clair", rank=rank,'), tests=(T_NNC,)),
]

TESTS_CATALOGUE: dict[str, Mutant] = {m.id: m for m in _M}
if len(TESTS_CATALOGUE) != len(_M):
    raise ValueError("mutant ids must be unique")
