"""``python -m verify.mutants --target tests``: each mutant against the test files that cover it.

For every mutant with a ``tests`` mapping (:attr:`verify.mutants.harness.Mutant.tests`), a fresh
``python -m pytest`` process runs those files with the mutant applied by
:mod:`verify.mutants.plugin` (environment variable :data:`~verify.mutants.plugin.ENV`). The mutant
is *caught* when pytest reports failing tests (exit status 1); ``caught_by`` lists the failing
test ids (the first one with ``-x``, the default), and their files in ``caught_by_files``. Exit
status 0 is an escape; any other (collection error, usage error, no tests) is an ``error``; a run
past ``--timeout`` is ``timeout`` (counted as caught, and flagged). A baseline run of the union of
the files, without a mutant, must pass first: otherwise nothing is attributed to a mutant. A run
that ends in an ``error`` is retried once (a transient failure of the environment, such as a
package being reinstalled, must not count as a verdict on the tests).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .catalogue import CATALOGUE
from .tests_catalogue import TESTS_CATALOGUE

__all__ = ["ENV", "ALL_MUTANTS", "TestsOutcome", "covered", "run_pytest", "run_tests_mutant",
           "tests_main"]

#: environment variable naming the mutant :mod:`verify.mutants.plugin` applies
ENV = "LOWRANK_FL_MUTANT"

#: every mutant the plugin can apply (claims catalogue and tests catalogue; ids are unique)
ALL_MUTANTS = {**CATALOGUE, **TESTS_CATALOGUE}
if len(ALL_MUTANTS) != len(CATALOGUE) + len(TESTS_CATALOGUE):
    raise ValueError("mutant ids of the two catalogues must be distinct")

_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+?\.py\S*)", re.MULTILINE)


def covered() -> dict:
    """Mutants that have covering test files, by id."""
    return {k: m for k, m in ALL_MUTANTS.items() if m.tests}


@dataclass
class TestsOutcome:
    mutant: str
    target: str
    description: str
    tests: list
    outcome: str                      # "caught", "escaped", "timeout", "error"
    caught_by: list = field(default_factory=list)
    caught_by_files: list = field(default_factory=list)
    seconds: float = 0.0
    returncode: int | None = None
    detail: str = ""

    @property
    def escaped(self) -> bool:
        return self.outcome in ("escaped", "error")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["seconds"] = round(self.seconds, 2)
        d["escaped"] = self.escaped
        return d


def run_pytest(files, *, root: Path, mutant: str | None, timeout: float,
               stop_first: bool = True) -> tuple[int | None, str, float]:
    """Run ``files`` in a fresh pytest process (the mutant applied when given);
    ``(returncode or None on timeout, output, seconds)``."""
    env = dict(os.environ)
    env.pop(ENV, None)
    if mutant is not None:
        env[ENV] = mutant
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider",
           "-p", "verify.mutants.plugin", "-W", "ignore::DeprecationWarning",
           *(["-x"] if stop_first else []), *files]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return None, out, time.perf_counter() - t0
    return proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - t0


def run_tests_mutant(mutant, *, root: Path, timeout: float = 900.0,
                     stop_first: bool = True) -> TestsOutcome:
    """Run ``mutant.tests`` under ``mutant`` (:func:`run_pytest`) and classify the result."""
    if not mutant.tests:
        raise ValueError(f"mutant {mutant.id!r} has no covering test files (Mutant.tests)")
    missing = [f for f in mutant.tests if not (root / f).is_file()]
    if missing:
        raise ValueError(f"mutant {mutant.id!r}: test file(s) not found: {missing}")
    rc, out, seconds = run_pytest(mutant.tests, root=root, mutant=mutant.id, timeout=timeout,
                                  stop_first=stop_first)
    if rc not in (0, 1, None):                     # retried once: see the module docstring
        rc, out, again = run_pytest(mutant.tests, root=root, mutant=mutant.id, timeout=timeout,
                                    stop_first=stop_first)
        seconds += again
    res = TestsOutcome(mutant=mutant.id, target=mutant.target, description=mutant.description,
                       tests=list(mutant.tests), outcome="error", seconds=seconds, returncode=rc)
    if rc is None:
        res.outcome, res.detail = "timeout", f"no result within {timeout:g} s"
    elif rc == 1:
        res.outcome = "caught"
        res.caught_by = sorted(set(_FAILED.findall(out)))
        res.caught_by_files = sorted({c.split("::")[0] for c in res.caught_by})
    elif rc == 0:
        res.outcome = "escaped"
    else:
        tail = [ln for ln in out.strip().splitlines() if ln.strip()][-3:]
        res.detail = f"pytest exit status {rc}: " + " | ".join(tail)
    return res


def tests_main(args) -> int:
    """The ``--target tests`` command (arguments parsed by :mod:`verify.mutants.__main__`)."""
    pool = covered()
    unknown = [m for m in args.mutant if m not in pool]
    if unknown:
        print(f"verify.mutants: error: --mutant {unknown[0]!r} has no covering tests "
              f"(known: {', '.join(pool)})", file=sys.stderr)
        return 2
    chosen = [pool[m] for m in (args.mutant or pool)]
    root = Path(args.root).resolve()
    files = sorted({f for m in chosen for f in m.tests})
    print(f"baseline: {len(files)} test files without a mutant ...", flush=True)
    rc, out, seconds = run_pytest(files, root=root, mutant=None, timeout=args.timeout,
                                  stop_first=True)
    if rc != 0:
        tail = "\n".join(out.strip().splitlines()[-15:])
        print(f"verify.mutants: error: the covering tests fail without a mutant (exit {rc}); "
              f"nothing can be attributed to a mutant:\n{tail}", file=sys.stderr)
        return 1
    print(f"baseline passed in {seconds:.1f} s", flush=True)
    from joblib import Parallel, delayed

    parallel = Parallel(n_jobs=args.jobs, backend="threading" if args.jobs > 1 else "sequential",
                        return_as="generator")
    width = max(len(m.id) for m in chosen)
    rows = []
    for r in parallel(delayed(run_tests_mutant)(m, root=root, timeout=args.timeout) for m in chosen):
        rows.append(r.to_dict())
        by = ", ".join(r.caught_by_files) or r.detail or "-"
        print(f"{r.mutant:<{width}}  {r.outcome.upper():<8} {r.seconds:7.1f} s  {by}", flush=True)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {"target": "tests", "baseline_seconds": round(seconds, 2), "mutants": rows,
           "seconds": round(seconds + sum(r["seconds"] for r in rows), 2)}
    (out_dir / "mutants_tests.json").write_text(json.dumps(doc, indent=2) + "\n")
    escaped = [r["mutant"] for r in rows if r["escaped"]]
    print(f"{len(rows) - len(escaped)}/{len(rows)} mutants caught by the tests in "
          f"{doc['seconds']:.0f} s" + (f"; escaped: {', '.join(escaped)}" if escaped else ""))
    return 1 if (args.strict and escaped) else 0
