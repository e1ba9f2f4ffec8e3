import os

import matplotlib

matplotlib.use("Agg")
os.environ.setdefault("MPLBACKEND", "Agg")

import pytest


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
