"""``lowrank-fl adapters inspect|aggregate``: CLAIR and baselines on PEFT LoRA adapter directories.

::

    lowrank-fl adapters inspect DIR [DIR ...] [--names A,B,..] [--summary OUT/summary.json]
        [--figure FILE.png [--overwrite]]
    lowrank-fl adapters aggregate DIR [DIR ...] --method clair --out OUT [--names A,B,..]
        [--output split|merged] [--rank-out R] [--rank R] [--lam-L X --lam-S Y]
        [--client-rule per-module|majority|any|pooled|updates|raw]
        [--refine exchangeable|agreement|shrink|paper|own]
        [--energy E]
        [--byzantine F] (--method krum|multikrum|median|trimmed-mean|geomed: robust baselines)
        [--dtype auto|float32|float16|bfloat16] [--jobs N] [--scheduler ADDR]
        [--overwrite] [--quiet]

Bad input (missing files, non-LoRA adapters, mismatched modules or shapes, non-finite or
truncated weights, fewer than 2 clients, a non-empty OUT without --overwrite, an unknown method,
an adapter that is not plain LoRA, an impossible rank, values that do not fit --dtype or
underflow it (with --dtype auto: float32 is written instead, with a note), a
``--summary`` of another run) prints one line naming the file or module and exits with status 2;
nothing is written. Warnings (clients on different base models, an untrained client) are one
line each on stderr.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import warnings
from pathlib import Path

import numpy as np

from .aggregate import BYZANTINE_METHODS, CLIENT_RULES, CLIP, DEFAULT_CLIENT_RULE, METHODS, ModuleOptions
from .degenerate import IDENTICAL_RULE, zero_update_notes
from .io import (CONFIG_NAME, WEIGHTS_NAME, AdapterError, StorageDtypeError, adapter_fingerprint,
                 check_distinct_dirs, input_dtype, load_adapters, stored_dtypes)
from .reduce import reduce_module
from .split import LAYOUTS
from .noharm import DEFAULT_REFINE, REFINE
from .synthetic_cli import add_synthetic_parser

_NAMES_HELP = ("comma-separated client names, one per DIR, in order{}; default: the directory names, "
               "with parent directories added where they collide (site1/adapter, site2/adapter -> "
               "site1_adapter, site2_adapter)")
_RULE_HELP = ("which clients are refined with the collaborative average: 'per-module' uses each "
              "module's own set of CLAIR's (8), the paper's rule; 'majority' keeps a client in every module iff it is "
              "benign in at least half of them; 'any' excludes a client from every module as soon "
              "as one module flags it (strictest: one flagged module makes the client keep its "
              "own adapter everywhere); 'pooled' (ours, the default before 'updates'; needs >= 3 "
              "clients) excludes a client from every module iff its score pooled over all modules' "
              "block norms exceeds a cutoff calibrated on a null of exchangeable clients and it is at "
              "least 1.2 times as far from the others as a typical client (its distance ratio); "
              "'updates' (ours, needs >= 3 clients) reads the clients' raw updates: how differently "
              "(direction, agreement with a shared direction, module profile, share outside the "
              "shared row space) and how far (size) each moved, each against a null cutoff with a "
              "materiality floor (README, 'Client-level detection'); 'raw' (needs >= 3 clients) pools, as "
              "'pooled' does, each client's distances ||dW_j - dW_k|| to the others and flags above the "
              "pooled rule's cutoff alone, with no distance-ratio floor: it counts size as much as "
              "direction, so a benign client that trained harder or less stands out too (README, 'The "
              "raw-distance statistic')")

__all__ = ["add_parser", "run_inspect", "run_aggregate"]


#: below this many bytes of inputs the default runs in this process: starting workers (spawning,
#: importing numpy, scipy, cvxpy in each) takes seconds, more than the modules' work (the default
#: `adapters synthetic` federation, 55 kB: 25.5 s with 2 workers, 12.1 s in-process, 2 loaded cores)
IN_PROCESS_BYTES = 32 * 2 ** 20


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``adapters`` (``inspect``, ``synthetic``, ``aggregate``) to an argparse sub-parser set."""
    top = subparsers.add_parser("adapters", help="CLAIR and baselines on PEFT LoRA adapters")
    sub = top.add_subparsers(dest="adapters_command", required=True)

    ins = sub.add_parser("inspect", help="shapes, ranks, norms, joint-subspace dimensions")
    ins.add_argument("dirs", nargs="+", type=Path, help="client adapter directories")
    ins.add_argument("--names", default=None, help=_NAMES_HELP.format(""))
    ins.add_argument("--summary", type=_file_arg, default=None,
                     help="an aggregate's summary.json: also draw the detection heatmap")
    ins.add_argument("--figure", type=_file_arg, default=None,
                     help="where to save the clients x modules heatmap (needs --summary); an "
                          "existing file only with --overwrite")
    ins.add_argument("--overwrite", action="store_true", help="replace an existing --figure FILE")
    ins.set_defaults(handler=run_inspect)
    add_synthetic_parser(sub)

    agg = sub.add_parser("aggregate", help="aggregate client adapters into PEFT adapters",
                         description="Aggregate client adapters into PEFT adapters. (7), (8) and (9) are the "
                                     "equations of the CLAIR paper: (7) its penalized low-rank + block-sparse "
                                     "program, (8) the collaborative (benign) set of each module, (9) the "
                                     "refinement each client receives.")
    agg.add_argument("dirs", nargs="+", type=Path, help="client adapter directories (K >= 2)")
    agg.add_argument("--method", default="clair",
                     help=f"aggregator: {', '.join(METHODS)} (default clair)")
    agg.add_argument("--out", required=True,
                     help="output directory: new or empty, or a previous lowrank-fl output with "
                          "--overwrite; never an input or a folder holding one")
    agg.add_argument("--names", default=None, help=_NAMES_HELP.format(" (they name the output directories)"))
    agg.add_argument("--output", default=None, choices=LAYOUTS,
                     help="CLAIR's output layout: 'split' (default) writes OUT/shared/ (the "
                          "collaborative part of CLAIR's (9), once; not written where no client uses "
                          "it, as with --refine own) and each client's own part "
                          "OUT/<client>/ (rank r_k), about twice the inputs' size at any K; "
                          "'merged' one adapter per client holding CLAIR's (9) (rank up to r + sum of "
                          "ranks: about K times the inputs; the default with --rank-out)")
    agg.add_argument("--rank-out", dest="rank_out", type=int, default=None,
                     help="truncate every merged output adapter to this rank by SVD (error "
                          "reported; implies --output merged)")
    agg.add_argument("--rank", type=int, default=None,
                     help="rank of P_A (CLAIR) / of FlexLoRA's SVD, at most min(out, in) of every "
                          "module; default the LoRA rank")
    agg.add_argument("--lam-L", dest="lam_L", type=float, default=None,
                     help="nuclear penalty of CLAIR's (7) (with --lam-S; default automatic per module)")
    agg.add_argument("--lam-S", dest="lam_S", type=float, default=None,
                     help="block penalty of CLAIR's (7) (with --lam-L)")
    agg.add_argument("--alpha", type=float, default=None,
                     help="majority fraction α of CLAIR's (8), in [0.5, 1) (default 0.5): a client is benign in a "
                          "module when it is close to at least a fraction α of the others (the per-module "
                          "sets, hence the per-module, majority and any rules; not the updates (default), "
                          "pooled or raw rule)")
    agg.add_argument("--client-rule", dest="client_rule", default=None,
                     choices=CLIENT_RULES, help=_RULE_HELP + f" (default {DEFAULT_CLIENT_RULE}; --method clair only)")
    agg.add_argument("--refine", default=None, choices=REFINE,
                     help="how collaborating clients are refined (--method clair): each moves the "
                          "fraction a_k of the way to the collaborative mean. 'exchangeable' (default): a_k "
                          "its agreement with the others, at least 1 - 1/sqrt(2) = 0.293 where the clients "
                          "look exchangeable (which of them resemble each other does not repeat across "
                          "modules: their differences look like noise); 'agreement': the agreement alone "
                          "(a_k = 0 where nobody agrees); 'shrink': at least 0.2 whatever the evidence; "
                          "every weight capped so the output moves at most a_k of the client's own update; "
                          "'paper' ((9) exactly), 'own' (everyone keeps its adapter)")
    agg.add_argument("--clip", default=None,
                     help="CLAIR: the solve of its program (7) sees each update clipped at this many times the "
                          "module's median update norm (default 5, the update rule's size floor); "
                          "'none': CLAIR's (7) on the raw contrasts")
    agg.add_argument("--byzantine", type=int, default=None,
                     help="f, the Byzantine clients krum/multikrum/trimmed-mean tolerate "
                          "(default floor((K-3)/2))")
    agg.add_argument("--energy", type=float, default=None,
                     help="truncated reduction keeping this energy fraction (default exact)")
    agg.add_argument("--tol", type=float, default=None,
                     help="relative duality-gap tolerance of CLAIR's (7) (default 1e-6)")
    agg.add_argument("--dtype", default="auto",
                     choices=("auto", "float32", "float16", "bfloat16"),
                     help="storage dtype of the output tensors; 'auto' (default): the inputs' "
                          "dtype when every client has the same one, float32 when they differ "
                          "(a value that does not fit the dtype, or a tensor it changes by over "
                          "1%% (underflow), is an error; with 'auto' the output is float32 then)")
    agg.add_argument("--jobs", type=int, default=None,
                     help="worker processes over modules (joblib); at most the number of modules "
                          "and of available cores (default, or -1: the available cores, capped so; "
                          "by default inputs under 32 MiB are aggregated in this process)")
    agg.add_argument("--scheduler", default=None, help="dask scheduler address (tcp://...)")
    agg.add_argument("--overwrite", action="store_true",
                     help="replace --out if it holds a previous lowrank-fl output (its "
                          ".lowrank-fl-output marker); any other directory is refused")
    agg.add_argument("--quiet", action="store_true",
                     help="no progress bar, no per-client lines and no raw-distance comparison (the "
                          "result line, the detection and refinement sentences and warnings stay)")
    agg.set_defaults(handler=run_aggregate)
    return top


