import numpy as np
import pytest

from verify.conditions import Condition
from verify.conditions import flute as cf


def _by_name(conds):
    return {c.name: c for c in conds}


def test_generate_is_reproducible_and_has_the_arrays():
    a, b = cf.generate(seed=3), cf.generate(seed=3)
    np.testing.assert_array_equal(a["Phi"], b["Phi"])
    np.testing.assert_array_equal(a["B0"], b["B0"])
    assert a["Phi"].shape == (10, 15) and a["B0"].shape == (10, 2) and a["W0"].shape == (15, 2)
    assert a["init_scale"] == pytest.approx(0.01)


def test_evaluate_app_c_instance():
    conds = cf.evaluate(cf.generate(seed=0))
    assert all(isinstance(c, Condition) for c in conds)
    c = _by_name(conds)
    gap = c["spectral gap Delta = 2(lambda_k - lambda_(k+1))"]
    assert gap.holds and gap.value == pytest.approx(2 * (20 / 3 - 5), rel=1e-10)
    assert c["under-parameterized (rank(Phi) > k)"].holds
    assert c["gamma1 = 1/4, gamma2 = 1/8"].holds
    # App. C's eta = 0.03 is far above the theory bound (~3.9e-5 for k = 2)
    binding = c["step size eta <= Delta^2 / (36 lambda*_1^3) = Delta^2/(288 lambda_1^3)"]
    assert binding.holds is False and "3.86e-05" in binding.required
    assert c["init scale alpha <~ 1/(10 d)"].holds
    rate = c["contraction factor 1 - eta Delta / 16"]
    assert rate.value == pytest.approx(1 - 0.03 * gap.value / 16)
    entry = c["entry time T_R into region R"]
    assert entry.holds and 0 < entry.value < 1000
    assert c["sigma_k^2(Theta_k^0) <= Delta/4"].holds           # Claim A.3 at alpha = 1/(10 d)
    n55 = [x for x in conds if x.theorem == "Thm 5.5" and x.name.startswith("samples")][0]
    assert n55.holds is None and "unknown" in n55.note


def test_evaluate_flags_violations():
    inst = cf.generate(seed=0, gamma1=0.8, step_size=1e-6, init_scale=0.5)
    c = _by_name(cf.evaluate(inst))
    assert c["objective bounded below (gamma1 < 2 gamma2 + a, a = 1/2)"].holds is False
    assert c["gamma1 = 1/4, gamma2 = 1/8"].holds is False
    assert c["step size eta <= Delta^2 / (36 lambda*_1^3) = Delta^2/(288 lambda_1^3)"].holds
    assert c["init scale alpha <~ 1/(10 d)"].holds is False
    over = cf.evaluate(cf.generate(seed=0, k=3, spectrum=[5.0, 3.0, 2.0]))
    assert _by_name(over)["under-parameterized (rank(Phi) > k)"].holds is False


def test_evaluate_errors():
    inst = cf.generate(seed=0)
    with pytest.raises(ValueError, match="step_size must be finite and > 0"):
        cf.evaluate({**inst, "step_size": 0.0})
    with pytest.raises(ValueError, match="Phi must have 2 dimensions"):
        cf.evaluate({**inst, "Phi": np.ones(3)})
    with pytest.raises(ValueError, match="B0 must have shape"):
        cf.evaluate({**inst, "B0": np.ones((3, 2))})
