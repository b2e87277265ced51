import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from renyi.errors import PrivacyParameterError, UnsupportedEventError
from renyi.events import (
    ApproxDpEvent,
    ComposedEvent,
    CustomEvent,
    DiscreteGaussianEvent,
    DiscreteLaplaceEvent,
    GaussianEvent,
    LaplaceEvent,
    Neighbouring,
    PoissonSampledEvent,
    PureDpEvent,
    RandomizedResponseEvent,
    RdpEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    ZcdpEvent,
    from_dict,
    from_json,
)

LEAVES = [
    GaussianEvent(1.1),
    GaussianEvent(2.0, Neighbouring.REPLACE_ONE),
    LaplaceEvent(0.5),
    RandomizedResponseEvent(0.75),
    DiscreteGaussianEvent(3.0, 2.0),
    DiscreteLaplaceEvent(2.0),
    PureDpEvent(1.0),
    ApproxDpEvent(1.0, 1e-6),
    ZcdpEvent(0.25),
    RdpEvent((2.0, 4.0, math.inf), (0.1, 0.3, 2.0)),
]


@pytest.mark.parametrize("event", LEAVES, ids=lambda e: e.kind)
def test_leaf_round_trip_json(event):
    text = event.to_json()
    json.loads(text)  # strict JSON: no Infinity/NaN tokens
    assert "Infinity" not in text
    assert from_json(text) == event


def test_nested_round_trip():
    step = PoissonSampledEvent(256 / 60000, GaussianEvent(1.1))
    ev = ComposedEvent((SelfComposedEvent(step, 14100), PoissonSampledEvent(0.1, LaplaceEvent(2))))
    assert from_dict(json.loads(ev.to_json())) == ev
    wor = SampledWithoutReplacementEvent(1000, 10, GaussianEvent(1.0, Neighbouring.REPLACE_ONE))
    assert from_json(wor.to_json()) == wor
    assert wor.sampling_rate == 0.01


def test_mixed_relations_refused():
    with pytest.raises(PrivacyParameterError, match="neighbouring"):
        ComposedEvent((GaussianEvent(1.0), GaussianEvent(1.0, Neighbouring.REPLACE_ONE)))
    with pytest.raises(PrivacyParameterError, match="add_remove"):
        PoissonSampledEvent(0.1, GaussianEvent(1.0, "replace_one"))
    # sampling without replacement takes its inner event's relation (both are analysed)
    assert SampledWithoutReplacementEvent(100, 10, GaussianEvent(1.0)).neighbouring.value == (
        "add_remove"
    )


@pytest.mark.parametrize(
    "build, name",
    [
        (lambda: GaussianEvent(-1.0), "noise_multiplier"),
        (lambda: GaussianEvent(float("nan")), "noise_multiplier"),
        (lambda: GaussianEvent(0.0), "noise_multiplier"),
        (lambda: GaussianEvent(True), "noise_multiplier"),
        (lambda: LaplaceEvent(float("inf")), "scale"),
        (lambda: RandomizedResponseEvent(0.3), "p"),
        (lambda: PureDpEvent(-0.1), "epsilon"),
        (lambda: ApproxDpEvent(1.0, 1.0), "delta"),
        (lambda: ZcdpEvent(float("nan")), "rho"),
        (lambda: PoissonSampledEvent(1.5, GaussianEvent(1.0)), "sampling_rate"),
        (lambda: PoissonSampledEvent(-0.1, GaussianEvent(1.0)), "sampling_rate"),
        (lambda: SelfComposedEvent(GaussianEvent(1.0), 2.5), "count"),
        (lambda: SelfComposedEvent(GaussianEvent(1.0), -1), "count"),
        (lambda: ComposedEvent(()), "events"),
        (lambda: RdpEvent((1.0, 2.0), (0.1, 0.2)), "orders"),
        (lambda: RdpEvent((2.0, 3.0), (0.1,)), "epsilons"),
        (lambda: RdpEvent((2.0, 3.0), (0.1, float("nan"))), "epsilons"),
        (lambda: GaussianEvent(1.0, "swap"), "neighbouring"),
        (
            lambda: SampledWithoutReplacementEvent(
                10, 11, GaussianEvent(1.0, Neighbouring.REPLACE_ONE)
            ),
            "sample_size",
        ),
    ],
)
def test_bad_parameters_name_the_parameter(build, name):
    with pytest.raises(PrivacyParameterError, match=name):
        build()


def test_from_dict_rejects_unknown_and_malformed():
    with pytest.raises(PrivacyParameterError, match="type"):
        from_dict({"type": "teleport"})
    with pytest.raises(PrivacyParameterError):
        from_dict({"noise_multiplier": 1.0})
    with pytest.raises(PrivacyParameterError):
        from_dict({"type": "gaussian", "sigma": 1.0})
    with pytest.raises(PrivacyParameterError, match="text"):
        from_json("{not json")


def test_custom_event_is_not_serialisable():
    ev = CustomEvent("mine", lambda a: a * 0.1)
    with pytest.raises(UnsupportedEventError, match="RdpEvent"):
        ev.to_json()


def test_rdp_event_conservative_regrid():
    ev = RdpEvent((2.0, 8.0), (0.5, 1.0))
    got = ev.rdp_at(np.array([1.5, 2.0, 3.0, 8.0, 9.0]))
    assert got.tolist() == [0.5, 0.5, 1.0, 1.0, math.inf]


@given(st.floats(0.01, 100), st.floats(0, 1), st.integers(0, 10**7))
def test_round_trip_property(sigma, q, count):
    ev = SelfComposedEvent(PoissonSampledEvent(q, GaussianEvent(sigma)), count)
    assert from_json(ev.to_json()) == ev
