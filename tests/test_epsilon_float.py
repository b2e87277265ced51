"""`renyi.epsilon` is float-like: float(report) is the tightest sound ε, details on attributes."""

import math

import pytest

import renyi
from renyi.accountants import PldAccountant, RdpAccountant
from renyi.errors import UnsupportedEventError
from renyi.events import GaussianEvent, PoissonSampledEvent


def test_float_is_the_tightest_upper_bound_and_table_still_prints():
    kw = {"noise_multiplier": 1.1, "sample_rate": 0.01, "steps": 500, "delta": 1e-5}
    rep = renyi.epsilon(**kw)
    step = PoissonSampledEvent(0.01, GaussianEvent(1.1))
    rdp = RdpAccountant().compose(step, 500).epsilon(1e-5).epsilon
    pld = PldAccountant().compose(step, 500).epsilon(1e-5).epsilon
    assert float(rep) == rep.epsilon == min(r.epsilon for r in rep.results)
    assert float(rep) <= min(rdp, pld) + 1e-12 and rep.accountant in {"pld", "rdp", "approx"}
    assert rep < rdp + 1e-9 and rep <= float(rep) and rep > 0 and rep >= float(rep)
    assert f"{rep:.3f}" == f"{float(rep):.3f}"
    text = str(rep)
    assert text.splitlines()[0].startswith(f"epsilon = {float(rep):.6g} at delta = 1e-05")
    assert rep.accountant in text.splitlines()[0] and "rdp" in text  # the table is still there
    assert math.isclose(float(rep), rep.best().epsilon)


def test_no_applicable_accountant_is_our_error():
    rep = renyi.epsilon(noise_multiplier=1.0, delta=1e-5, accountants=[])
    with pytest.raises(UnsupportedEventError, match="no accountant applies"):
        float(rep)
