import os

import matplotlib

matplotlib.use("Agg")
os.environ.setdefault("MPLBACKEND", "Agg")

import pytest

#: set (to 1) where every platform feature and extra the tests can use is present (CI: Linux, all
#: extras): a test that would be skipped there fails instead, so a guard cannot hide a test
NO_SKIPS = "LOWRANK_FL_NO_SKIPS"


def _fail_skip(report, what: str) -> None:
    if report.skipped and os.environ.get(NO_SKIPS) == "1" and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"{what} skipped although {NO_SKIPS}=1 (this environment should run it): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_skip(outcome.get_result(), "test")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_skip(outcome.get_result(), "module")


@pytest.fixture
def dummy_registry(monkeypatch):
    """Only the dummy claims of ``_dummy_tasks`` (and one omitted claim) are registered; the paper
    modules are not loaded. The registry is restored afterwards."""
    from _dummy_tasks import dummy_claims
    from verify import cli as vcli
    from verify.claim import OMITTED, REGISTRY, Omitted

    saved, saved_omitted = dict(REGISTRY), dict(OMITTED)
    REGISTRY.clear()
    OMITTED.clear()
    REGISTRY.update({c.id: c for c in dummy_claims()})
    OMITTED["clair.prop9.gap"] = Omitted(id="clair.prop9.gap", paper="clair", reference="Prop. 9",
                                         statement="A gap.", reason="no closed form")
    monkeypatch.setattr(vcli, "_load_claims", lambda papers: None)
    yield
    REGISTRY.clear()
    OMITTED.clear()
    REGISTRY.update(saved)
    OMITTED.update(saved_omitted)
