"""pytest plugin of ``--target tests``: apply one mutant for the whole test session.

``python -m pytest -p verify.mutants.plugin ...`` with the environment variable
:data:`verify.mutants.pytest_mode.ENV` naming a mutant of :data:`verify.mutants.pytest_mode.ALL_MUTANTS` patches the library
(:func:`verify.mutants.harness.apply`) before any test module is collected, so the tests import
and call the mutated objects; without the variable the plugin does nothing (the baseline run).
The patch lives in the pytest process only: the working tree is never modified.
"""
from __future__ import annotations

import os

from .pytest_mode import ALL_MUTANTS, ENV

_ACTIVE: list = []


def pytest_configure(config):
    mutant_id = os.environ.get(ENV)
    if not mutant_id:
        return
    from .harness import apply

    if mutant_id not in ALL_MUTANTS:
        raise ValueError(f"{ENV}={mutant_id!r} is not a catalogued mutant")
    ctx = apply(ALL_MUTANTS[mutant_id])
    ctx.__enter__()
    _ACTIVE.append(ctx)
    config.add_cleanup(lambda: _ACTIVE.pop().__exit__(None, None, None))


def pytest_report_header(config):
    mutant_id = os.environ.get(ENV)
    return f"lowrank_fl mutant applied: {mutant_id}" if mutant_id else None
