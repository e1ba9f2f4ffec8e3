"""``lowrank-fl adapters synthetic``: a small synthetic federation of PEFT adapters to try the
other commands on (:func:`lowrank_fl.adapters.synthetic.write_synthetic_adapters` behind it).

The folder is written like every output of the command line (:class:`lowrank_fl.outdir.OutputDir`:
staged, swapped in whole, replaced only with ``--overwrite`` and only when a previous lowrank-fl
run wrote it), and holds ``client_00`` ... and ``truth.json``, which names the contaminated clients.
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

from ..jsontext import strict_dumps
from ..outdir import OutputDir

__all__ = ["add_synthetic_parser", "run_synthetic", "TRUTH"]

#: the file naming the contaminated clients (beside the client folders)
TRUTH = "truth.json"
_FLAGS = {"n_clients": "--clients", "n_layers": "--layers", "contaminated": "--contaminated", "rank": "--rank",
          "shape": "--shape", "delta": "--delta", "modules": "--modules", "seed": "--seed"}
_FLAG = re.compile(r"\b(" + "|".join(_FLAGS) + r")\b")


def _shape(text: str) -> tuple[int, int]:
    try:
        out, inp = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected OUTxIN, e.g. 64x48, got {text!r}") from None
    return out, inp


def add_synthetic_parser(sub) -> argparse.ArgumentParser:
    """Add ``synthetic`` to the ``adapters`` sub-parsers."""
    syn = sub.add_parser("synthetic", help="write a small synthetic federation of PEFT adapters (to try the "
                                           "other commands on)",
                         description="Clients share one row space per module (A = A0 + a misalignment of "
                                     "relative size --delta); the last --contaminated clients have an "
                                     "unrelated A; every B is independent noise (no shared direction). "
                                     "The defaults take about a second.")
    syn.add_argument("--out", type=Path, required=True,
                     help="folder to create (client_00, ... and truth.json); an existing one only with "
                          "--overwrite, and only if lowrank-fl wrote it")
    syn.add_argument("--clients", type=int, default=10, help="number of clients, at least 2 (default 10)")
    syn.add_argument("--contaminated", type=int, default=1,
                     help="contaminated clients, the last ones (default 1)")
    syn.add_argument("--layers", type=int, default=2, help="transformer layers (default 2)")
    syn.add_argument("--modules", default="q_proj,v_proj",
                     help="projections per layer, comma-separated (default q_proj,v_proj)")
    syn.add_argument("--shape", type=_shape, default=(64, 64), help="OUTxIN of every module (default 64x64)")
    syn.add_argument("--rank", type=int, default=4, help="LoRA rank (default 4)")
    syn.add_argument("--delta", type=float, default=0.05,
                     help="benign misalignment ||A_k - A0|| / ||A0|| (default 0.05)")
    syn.add_argument("--dtype", choices=("float16", "float32"), default="float16",
                     help="storage dtype (default float16)")
    syn.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    syn.add_argument("--overwrite", action="store_true", help="replace a previous lowrank-fl output at --out")
    syn.set_defaults(handler=run_synthetic)
    return syn


def run_synthetic(args) -> int:
    """Handler of ``lowrank-fl adapters synthetic``."""
    from .synthetic import write_synthetic_adapters

    if args.clients < 2:                 # the Python generator writes one (a test input); nothing aggregates it
        raise ValueError(f"--clients must be at least 2 (every aggregation needs two), got {args.clients}")
    if args.seed < 0:
        raise ValueError(f"--seed must be an integer >= 0, got {args.seed}")
    modules = [m.strip() for m in args.modules.split(",") if m.strip()]
    settings = {"n_clients": args.clients, "n_layers": args.layers, "modules": modules, "shape": list(args.shape),
                "rank": args.rank, "contaminated": args.contaminated, "delta": args.delta, "dtype": args.dtype,
                "seed": args.seed}
    with OutputDir(args.out, command="adapters synthetic", overwrite=args.overwrite) as staged:
        try:
            dirs = write_synthetic_adapters(staged.dir, **{**settings, "shape": tuple(args.shape)})
        except ValueError as exc:            # the Python argument's name -> the option's
            raise ValueError(_FLAG.sub(lambda m: _FLAGS[m.group(0)], str(exc))) from None
        names = [d.name for d in dirs]
        bad = names[len(names) - args.contaminated:] if args.contaminated else []
        truth = {"clients": names, "contaminated": bad, "settings": settings,
                 "written_by": "lowrank_fl.adapters.synthetic.write_synthetic_adapters"}
        (staged.dir / TRUTH).write_text(strict_dumps(truth, indent=1) + "\n")
        staged.commit()
    who = f"{', '.join(bad)} contaminated (an unrelated A)" if bad else "none contaminated"
    listed = ", ".join(names) if len(names) <= 3 else f"{names[0]} ... {names[-1]}"
    print(f"wrote {len(names)} client adapters ({listed}; {who}) and {TRUTH} to {args.out}")
    print(f"next: lowrank-fl adapters aggregate {Path(args.out) / 'client_*'} --out OUT")
    return 0