def _names(args):
    if args.names is None:
        return None
    names = [x.strip() for x in args.names.split(",")]
    if len(names) != len(args.dirs):
        raise AdapterError(f"--names: got {len(names)} names for {len(args.dirs)} directories "
                           f"({args.names!r}); give one name per directory, comma-separated")
    return names


def _load(args, split_parts: bool = False):
    """Load the adapters; warnings (different base models) become one stderr line each."""
    check_distinct_dirs(args.dirs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            adapters = load_adapters(args.dirs, names=_names(args), split_parts=split_parts)
        except AdapterError as exc:              # the library names its argument; the user gave --names
            if str(exc).startswith("names: "):
                raise AdapterError("--" + str(exc)) from None
            raise
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    return adapters


def _at_out(path: Path, out: Path) -> bool:
    """Whether ``path`` is ``out``, inside it, one of its parents or its staging sibling."""
    p, o = path.absolute(), out.absolute()
    return (p == o or o in p.parents or p in o.parents
            or (p.parent == o.parent and p.name.startswith(f".{o.name}.")))


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000


#: ModuleOptions' field names as its messages start, and the flag each one is given by
_FLAGS = {"lam_L": "--lam-L", "lam_S": "--lam-S", "alpha": "--alpha", "tol": "--tol", "byzantine (f)": "--byzantine",
          "byzantine": "--byzantine", "energy": "--energy", "rank_out": "--rank-out", "rank": "--rank"}


def _flag_names(message: str) -> str:
    """``message`` with the Python field names of :class:`ModuleOptions` replaced by their flags."""
    for field_name in sorted(_FLAGS, key=len, reverse=True):
        message = re.sub(rf"(?<![\w-]){re.escape(field_name)}(?![\w(])", _FLAGS[field_name], message)
    return message


#: options that only some methods read: (flag, dest, the methods that read it)
_METHOD_OPTIONS = (("--lam-L", "lam_L", ("clair",)), ("--lam-S", "lam_S", ("clair",)),
                   ("--alpha", "alpha", ("clair",)), ("--tol", "tol", ("clair",)),
                   ("--rank", "rank", ("clair", "flexlora")),
                   ("--byzantine", "byzantine", BYZANTINE_METHODS))


def _read_options(args) -> dict:
    """The method-specific options (:data:`_METHOD_OPTIONS`) given and read by ``--method``."""
    return {dest: getattr(args, dest) for _, dest, methods in _METHOD_OPTIONS
            if args.method in methods and getattr(args, dest, None) is not None}


def _warn_ignored(args) -> None:
    """One warning line per option given that ``--method`` does not read (it would change nothing);
    ``--byzantine`` out of range for the method that reads it is refused here, naming the flag."""
    for flag, dest, methods in _METHOD_OPTIONS:
        value = getattr(args, dest, None)
        if value is not None and args.method not in methods:
            only = methods[0] + " does" if len(methods) == 1 else ", ".join(methods) + " do"
            print(f"warning: {flag} {value:g} is ignored: --method {args.method} does not read it (only {only})",
                  file=sys.stderr)
    f, K = getattr(args, "byzantine", None), len(args.dirs)
    if f is not None and args.method in BYZANTINE_METHODS and not 0 <= f < K / 2:
        raise ValueError(f"--byzantine must be an integer f with 0 <= f and 2 f < K = {K} clients, got {f}")


def run_aggregate(args) -> int:
    from ..outdir import check_output_dir
    from .run import aggregate_to_dir

    if args.method not in METHODS:
        raise ValueError(f"--method must be one of {', '.join(METHODS)}, got {args.method!r}")
    if args.energy is not None and not 0 < args.energy <= 1:
        raise ValueError(f"--energy must be in (0, 1], got {args.energy}")
    if args.scheduler is not None:
        try:
            import distributed  # noqa: F401
        except ImportError:
            raise ValueError("--scheduler needs the dask extra (pip install '.[dask]' in a checkout of lowrank_fl), "
                             "which is not installed") from None
    for flag, v in (("--rank", args.rank), ("--rank-out", args.rank_out)):
        if v is not None and v < 1:
            raise ValueError(f"{flag} must be an integer >= 1, got {v}")
    if args.jobs is not None and (args.jobs == 0 or args.jobs < -1):
        raise ValueError(f"--jobs must be >= 1 (or -1: every available core), got {args.jobs}")
    if args.jobs is not None and args.scheduler is not None:
        raise ValueError("--jobs and --scheduler are alternatives: local worker processes, or a dask cluster's "
                         "workers; give one")
    _warn_ignored(args)
    check_output_dir(args.out, overwrite=args.overwrite, inputs=args.dirs)
    out = Path(args.out)
    try:
        # only the method-specific options given and read (the others were warned about); ModuleOptions'
        # own defaults for the rest
        options = ModuleOptions(method=args.method, energy=args.energy, rank_out=args.rank_out,
                                clip=_clip(args.clip), **_read_options(args))
    except ValueError as exc:                   # the options' messages name the Python fields: name the flags
        raise ValueError(_flag_names(str(exc))) from None
    if args.output == "split" and args.rank_out is not None and args.method == "clair":
        raise ValueError("--rank-out truncates merged outputs: use --output merged with it (the "
                         "split layout is exact at about twice the inputs' size)")
    if args.method != "clair":          # CLAIR-only options given with another method
        for flag, value, what in (
                ("--client-rule", args.client_rule, "it decides CLAIR's refinement, and --method {m} has none"),
                ("--output", args.output, "it is the layout of CLAIR's per-client outputs, and --method {m} "
                                          "writes one adapter"),
                ("--clip", args.clip, "it clips the updates CLAIR's program (7) sees, and --method {m} "
                                      "solves none"),
                ("--refine", args.refine, "it is CLAIR's refinement, and --method {m} has none")):
            if value is not None:
                print(f"warning: {flag} {value} is ignored: {what.format(m=args.method)}", file=sys.stderr)
    args.client_rule = args.client_rule or DEFAULT_CLIENT_RULE
    args.refine = args.refine or DEFAULT_REFINE
    adapters = _load(args)
    dtype = input_dtype(adapters) if args.dtype == "auto" else args.dtype
    fallback = None
    n_in = sum((c.path / f).stat().st_size for c in adapters.clients for f in (WEIGHTS_NAME, CONFIG_NAME))
    if args.jobs is None and args.scheduler is None and n_in < IN_PROCESS_BYTES:
        args.jobs = 1               # small inputs: starting workers costs more than it saves
    try:
        try:
            agg, summary = aggregate_to_dir(adapters, options, out, client_rule=args.client_rule,
                                            dtype=dtype, overwrite=args.overwrite, jobs=args.jobs,
                                            scheduler=args.scheduler, progress=not args.quiet,
                                            output=args.output if args.method == "clair" else None,
                                            refine=args.refine if args.method == "clair" else None,
                                            out_name="--out")
        except StorageDtypeError as exc:
            if args.dtype != "auto" or dtype == "float32":
                raise
            # auto chose the inputs' dtype, which cannot hold these outputs: widen, not fail
            print(f"note: {exc.detail}; --dtype auto writes float32 instead", file=sys.stderr)
            fallback, dtype = dtype, "float32"
            agg, summary = aggregate_to_dir(adapters, options, out, client_rule=args.client_rule,
                                            dtype=dtype, overwrite=args.overwrite, jobs=args.jobs,
                                            scheduler=args.scheduler, progress=not args.quiet,
                                            output=args.output if args.method == "clair" else None,
                                            refine=args.refine if args.method == "clair" else None,
                                            out_name="--out")
    except OSError as exc:
        if exc.filename is None or not _at_out(Path(exc.filename), out):
            raise
        raise AdapterError(f"--out {args.out}: cannot write the output there ({exc.strerror}: "
                           f"{exc.filename})") from None
    mods = summary["modules"]
    print(f"{args.method}: {len(mods)} modules, {len(adapters.clients)} clients, "
          f"{agg.seconds:.1f} s; wrote {_listed(summary['outputs'])} and summary.json to "
          f"{args.out}")
    if args.method == "clair":
        cb = summary["client_benign"]
        if not args.quiet:
            print(f"  per-module evidence, each module's collaborative set of CLAIR's (8) (the {args.client_rule} rule "
                  "decides; its sentence is below):")
            for name in adapters.names:
                print(f"  {name}: benign in {cb['modules_benign'][name]}/{cb['n_modules']} "
                      f"modules' collaborative sets of CLAIR's (8) (kept by rule majority: {cb['majority'][name]}, "
                      f"by rule any: {cb['any'][name]})")
        bad = [m for m, s in mods.items() if s["status"] not in ("optimal", "completed")]
        if bad:
            print(f"  warning: {len(bad)} module(s) stopped before the tolerance: {bad[:3]}",
                  file=sys.stderr)
        same = [m for m, s in mods.items() if s["lam_rule"] == IDENTICAL_RULE
                and len(s["zero_updates"]) < len(adapters.names)]       # all-zero modules: noted below
        if same:
            print(f"  note: {len(same)} module(s) where every client's update is the same to rounding: "
                  f"nothing to solve there, every client kept as it is: {same[:3]}", file=sys.stderr)
        low = [m for m, s in mods.items() if s["numerical_rank"] < s["rank"] and s["lam_rule"] != IDENTICAL_RULE]
        if low:
            print(f"  warning: {len(low)} module(s) have rank(L_hat) below --rank (their P_A is "
                  f"partly arbitrary; see numerical_rank in summary.json): {low[:3]}",
                  file=sys.stderr)
    for note in zero_update_notes(mods, adapters.names):
        print(f"  warning: {note}", file=sys.stderr)
    if args.rank_out is not None:
        worst = max(e for d in summary["rank_out_relative_error"].values() for e in d.values())
        print(f"  --rank-out {args.rank_out}: largest relative Frobenius error {worst:.3e}")
    n_out = sum((out / o / f).stat().st_size for o in summary["outputs"]
                for f in (WEIGHTS_NAME, CONFIG_NAME))
    tags = stored_dtypes(adapters)
    why = ("--dtype" if args.dtype != "auto" else f"the inputs' {fallback} cannot hold them"
           if fallback else f"the inputs' {tags[0]}" if len(tags) == 1
           else f"the inputs hold {', '.join(tags)}")
    print(f"  output: {_size(n_out)} in {len(summary['outputs'])} adapter(s), "
          f"{n_out / n_in:.1f}x the inputs' {_size(n_in)}; dtype {dtype} ({why})"
          + ("" if args.rank_out is not None or summary.get("layout") != "merged" else
             "; the default --output split holds the same updates in at most about twice the inputs")
          + ("" if summary.get("layout") != "split" else
             "; split layout: shared/ once and each client's own part (load both: "
             "lowrank_fl.adapters.peft_load.load_split)" if "shared" in summary["outputs"] else
             "; split layout: no client uses a shared part, so none was written (each client's "
             "directory is its own adapter)"))
    if "robust" in summary:
        rb = summary["robust"]
        sel = "" if rb["selected"] is None else f"; selected {', '.join(rb['selected'])}"
        print(f"{args.method} (f = {rb['f']}, {rb['coordinates']} coordinates){sel}.")
    if "detection" in summary:
        from .decision import detection_sentence, raw_comparison

        print(detection_sentence(summary["detection"], refine=(summary.get("refinement") or {}).get("mode")))
        beside = raw_comparison(summary["detection"])
        if beside and not args.quiet:     # not what was applied: detail, which --quiet drops
            print(beside)
    if "refinement" in summary:
        from .refinement_sentence import refinement_sentence

        print(refinement_sentence(summary["refinement"]))
    return 0


def _clip(text):
    """``--clip``: None (not given: the default), ``"none"`` (never clip) or a number."""
    if text is None:
        return CLIP
    if str(text).strip().lower() == "none":
        return None
    try:
        v = float(text)
    except ValueError:
        v = None
    if v is None or not (np.isfinite(v) and v >= 1):
        raise ValueError(f"--clip must be a number >= 1 (times the median update norm) or 'none', "
                         f"got {text!r}")
    return v


def run_inspect(args) -> int:
    from ..outdir import check_output_file, write_file

    summary = None
    if args.summary is not None:
        summary = _read_summary(args.summary)
    elif args.figure is not None:
        raise ValueError("--figure needs --summary (an aggregate's summary.json)")
    if args.figure is not None:       # before any work: never an input, nor an existing file
        check_output_file(args.figure, overwrite=args.overwrite,
                          inputs=[*args.dirs, args.summary])
        _check_figure_format(args.figure)
    adapters = _load(args, split_parts=True)       # the files as they are, a split output's parts too
    if summary is not None:
        _check_summary(summary, args.summary, adapters)
    K = adapters.n_clients
    print(f"{K} clients: {', '.join(adapters.names)}; {len(adapters.modules)} modules")
    print(f"{'module':60s} {'out x in':>12s} {'ranks':>14s} {'q′ x p′':>9s} "
          f"{'||ΔW_k||_F min..max':>22s}")
    for m in adapters.modules:
        f = adapters.factors(m)
        red = reduce_module(f)
        norms = np.sqrt(np.einsum("kij,kij->k", red.M, red.M))
        ranks = sorted(set(f.ranks))
        # every update zero: the reduction keeps a 1-D zero placeholder, but the data span nothing
        dims = red.dims if norms.any() else (0, 0)
        print(f"{m[-60:]:60s} {f.shape[0]:>5d} x {f.shape[1]:<5d} "
              f"{','.join(map(str, ranks)):>14s} {dims[0]:>4d}x{dims[1]:<4d} "
              f"{norms.min():>10.4g}..{norms.max():<10.4g}" + ("" if norms.any() else "  (every update is zero)"))
    if summary is not None:
        mods = adapters.modules
        # what each module's refinement used (the client rule's decision), and each module's own set (8)
        applied = all(isinstance(summary["modules"][m].get("benign_applied"), list) for m in mods)
        key = "benign_applied" if applied else "benign"
        flags = np.array([[not b for b in summary["modules"][m][key]] for m in mods])
        own = np.array([[not b for b in summary["modules"][m]["benign"]] for m in mods])
        rule = summary.get("client_rule") or "per-module"
        if applied:
            print(f"left out of the collaborative set, modules per client (the {rule} rule, what the "
                  "refinement used):", dict(zip(summary["clients"], flags.sum(axis=0).tolist())))
        else:
            print(f"warning: --summary {args.summary} records no benign_applied (an older lowrank-fl "
                  "wrote it): showing each module's own set of CLAIR's (8)", file=sys.stderr)
        print("outside each module's own set of CLAIR's (8), modules per client:",
              dict(zip(summary["clients"], own.sum(axis=0).tolist())))
        if args.figure is not None:
            title = (f"CLAIR ({rule} rule): red = left out of the collaborative set" if applied else
                     "CLAIR, each module's set (8): red = excluded from it")
            write_file(args.figure, lambda tmp: _heatmap(flags, summary["clients"], mods, tmp, title),
                       overwrite=args.overwrite)
            print(f"heatmap: {args.figure}")
    return 0


def _check_figure_format(path: Path) -> None:
    """``--figure``'s suffix must be a format matplotlib saves (checked before any work)."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in formats:
        raise ValueError(f"--figure {path}: {('no suffix' if not fmt else repr(fmt) + ' is not a figure format')}; "
                         f"use one of {', '.join('.' + f for f in sorted(formats))}")


def _file_arg(text: str) -> Path:
    """A file path argument; '' is refused here (``Path('')`` would read as the working folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must name a file, got ''")
    return Path(text)


def _read_summary(path: Path) -> dict:
    if Path(path).is_dir():
        raise AdapterError(f"--summary {path} is a directory; give the summary.json file an aggregate wrote "
                           f"({Path(path) / 'summary.json'})")
    if not Path(path).is_file():
        raise AdapterError(f"--summary {path}: no such file (the summary.json an aggregate wrote)")
    try:
        summary = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AdapterError(f"--summary {path}: not JSON ({exc}); expected the summary.json an "
                           "aggregate wrote") from None
    if (not isinstance(summary, dict) or not isinstance(summary.get("clients"), list)
            or not isinstance(summary.get("modules"), dict)):
        raise AdapterError(f"--summary {path}: not an aggregate's summary.json (no 'clients' list "
                           "and 'modules' object)")
    return summary


def _first(names, n: int = 5) -> str:
    """The first ``n`` names as a list, with "..." when there are more."""
    return str(list(names[:n]))[:-1] + (", ...]" if len(names) > n else "]")


def _check_summary(summary: dict, path, adapters) -> None:
    """The summary must come from an aggregate of these clients (names, order) and modules."""
    if summary["clients"] != adapters.names:
        raise AdapterError(f"--summary {path}: written for {len(summary['clients'])} clients "
                           f"{_first(summary['clients'])}, but the directories given are "
                           f"{adapters.n_clients} clients {_first(adapters.names)}; pass the same "
                           "directories (and --names) as the aggregate")
    recorded = summary.get("input_sha256")
    if not isinstance(recorded, dict):
        print(f"warning: --summary {path} records no input fingerprints (an older lowrank-fl "
              "wrote it): cannot check that it was written for these adapters", file=sys.stderr)
    else:
        for c in adapters.clients:
            if recorded.get(c.name) != adapter_fingerprint(c.path):
                raise AdapterError(f"--summary {path}: client {c.name!r} ({c.path}) is not the "
                                   "adapter this summary was written for (its files' sha256 "
                                   "differs); pass the aggregate's own client directories")
    differ = sorted(set(adapters.modules) ^ set(summary["modules"]))
    if differ:
        raise AdapterError(f"--summary {path}: its modules differ from the adapters' "
                           f"({len(summary['modules'])} vs {len(adapters.modules)}; e.g. "
                           f"{differ[0]!r})")
    if summary.get("method") != "clair" or any(
            not isinstance(summary["modules"][m].get("benign"), list) for m in adapters.modules):
        raise AdapterError(f"--summary {path}: method {summary.get('method')!r} has no detection "
                           "by CLAIR's (8); the heatmap needs a CLAIR aggregate's summary")


def _listed(names, most: int = 10) -> str:
    """``a, b, c``; beyond ``most`` names the first and last few and the count (K = 100 prints one line)."""
    if len(names) <= most:
        return ", ".join(names)
    return f"{len(names)} adapters ({', '.join(names[:3])}, ..., {', '.join(names[-2:])})"


def _heatmap(flags, clients, modules, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 0.08 * len(modules) + 2), 0.35 * len(clients) + 1.5))
    ax.imshow(flags.T, aspect="auto", cmap="Reds", vmin=0, vmax=1, interpolation="nearest")
    ax.set_yticks(range(len(clients)), clients)
    # integer ticks at the modules (matplotlib's default reads -0.5 ... 3.5 on a few modules);
    # their names where they fit, else their indices
    step = max(1, len(modules) // 20)
    ticks = range(0, len(modules), step)
    named = len(modules) <= 12
    ax.set_xticks(ticks, [modules[i].split("model.")[-1] if named else str(i) for i in ticks],
                  rotation=90 if named else 0, fontsize=7 if named else None)
    ax.set_xlabel("module" if named else f"module (0..{len(modules) - 1})")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
