"""Compare two reports: ``lowrank-fl report diff A/results.json B/results.json``.

Lists the claims whose verdict changed, claims present in only one report, and the numbers of
``measured`` / ``predicted`` that moved by more than a relative tolerance (e.g. quick vs full
scale, or before and after a code change). Non-finite values (``null`` in the JSON, with the
claim's ``nonfinite`` note) compare by what they stood for.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .values import fmt_number

__all__ = ["Change", "ReportDiff", "diff_reports", "load_results", "report_problem", "format_diff",
           "add_parser", "cmd_diff"]


@dataclass(frozen=True)
class Change:
    """One value that differs: ``claim``, JSON ``pointer`` inside the claim, ``old`` and ``new``."""

    claim: str
    pointer: str
    old: object
    new: object


@dataclass
class ReportDiff:
    """Differences between report ``a`` and report ``b`` (``b`` is the newer or larger one)."""

    a: dict
    b: dict
    verdicts: list = field(default_factory=list)     # (claim id, old verdict, new verdict)
    only_a: list = field(default_factory=list)       # claim ids
    only_b: list = field(default_factory=list)
    numbers: list = field(default_factory=list)      # Change
    compared: int = 0                                # claims present in both

    @property
    def identical(self) -> bool:
        return not (self.verdicts or self.only_a or self.only_b or self.numbers)


_EXPECTED = "expected a results.json written by `lowrank-fl verify` (or its report directory)"


def _json_type(value) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
             type(None): "null", int: "a number", float: "a number"}
    return names.get(type(value), type(value).__name__)


def report_problem(doc) -> str | None:
    """What keeps ``doc`` (parsed JSON) from being a report :func:`diff_reports` can read, or
    ``None``. Checks the parts the diff uses (a subset of ``results.schema.json``): an object
    whose ``claims`` is a list of objects with string ``id`` and ``verdict``, ``measured`` /
    ``predicted`` / ``nonfinite`` objects (or null)."""
    if not isinstance(doc, dict):
        return f"the top level is {_json_type(doc)}, not an object with a 'claims' list"
    if "claims" not in doc:
        keys = ", ".join(map(repr, list(doc)[:5])) + (", ..." if len(doc) > 5 else "")
        return f"it has no 'claims' list (keys: {keys or 'none'})"
    claims = doc["claims"]
    if not isinstance(claims, list):
        return f"'claims' is {_json_type(claims)}, not a list of claims"
    for i, c in enumerate(claims):
        where = f"claims[{i}]"
        if not isinstance(c, dict):
            return f"{where} is {_json_type(c)}, not an object with 'id' and 'verdict'"
        for key in ("id", "verdict"):
            if key not in c:
                return f"{where} has no '{key}'"
            if not isinstance(c[key], str):
                return f"{where}.{key} is {_json_type(c[key])}, not a string"
        for key in ("measured", "predicted", "nonfinite"):
            if c.get(key) is not None and not isinstance(c[key], dict):
                return f"{where} ({c['id']}).{key} is {_json_type(c[key])}, not an object"
    return None


def load_results(path) -> dict:
    """A ``results.json`` (or the report directory holding one).

    ``FileNotFoundError`` when there is no such file, ``ValueError`` when it is unreadable, not
    JSON or not a report (:func:`report_problem`); both name the file and what was expected.
    """
    given = Path(path)
    path = given / "results.json" if given.is_dir() else given
    if not path.is_file():
        what = (f"the directory {given} has no results.json" if given.is_dir() else
                f"{given} is not a file" if given.exists() else f"{given} does not exist")
        raise FileNotFoundError(f"{what}; {_EXPECTED}")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a report: not UTF-8 text (a binary file?); "
                         f"{_EXPECTED}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not a report: not JSON ({exc.msg} at line {exc.lineno} "
                         f"column {exc.colno}); {_EXPECTED}") from None
    problem = report_problem(doc)
    if problem is not None:
        raise ValueError(f"{path} is not a report: {problem}; {_EXPECTED}")
    return doc


def _restore(value, nonfinite: dict, pointer: str):
    """The value with ``null``s the ``nonfinite`` note explains turned back into floats."""
    if value is None and pointer in nonfinite:
        return float(nonfinite[pointer])
    return value


def _leaves(value, pointer: str, nonfinite: dict, out: dict) -> dict:
    if isinstance(value, dict):
        for k, v in value.items():
            _leaves(v, f"{pointer}/{str(k).replace('~', '~0').replace('/', '~1')}", nonfinite, out)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _leaves(v, f"{pointer}/{i}", nonfinite, out)
    else:
        out[pointer] = _restore(value, nonfinite, pointer)
    return out


def _differs(x, y, rtol: float, atol: float) -> bool:
    numeric = (isinstance(x, (int, float)) and not isinstance(x, bool)
               and isinstance(y, (int, float)) and not isinstance(y, bool))
    if not numeric:
        return x != y
    x, y = float(x), float(y)
    if math.isnan(x) or math.isnan(y):
        return not (math.isnan(x) and math.isnan(y))
    if math.isinf(x) or math.isinf(y):
        return x != y
    return abs(x - y) > atol + rtol * max(abs(x), abs(y))


def diff_reports(a: dict, b: dict, *, rtol: float = 1e-6, atol: float = 0.0) -> ReportDiff:
    """Compare two loaded ``results.json`` documents (see :func:`load_results`)."""
    if rtol < 0 or atol < 0:
        raise ValueError(f"rtol and atol must be >= 0, got rtol={rtol}, atol={atol}")
    ca = {c["id"]: c for c in a["claims"]}
    cb = {c["id"]: c for c in b["claims"]}
    out = ReportDiff(a=a, b=b)
    out.only_a = [i for i in ca if i not in cb]
    out.only_b = [i for i in cb if i not in ca]
    for cid in (i for i in ca if i in cb):
        x, y = ca[cid], cb[cid]
        out.compared += 1
        vx = x["verdict"] + (" (error)" if x.get("error") else "")
        vy = y["verdict"] + (" (error)" if y.get("error") else "")
        if vx != vy:
            out.verdicts.append((cid, vx, vy))
        for part in ("measured", "predicted"):
            lx = _leaves(x.get(part) or {}, f"/{part}", x.get("nonfinite") or {}, {})
            ly = _leaves(y.get(part) or {}, f"/{part}", y.get("nonfinite") or {}, {})
            for ptr in list(lx) + [p for p in ly if p not in lx]:
                old, new = lx.get(ptr, "(absent)"), ly.get(ptr, "(absent)")
                if _differs(old, new, rtol, atol):
                    out.numbers.append(Change(cid, ptr, old, new))
    return out


def _show(v) -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return fmt_number(v)
    return str(v)


def format_diff(d: ReportDiff, *, names=("A", "B"), max_numbers: int = 20) -> str:
    """Text listing of a :class:`ReportDiff` (``max_numbers`` changed values shown per claim)."""
    if isinstance(max_numbers, bool) or not isinstance(max_numbers, int) or max_numbers < 0:
        raise ValueError(f"max_numbers must be an integer >= 0, got {max_numbers!r}")
    a, b = names
    lines = [f"{name}: {_header(doc)}" for name, doc in ((a, d.a), (b, d.b))] + [""]
    if d.identical:
        lines.append(f"No differences in the {_n(d.compared, 'claim')} compared.")
        return "\n".join(lines) + "\n"
    lines.append(f"Verdict changes ({len(d.verdicts)} of {_n(d.compared, 'claim')}):")
    lines += [f"  {cid}: {old} -> {new}" for cid, old, new in d.verdicts] or ["  none"]
    for label, ids in ((f"Only in {a}", d.only_a), (f"Only in {b}", d.only_b)):
        if ids:
            lines += ["", f"{label} ({len(ids)}):"] + [f"  {i}" for i in ids]
    by_claim: dict = {}
    for ch in d.numbers:
        by_claim.setdefault(ch.claim, []).append(ch)
    lines += ["", f"Changed values ({len(d.numbers)} in {_n(len(by_claim), 'claim')}):"]
    if not by_claim:
        lines.append("  none")
    for cid, changes in by_claim.items():
        lines.append(f"  {cid}:")
        for ch in changes[:max_numbers]:
            lines.append(f"    {ch.pointer}: {_show(ch.old)} -> {_show(ch.new)}")
        if len(changes) > max_numbers:
            lines.append(f"    ... and {len(changes) - max_numbers} more")
    return "\n".join(lines) + "\n"


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _header(doc: dict) -> str:
    """What a report ran: scale, base seed (two seeds differ in every measured value), claims,
    commit."""
    seed = doc.get("base_seed")
    return (f"scale {doc.get('scale', '?')}" + (f", base seed {seed}" if seed is not None else "")
            + f", {_n(len(doc['claims']), 'claim')}" + _commit(doc))


def _commit(doc: dict) -> str:
    git = (doc.get("provenance") or {}).get("git") if isinstance(doc.get("provenance"), dict) else None
    if not isinstance(git, dict) or not isinstance(git.get("commit"), str):
        return ""
    return f", commit {git['commit'][:10]}" + (" (dirty)" if git.get("dirty") else "")


# ----------------------------------------------------------------------------- command line
def add_parser(subparsers) -> None:
    """Add ``report diff`` to the ``lowrank-fl`` sub-command parsers."""
    report = subparsers.add_parser("report", help="work with written reports (diff)")
    sub = report.add_subparsers(dest="report_command", metavar="COMMAND", required=True)
    p = sub.add_parser("diff", help="verdict and number changes between two results.json",
                       description="List verdict changes, claims in only one report, and "
                                   "measured/predicted values that differ between two reports.")
    p.add_argument("a", type=Path, metavar="A/results.json", help="first report (file or directory)")
    p.add_argument("b", type=Path, metavar="B/results.json", help="second report (file or directory)")
    p.add_argument("--rtol", type=float, default=1e-6,
                   help="relative tolerance below which numbers count as equal (default: 1e-6)")
    p.add_argument("--atol", type=float, default=0.0, help="absolute tolerance (default: 0)")
    p.add_argument("--max-values", type=_count, default=20,
                   help="changed values shown per claim, >= 0 (default: 20)")
    p.add_argument("--strict", action="store_true",
                   help="exit with status 1 if any verdict changed or a claim is in one report only")
    p.set_defaults(handler=cmd_diff)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def cmd_diff(args) -> int:
    """Handler of ``lowrank-fl report diff``."""
    d = diff_reports(load_results(args.a), load_results(args.b), rtol=args.rtol, atol=args.atol)
    sys.stdout.write(format_diff(d, names=(str(args.a), str(args.b)), max_numbers=args.max_values))
    return 1 if args.strict and (d.verdicts or d.only_a or d.only_b) else 0


def main(argv=None) -> int:
    """``python -m verify.report.diff A B`` (same as ``lowrank-fl report diff A B``)."""
    parser = argparse.ArgumentParser(prog="python -m verify.report.diff")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(["report", "diff", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.handler(args)
    except (ValueError, OSError) as exc:
        print(f"report diff: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
