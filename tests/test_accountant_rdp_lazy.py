"""The RDP accountant's lazy order search returns exactly the full-grid answer.

``RdpAccountant.epsilon`` evaluates the Poisson-subsampled Gaussian only at the orders its
monotonicity/convexity bounds cannot rule out; these tests compare it, bit for bit, with the
conversion of the fully evaluated curve (``acc.curve.to_dp``), on randomised settings.
"""

import json
import math
import zlib

import numpy as np
import pytest

import renyi.analysis.subsampling as sub
from renyi.accountants import RdpAccountant
from renyi.accountants import rdp as rdp_mod
from renyi.conversions import rdp_to_dp
from renyi.curves import DEFAULT_ORDERS
from renyi.errors import PrivacyParameterError, UnsupportedEventError
from renyi.events import (
    ApproxDpEvent,
    ComposedEvent,
    CustomEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledEvent,
    SelfComposedEvent,
)

GRIDS = {
    "default": DEFAULT_ORDERS,
    "fractional": np.arange(1.05, 40.0, 0.25),  # no integer order at all
    "integers": np.arange(2.0, 200.0),
    "with_inf": np.concatenate([np.linspace(1.5, 30.0, 58), [64.0, 256.0, math.inf]]),
}


def _full(acc: RdpAccountant, delta: float) -> tuple[float, float]:
    curve = acc.curve
    return rdp_to_dp(curve.orders, curve.epsilons, delta)


def _lazy_and_full(events, grid, delta):
    lazy = RdpAccountant(grid)
    full = RdpAccountant(grid)
    for event, count in events:
        lazy.compose(event, count)
        full.compose(event, count)
    res = lazy.epsilon(delta)
    return res, _full(full, delta)


def _random_events(rng):
    q = float(10 ** rng.uniform(-4, -0.1))
    sigma = float(10 ** rng.uniform(-0.3, 1.3))
    steps = int(10 ** rng.uniform(0, 5))
    base = PoissonSampledEvent(q, GaussianEvent(sigma))
    kind = rng.integers(5)
    if kind == 0:
        return [(base, steps)]
    if kind == 1:  # a second sampled Gaussian and a Laplace release
        other = PoissonSampledEvent(
            float(q * rng.uniform(0.2, 3.0)) % 1.0 or 0.5, GaussianEvent(sigma * 1.7)
        )
        return [
            (base, steps),
            (other, int(rng.integers(1, 50))),
            (LaplaceEvent(float(rng.uniform(5, 50))), 3),
        ]
    if kind == 2:  # nested composition
        inner = ComposedEvent((base, GaussianEvent(float(sigma * 30))))
        return [(SelfComposedEvent(inner, steps), 1), (LaplaceEvent(40.0), 1)]
    if kind == 3:  # many small composes (folded into the dense total)
        return [(base, max(1, steps // 20))] * 12
    return [(GaussianEvent(float(sigma * 50)), 2), (base, steps)]


@pytest.mark.parametrize("grid_name", sorted(GRIDS))
def test_lazy_epsilon_equals_full_grid(grid_name):
    rng = np.random.default_rng(zlib.crc32(grid_name.encode()))
    grid = GRIDS[grid_name]
    for _ in range(40):
        events = _random_events(rng)
        delta = float(10 ** rng.uniform(-10, -2))
        res, (eps, order) = _lazy_and_full(events, grid, delta)
        assert res.epsilon >= eps  # never smaller than the full grid's answer
        assert res.epsilon == pytest.approx(eps, rel=1e-12, abs=0.0)
        assert res.epsilon == eps and res.order == order  # in fact bit for bit


def test_benchmark_setting_bit_for_bit():
    event = PoissonSampledEvent(256 / 60000, GaussianEvent(1.1))
    res, (eps, order) = _lazy_and_full([(event, 14100)], DEFAULT_ORDERS, 1e-5)
    assert (res.epsilon, res.order) == (eps, order) == (pytest.approx(2.6003429386), 8.1)


def test_lazy_search_evaluates_few_orders(monkeypatch):
    seen = []
    real = sub._gaussian_rdp_subset

    def spy(q, sigma, orders, sel, **kw):
        seen.append(int(np.count_nonzero(sel)))
        return real(q, sigma, orders, sel, **kw)

    monkeypatch.setattr(sub, "_gaussian_rdp_subset", spy)
    acc = RdpAccountant().compose(PoissonSampledEvent(256 / 60000, GaussianEvent(1.1)), 14100)
    acc.epsilon(1e-5)
    assert len(seen) == 2 and sum(seen) < DEFAULT_ORDERS.size // 2


def test_bretagnolle_huber_case_matches_full_grid():
    # A tiny curve: delta >= sqrt(1 - exp(-eps(alpha))) somewhere, the answer is 0.
    event = PoissonSampledEvent(1e-4, GaussianEvent(30.0))
    res, (eps, order) = _lazy_and_full([(event, 1)], DEFAULT_ORDERS, 0.5)
    assert (res.epsilon, res.order) == (eps, order)
    assert res.epsilon == 0.0


@pytest.mark.parametrize("q", [0.0, 1.0])
def test_degenerate_rates_are_dense(q):
    res, (eps, order) = _lazy_and_full(
        [(PoissonSampledEvent(q, GaussianEvent(2.0)), 10)], DEFAULT_ORDERS, 1e-5
    )
    assert (res.epsilon, res.order) == (eps, order)


def test_kernel_values_do_not_depend_on_the_other_orders():
    rng = np.random.default_rng(7)
    grid = np.unique(np.concatenate([DEFAULT_ORDERS, [1000.3, 2.0001, 1.5e3]]))
    for q, sigma in [(256 / 60000, 1.1), (0.01, 0.8), (0.3, 0.5), (0.6, 3.0), (1e-4, 20.0)]:
        full = sub.poisson_subsampled_gaussian_rdp(q, sigma, grid)
        for size in (1, 2, 5, 40):
            sel = np.zeros(grid.size, dtype=bool)
            sel[rng.choice(grid.size, size, replace=False)] = True
            part = sub._gaussian_rdp_subset(q, sigma, grid, sel)
            np.testing.assert_array_equal(part, full[sel])
            alone = sub.poisson_subsampled_gaussian_rdp(q, sigma, grid[sel])
            np.testing.assert_array_equal(alone, full[sel])


def test_lower_bound_is_below_the_curve():
    rng = np.random.default_rng(3)
    a = DEFAULT_ORDERS
    for _ in range(30):
        q, sigma = float(10 ** rng.uniform(-4, -0.2)), float(10 ** rng.uniform(-0.3, 1.3))
        vals = sub.poisson_subsampled_gaussian_rdp(q, sigma, a)
        have = rng.random(a.size) < 0.2
        have[-1] = True
        lb = rdp_mod._lower_bound(a, np.where(have, vals, np.nan), have)
        assert not np.isnan(lb).any()
        assert (lb <= vals).all()
        np.testing.assert_array_equal(lb[have], vals[have])


def test_state_copy_and_delta_unchanged():
    event = PoissonSampledEvent(0.01, GaussianEvent(1.0))
    acc = RdpAccountant().compose(event, 500).compose(LaplaceEvent(20.0), 2)
    first = acc.epsilon(1e-6)
    clone = RdpAccountant.from_state_dict(json.loads(json.dumps(acc.state_dict())))
    assert clone.epsilon(1e-6) == first
    assert acc.copy().epsilon(1e-6) == first
    full = RdpAccountant().compose(event, 500).compose(LaplaceEvent(20.0), 2)
    conv = full.curve.to_delta(first.epsilon)
    d = acc.delta(first.epsilon)
    assert (d.delta, d.order) == (conv.delta, conv.order)
    assert acc.epsilon(1e-6) == first  # after the curve was evaluated in full


def test_bad_events_still_rejected_at_compose():
    acc = RdpAccountant().compose(PoissonSampledEvent(0.01, GaussianEvent(1.0)), 10)
    before = acc.epsilon(1e-5)
    bad = ComposedEvent((PoissonSampledEvent(0.01, GaussianEvent(1.0)), ApproxDpEvent(1.0, 1e-6)))
    with pytest.raises(UnsupportedEventError):
        acc.compose(bad)
    broken = CustomEvent("broken", lambda a: -np.ones_like(a))
    with pytest.raises(PrivacyParameterError):
        acc.compose(ComposedEvent((PoissonSampledEvent(0.01, GaussianEvent(1.0)), broken)))
    assert acc.epsilon(1e-5) == before
    assert len(acc.history) == 1
