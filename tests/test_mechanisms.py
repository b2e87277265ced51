"""Mechanisms: privacy numbers vs independent computations, calibration, bad input, interface.

Independent references: mpmath sums of the discrete Gaussian hockey-stick divergence, the
continuous analytic Gaussian recomputed with mpmath, closed forms (Dwork & Roth, Mironov
Table II), numerical Rényi divergences of the worst-case output pairs.
"""

import itertools
import math
import warnings
from fractions import Fraction
from typing import Any

import mpmath
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy import optimize

from renyi.analysis.closed_forms import gaussian_epsilon
from renyi.curves import DEFAULT_ORDERS, RdpCurve
from renyi.divergence import renyi_divergence
from renyi.errors import InsecureRandomnessWarning, PrivacyParameterError
from renyi.events import (
    DiscreteGaussianEvent,
    DiscreteLaplaceEvent,
    PureDpEvent,
    RandomizedResponseEvent,
)
from renyi.mechanisms import (
    DiscreteGaussianMechanism,
    DiscreteLaplaceMechanism,
    ExponentialMechanism,
    GaussianMechanism,
    KaryRandomizedResponse,
    LaplaceMechanism,
    Mechanism,
    RandomizedResponse,
    discrete_gaussian_delta,
    discrete_gaussian_delta_bound,
    discrete_gaussian_epsilon,
)
from renyi.mechanisms._base import to_lattice
from renyi.mechanisms.discrete import (
    discrete_laplace_delta,
    discrete_laplace_epsilon,
    discrete_laplace_rdp,
)

mpmath.mp.dps = 30


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureRandomnessWarning)
        yield


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


# ---------------------------------------------------------------- independent references
def mp_dg_delta(sigma2: float, shift: int, eps: float) -> float:
    """sum_y max(0, P(y) - e^eps P(y - shift)) for N_Z(0, sigma2), in mpmath."""
    s2 = mpmath.mpf(sigma2)
    norm = mpmath.jtheta(3, 0, mpmath.exp(-1 / (2 * s2)))
    width = int(60 * math.sqrt(sigma2)) + shift + 10
    e = mpmath.exp(mpmath.mpf(eps))
    total = mpmath.mpf(0)
    for y in range(-width, width + 1):
        p = mpmath.exp(-(y**2) / (2 * s2))
        q = mpmath.exp(-((y - shift) ** 2) / (2 * s2))
        if p > e * q:
            total += p - e * q
    return float(total / norm)


def mp_analytic_delta(mu: float, eps: float) -> float:
    """Balle & Wang 2018 Thm. 8 recomputed in mpmath."""
    m, e = mpmath.mpf(mu), mpmath.mpf(eps)
    return float(mpmath.ncdf(m / 2 - e / m) - mpmath.exp(e) * mpmath.ncdf(-m / 2 - e / m))


# ---------------------------------------------------------------- discrete Gaussian profile
@pytest.mark.parametrize("sigma2,shift,eps", [(4.0, 1, 0.5), (2.25, 2, 1.0), (30.0, 3, 0.2)])
def test_discrete_gaussian_delta_matches_mpmath_and_rounds_up(sigma2, shift, eps):
    ref = mp_dg_delta(sigma2, shift, eps)
    ours = discrete_gaussian_delta(sigma2, shift, eps)
    assert ours >= ref
    assert ours == pytest.approx(ref, rel=1e-8)


def test_discrete_gaussian_epsilon_is_verified_and_tight():
    eps = discrete_gaussian_epsilon(9.0, 1, 1e-3)
    assert mp_dg_delta(9.0, 1, eps) <= 1e-3
    assert mp_dg_delta(9.0, 1, eps * (1 - 1e-6)) > 1e-3  # not needlessly loose


def test_discrete_gaussian_rdp_bounds_the_true_divergence():
    # CKS Thm. 4: D_alpha(N_Z(0) || N_Z(s)) <= alpha s^2 / (2 sigma^2); check numerically
    sigma2, s = 0.8, 1
    ys = np.arange(-25, 26)  # both pmfs stay positive in float64 here
    p = np.exp(-(ys**2) / (2 * sigma2))
    q = np.exp(-((ys - s) ** 2) / (2 * sigma2))
    alphas = np.array([1.5, 2.0, 5.0, 20.0])
    true = renyi_divergence(p / p.sum(), q / q.sum(), alphas)
    bound = DiscreteGaussianMechanism(Fraction(4, 5), s).rdp(alphas).epsilons
    assert (bound >= true).all()


# ---------------------------------------------------------------- Gaussian calibration
@pytest.mark.parametrize("eps,delta", [(1.0, 1e-5), (0.3, 1e-6), (4.0, 1e-8)])
def test_gaussian_analytic_calibration_is_conservative_and_tight(eps, delta):
    m = GaussianMechanism.calibrate(2.0, epsilon=eps, delta=delta)
    assert m.calibration.method == "analytic"
    assert m.calibration.achieved <= eps
    shift = round(m.lattice_sensitivity / m.granularity)
    # continuous analytic sigma recomputed independently, then compared
    mu = optimize.brentq(lambda x: mp_analytic_delta(x, eps) - delta, 1e-3, 50, xtol=1e-14)
    sigma_cont = 2.0 / mu
    assert m.sigma >= sigma_cont
    assert m.sigma <= sigma_cont * (1 + 2.0**-11)  # only the lattice pad of 2**-12 (and a hair)
    assert m.delta(eps) <= delta
    assert shift == math.floor(2.0 / m.granularity) + 1


def test_gaussian_analytic_small_lattice_checked_with_mpmath():
    # a mechanism whose lattice noise is narrow enough for a direct mpmath sum
    m = DiscreteGaussianMechanism.calibrate(1, epsilon=1.0, delta=1e-4)
    assert mp_dg_delta(float(m.sigma_squared), 1, 1.0) <= 1e-4
    assert m.calibration.achieved <= 1.0


def test_gaussian_classic_calibration_and_validity_range():
    eps, delta = 0.5, 1e-5
    m = GaussianMechanism.calibrate(1.0, epsilon=eps, delta=delta, method="classic")
    assert m.sigma >= math.sqrt(2 * math.log(1.25 / delta)) / eps
    assert m.epsilon(delta) <= eps
    with pytest.raises(PrivacyParameterError, match=r"epsilon=1\.5"):
        GaussianMechanism.calibrate(1.0, epsilon=1.5, delta=delta, method="classic")


def test_gaussian_rdp_and_zcdp_calibration():
    m = GaussianMechanism.calibrate(3.0, alpha=10.0, epsilon=0.5)
    assert m.sigma**2 >= 9.0 * 10.0 / (2 * 0.5)  # formulas.md §3
    assert m.rdp([10.0]).epsilons[0] <= 0.5
    z = GaussianMechanism.calibrate(3.0, rho=0.2, dimension=50)
    assert z.sigma >= 3.0 / math.sqrt(0.4)
    assert z.rho <= 0.2 and z.calibration.method == "zcdp"
    v = GaussianMechanism.calibrate(1.0, epsilon=1.0, delta=1e-5, dimension=10)
    assert v.calibration.method == "zcdp" and v.epsilon(1e-5) <= 1.0


def test_gaussian_epsilon_is_close_to_continuous_and_never_above_the_rdp_bound():
    m = GaussianMechanism(5.0, 1.0)
    eps = m.epsilon(1e-6)
    mu = m.lattice_sensitivity / m.sigma
    assert mp_analytic_delta(mu, eps) == pytest.approx(1e-6, rel=0.02)
    assert eps <= m.rdp().to_dp(1e-6).epsilon


def test_gaussian_rdp_curve_values():
    m = GaussianMechanism(4.0, 1.0)
    c = m.rdp()
    assert isinstance(c, RdpCurve) and np.array_equal(c.orders, DEFAULT_ORDERS)
    expected = DEFAULT_ORDERS * m.lattice_sensitivity**2 / (2 * 16.0)
    assert np.all(c.epsilons >= expected * (1 - 1e-15))
    assert np.allclose(c.epsilons, expected, rtol=1e-12)


def test_pure_target_refused_for_gaussian():
    with pytest.raises(PrivacyParameterError, match="delta"):
        GaussianMechanism.calibrate(1.0, epsilon=1.0)
    with pytest.raises(PrivacyParameterError, match="delta"):
        DiscreteGaussianMechanism.calibrate(1, epsilon=1.0)


# ---------------------------------------------------------------- Laplace
@pytest.mark.parametrize("eps", [0.1, 1.0, 7.0])
def test_laplace_calibration(eps):
    m = LaplaceMechanism.calibrate(2.0, epsilon=eps)
    assert m.pure_epsilon <= eps
    assert m.scale >= 2.0 / eps
    assert m.scale <= 2.0 / eps * (1 + 2.0**-11)
    assert Fraction(m.lattice_sensitivity) / Fraction(m.scale) <= Fraction(eps)


def test_laplace_rdp_zcdp_targets():
    m = LaplaceMechanism.calibrate(1.0, rho=0.125)
    assert m.pure_epsilon**2 / 2 <= 0.125 and m.calibration.method == "zcdp"
    r = LaplaceMechanism.calibrate(1.0, alpha=4.0, epsilon=0.3)
    assert r.rdp([4.0]).epsilons[0] <= 0.3
    assert r.calibration.achieved <= 0.3


def test_discrete_laplace_calibration_is_exact_rational():
    m = DiscreteLaplaceMechanism.calibrate(3, epsilon=0.7)
    assert Fraction(3) / m.scale <= Fraction(0.7)
    assert m.epsilon(1e-9) <= 0.7
    assert DiscreteLaplaceMechanism(2, 1).pure_epsilon == 0.5


# ---------------------------------------------------------------- randomized response
@pytest.mark.parametrize("eps", [0.1, 1.0, 5.0])
def test_rr_calibration_pure(eps):
    m = RandomizedResponse.calibrate(epsilon=eps)
    p_star = math.exp(eps) / (1 + math.exp(eps))
    assert m.p <= p_star and m.p >= p_star - 1e-12
    assert m.pure_epsilon <= eps
    assert float(mpmath.log(mpmath.mpf(m.p) / (1 - mpmath.mpf(m.p)))) <= eps


def test_rr_epsilon_delta_profile_is_exact():
    m = RandomizedResponse(0.9)
    for delta in [1e-6, 0.01, 0.5]:
        eps = m.epsilon(delta)
        hockey = max(0.0, 0.9 - math.exp(eps) * 0.1)  # P[1] - e^eps Q[1], the only positive term
        assert hockey <= delta
        assert max(0.0, 0.9 - math.exp(eps * (1 - 1e-9)) * 0.1) > delta or eps == 0
    assert m.epsilon(0.9) == 0.0
    c = RandomizedResponse.calibrate(epsilon=1.0, delta=0.05)
    assert c.epsilon(0.05) <= 1.0 and c.p > RandomizedResponse.calibrate(epsilon=1.0).p


def test_rr_rdp_matches_mironov_table_ii_and_rdp_calibration():
    m = RandomizedResponse(0.75)
    a = 3.0
    ref = float(
        mpmath.log(
            mpmath.mpf(0.75) ** a * mpmath.mpf(0.25) ** (1 - a)
            + mpmath.mpf(0.25) ** a * mpmath.mpf(0.75) ** (1 - a)
        )
        / (a - 1)
    )
    assert m.rdp([a]).epsilons[0] == pytest.approx(ref, rel=1e-12)
    c = RandomizedResponse.calibrate(alpha=3.0, epsilon=0.2)
    assert c.rdp([3.0]).epsilons[0] <= 0.2
    z = RandomizedResponse.calibrate(rho=0.5)
    assert z.pure_epsilon <= 1.0


def test_kary_rr_privacy():
    m = KaryRandomizedResponse(6, 0.5)
    q = 0.1
    assert m.pure_epsilon >= math.log(0.5 / q) and m.pure_epsilon == pytest.approx(math.log(5))
    a = 2.5
    ref = float(
        mpmath.log(
            mpmath.mpf(0.5) ** a * mpmath.mpf(q) ** (1 - a)
            + mpmath.mpf(q) ** a * mpmath.mpf(0.5) ** (1 - a)
            + 4 * mpmath.mpf(q)
        )
        / (a - 1)
    )
    assert m.rdp([a]).epsilons[0] == pytest.approx(ref, rel=1e-10)
    c = KaryRandomizedResponse.calibrate(10, epsilon=2.0)
    assert c.pure_epsilon <= 2.0 and c.p == pytest.approx(math.exp(2) / (math.exp(2) + 9))
    d = KaryRandomizedResponse.calibrate(10, epsilon=2.0, delta=1e-3)
    assert d.epsilon(1e-3) <= 2.0


def test_exponential_mechanism_calibration():
    m = ExponentialMechanism.calibrate(2.0, rho=0.5)
    assert m.pure_epsilon <= 1.0 and m.calibration.achieved <= 0.5
    assert ExponentialMechanism.calibrate(epsilon=0.3).epsilon(1e-5) == 0.3


# ---------------------------------------------------------------- interface and events
def all_mechanisms():
    return [
        GaussianMechanism(2.0, 1.0),
        LaplaceMechanism(2.0, 1.0),
        DiscreteGaussianMechanism(4, 1),
        DiscreteLaplaceMechanism(2, 1),
        RandomizedResponse(0.75),
        KaryRandomizedResponse(3, 0.6),
        ExponentialMechanism(1.0),
    ]


@pytest.mark.parametrize("mech", all_mechanisms(), ids=lambda m: type(m).__name__)
def test_common_interface(mech):
    assert isinstance(mech, Mechanism)
    curve = mech.rdp()
    assert isinstance(curve, RdpCurve) and not np.isnan(curve.epsilons).any()
    assert 0 <= mech.epsilon(1e-6) < math.inf
    assert mech.event().to_dict()


def test_events_carry_the_analysed_parameters():
    g = GaussianMechanism(2.0, 1.0)
    ev = g.event()
    assert isinstance(ev, DiscreteGaussianEvent)
    # the event carries the sampler's own sigma: at least the analysed one, by < 2**-12
    ratio = ev.sigma / ev.sensitivity
    assert g.noise_multiplier <= ratio <= g.noise_multiplier * (1 + 2.0**-12)
    assert isinstance(LaplaceMechanism(2.0).event(), DiscreteLaplaceEvent)
    assert RandomizedResponse(0.75).event() == RandomizedResponseEvent(0.75)
    assert isinstance(ExponentialMechanism(1.0).event(), PureDpEvent)


def test_scalar_release_types():
    assert isinstance(GaussianMechanism(1.0).release(3.0, rng=rng()), float)
    assert isinstance(LaplaceMechanism(1.0).release(3, rng=rng()), float)
    assert isinstance(DiscreteGaussianMechanism(4).release(3, rng=rng()), int)
    assert isinstance(RandomizedResponse(0.75).release(True, rng=rng()), bool)
    assert isinstance(KaryRandomizedResponse(4, 0.5).release(3, rng=rng()), int)
    out = GaussianMechanism(1.0, dimension=6).release(np.zeros((2, 3)), rng=rng())
    assert out.shape == (2, 3)


def test_default_randomness_is_secure_and_seeded_warns_per_use():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GaussianMechanism(1.0).release(0.0)  # rng=None: OS entropy, no warning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        LaplaceMechanism(1.0).release(0.0, rng=rng(1))
        LaplaceMechanism(1.0).release(0.0, rng=rng(2))
    # every release that uses a seeded generator warns, not only the first in the process
    assert sum(issubclass(w.category, InsecureRandomnessWarning) for w in caught) == 2


@pytest.mark.parametrize("sigma", [1e-250, 1e-5, 1e250])
def test_extreme_scales_release_finite_lattice_values(sigma):
    m = GaussianMechanism(sigma, sigma)
    y = m.release(3.0 * sigma, rng=rng())
    assert math.isfinite(y) and (y / m.granularity).is_integer()
    assert abs(y - 3 * sigma) < 50 * sigma
    assert m.epsilon(1e-5) < 10


# ---------------------------------------------------------------- bad input
BAD_REALS = [math.nan, math.inf, -1.0, 0.0, True, "1.0", None]


@pytest.mark.parametrize("bad", BAD_REALS)
@pytest.mark.parametrize(
    "make,name",
    [
        (lambda v: GaussianMechanism(v, 1.0), "sigma"),
        (lambda v: GaussianMechanism(1.0, v), "sensitivity"),
        (lambda v: LaplaceMechanism(v, 1.0), "scale"),
        (lambda v: LaplaceMechanism(1.0, v), "sensitivity"),
        (lambda v: ExponentialMechanism(v), "epsilon"),
        (lambda v: DiscreteLaplaceMechanism(v), "scale"),
        (lambda v: DiscreteGaussianMechanism(v), "sigma_squared"),
    ],
)
def test_bad_parameters_name_parameter_value_and_range(make, name, bad):
    with pytest.raises(PrivacyParameterError, match=f"{name}=") as err:
        make(bad)
    assert "expected" in str(err.value)


@pytest.mark.parametrize("p", [0.5, 0.3, 1.0, 1.2, math.nan, True, "0.7"])
def test_rr_probability_outside_half_one_is_refused(p):
    with pytest.raises(PrivacyParameterError, match=r"p=.*\(0\.5, 1\)"):
        RandomizedResponse(p)


@pytest.mark.parametrize("delta", [0.0, 1.0, -0.1, 1.5, math.nan])
def test_delta_outside_open_unit_interval_is_refused(delta):
    with pytest.raises(PrivacyParameterError, match="delta="):
        GaussianMechanism.calibrate(1.0, epsilon=1.0, delta=delta)
    with pytest.raises(PrivacyParameterError, match="delta="):
        GaussianMechanism(1.0).epsilon(delta)


@pytest.mark.parametrize("eps", [math.inf, math.nan, -1.0, 0.0])
def test_infinite_or_invalid_epsilon_never_calibrates_to_no_noise(eps):
    for cls in (LaplaceMechanism, DiscreteLaplaceMechanism, ExponentialMechanism):
        with pytest.raises(PrivacyParameterError, match="epsilon="):
            cls.calibrate(epsilon=eps)
    with pytest.raises(PrivacyParameterError, match="epsilon="):
        RandomizedResponse.calibrate(epsilon=eps)
    with pytest.raises(PrivacyParameterError):
        GaussianMechanism.calibrate(1.0, epsilon=eps, delta=1e-5)


@pytest.mark.parametrize(
    "value", [math.nan, math.inf, -math.inf, np.array([1.0, math.nan]), True, "3", [], None]
)
def test_bad_query_values_are_refused(value):
    m = GaussianMechanism(1.0, dimension=2) if np.ndim(value) == 1 and len(value) else None
    m = m or GaussianMechanism(1.0)
    with pytest.raises(PrivacyParameterError, match="value="):
        m.release(value)
    with pytest.raises(PrivacyParameterError, match="value="):
        LaplaceMechanism(1.0).release(value)


def test_other_bad_releases():
    with pytest.raises(PrivacyParameterError, match="value="):
        GaussianMechanism(1.0, dimension=3).release(np.zeros(4))
    with pytest.raises(PrivacyParameterError, match="value="):
        DiscreteGaussianMechanism(4).release(1.5)
    with pytest.raises(PrivacyParameterError, match="value="):
        RandomizedResponse(0.75).release(np.array([0, 2]))
    with pytest.raises(PrivacyParameterError, match="value="):
        RandomizedResponse(0.75).release(np.array([], dtype=bool))
    with pytest.raises(PrivacyParameterError, match="value="):
        KaryRandomizedResponse(3, 0.5).release(np.array([3]))
    with pytest.raises(PrivacyParameterError, match="utilities="):
        ExponentialMechanism(1.0).release([])
    with pytest.raises(PrivacyParameterError, match="utilities="):
        ExponentialMechanism(1.0).release([1.0, math.inf])
    with pytest.raises(PrivacyParameterError, match="value="):
        GaussianMechanism(1.0).release(1e305)  # beyond the documented |x| <= 2**1020 g
    assert math.isfinite(GaussianMechanism(1.0).release(1e302))
    with pytest.raises(PrivacyParameterError, match="targets="):
        GaussianMechanism.calibrate(1.0, epsilon=1.0, rho=0.1)
    with pytest.raises(PrivacyParameterError, match="method="):
        GaussianMechanism.calibrate(1.0, epsilon=1.0, delta=1e-5, method="magic")
    with pytest.raises(PrivacyParameterError, match="method="):
        GaussianMechanism.calibrate(1.0, epsilon=1.0, delta=1e-5, method="analytic", dimension=3)
    with pytest.raises(PrivacyParameterError, match="alpha="):
        GaussianMechanism.calibrate(1.0, alpha=1.0, epsilon=1.0)
    with pytest.raises(PrivacyParameterError, match="noise="):
        ExponentialMechanism(1.0, noise="laplace")
    with pytest.raises(PrivacyParameterError, match="k="):
        KaryRandomizedResponse(1, 0.9)


# ---------------------------------------------------------------- lattice analysis
def test_hockey_stick_grows_with_the_integer_shift():
    # Shifts of a log-concave pmf have monotone likelihood ratios, so (Karlin-Rubin) the
    # privacy profile at shift s <= Delta is below the one at Delta: CKS Thm. 7 at Delta
    # covers every lattice shift the rounding can produce. Checked numerically here.
    for sigma2, eps in [(2.0, 0.3), (30.0, 0.1), (500.0, 0.05)]:
        deltas = [mp_dg_delta(sigma2, s, eps) for s in range(1, 6)]
        assert all(a <= b for a, b in itertools.pairwise(deltas))


@given(
    x=st.floats(-1e6, 1e6, allow_nan=False),
    frac=st.floats(-1.0, 1.0),
    sens=st.floats(1e-3, 1e3),
    sigma=st.floats(1e-3, 1e3),
)
@settings(max_examples=300, deadline=None)
def test_rounded_neighbours_stay_within_the_lattice_sensitivity(x, frac, sens, sigma):
    m = GaussianMechanism(sigma, sens)
    g = m.granularity
    x2 = x + frac * sens
    k1 = to_lattice(np.array([x]), g)[0]
    k2 = to_lattice(np.array([x2]), g)[0]
    assume(abs(x2 - x) <= sens)  # float rounding of x + frac * sens may exceed sens slightly
    assert abs(k1 - k2) * g <= m.lattice_sensitivity
    assert m.lattice_sensitivity <= sens * (1 + 2.0**-12)


@given(
    d=st.integers(2, 50),
    seed=st.integers(0, 2**32 - 1),
    sens=st.floats(1e-2, 1e2),
)
@settings(max_examples=100, deadline=None)
def test_rounded_vectors_stay_within_l1_and_l2_lattice_sensitivity(d, seed, sens):
    gen = np.random.default_rng(seed)
    x = gen.normal(0, 10 * sens, d)
    step = gen.normal(0, 1, d)
    for mech, order in [
        (LaplaceMechanism(1.0, sens, dimension=d), 1),
        (GaussianMechanism(1.0, sens, dimension=d), 2),
    ]:
        delta = step / np.linalg.norm(step, ord=order) * sens * 0.999999
        k1 = to_lattice(x, mech.granularity)
        k2 = to_lattice(x + delta, mech.granularity)
        dist = np.linalg.norm(k1 - k2, ord=order) * mech.granularity
        assert dist <= mech.lattice_sensitivity
        assert mech.lattice_sensitivity <= sens * (1 + 2.0**-12) * (1 + 1e-15)


# ---------------------------------------------------------------- discrete Laplace, exact
def mp_dl_pmf(scale: float):
    lam = mpmath.exp(-1 / mpmath.mpf(scale))
    c = (1 - lam) / (1 + lam)
    return lambda y: c * lam ** abs(y)


@pytest.mark.parametrize("scale,shift", [(1.0, 1), (0.7, 3), (5.0, 2), (40.0, 7)])
def test_discrete_laplace_rdp_matches_mpmath_sum(scale, shift):
    pmf = mp_dl_pmf(scale)
    width = int(80 * scale) + shift + 50
    for a in [1.5, 2.0, 7.0, 64.0]:
        total = mpmath.fsum(
            pmf(y) ** a * pmf(y - shift) ** (1 - a) for y in range(-width, width + 1)
        )
        ref = float(mpmath.log(total) / (a - 1))
        ours = float(discrete_laplace_rdp(scale, shift, [a])[0])
        assert ours >= ref and ours == pytest.approx(ref, rel=1e-9)
    assert discrete_laplace_rdp(scale, shift, [math.inf])[0] == shift / scale


@pytest.mark.parametrize("scale,shift,eps", [(1.0, 1, 0.3), (2.0, 3, 0.5), (10.0, 4, 0.1)])
def test_discrete_laplace_delta_matches_mpmath_hockey_stick(scale, shift, eps):
    pmf = mp_dl_pmf(scale)
    width = int(80 * scale) + shift + 50
    e = mpmath.exp(eps)
    ref = float(
        mpmath.fsum(
            max(mpmath.mpf(0), pmf(y) - e * pmf(y - shift)) for y in range(-width, width + 1)
        )
    )
    ours = discrete_laplace_delta(scale, shift, eps)
    assert ours >= ref and ours == pytest.approx(ref, rel=1e-8)
    eps_back = discrete_laplace_epsilon(scale, shift, ref * 1.5)
    assert discrete_laplace_delta(scale, shift, eps_back) <= ref * 1.5
    assert eps_back < eps


def test_discrete_laplace_divergences_grow_with_the_shift():
    for scale in [0.5, 3.0]:
        curves = [discrete_laplace_rdp(scale, s, [2.0, 10.0]) for s in range(1, 6)]
        assert all((a <= b).all() for a, b in itertools.pairwise(curves))
        deltas = [discrete_laplace_delta(scale, s, 0.2) for s in range(1, 6)]
        assert all(a <= b for a, b in itertools.pairwise(deltas))


def test_laplace_exact_calibration_routes_beat_pure_and_verify():
    pure = LaplaceMechanism.calibrate(1.0, epsilon=1.0)
    approx = LaplaceMechanism.calibrate(1.0, epsilon=1.0, delta=1e-3)
    assert approx.calibration.method == "exact" and approx.scale < pure.scale
    # independent: the hockey stick at the largest lattice shift from its definition, summed
    # directly over the integers (float64, extended precision accumulation)
    t, s = float(approx._scale_lattice), approx._shift
    ys = np.arange(-int(60 * t) - s, int(60 * t) + s + 1, dtype=np.float64)
    lam = math.exp(-1 / t)
    c = (1 - lam) / (1 + lam)
    diff = c * lam ** np.abs(ys) - math.e * c * lam ** np.abs(ys - s)
    ref = math.fsum(diff[diff > 0].tolist())
    assert ref <= 1e-3
    assert ref > 0.99e-3  # and the calibration is tight
    rdp = LaplaceMechanism.calibrate(1.0, alpha=2.0, epsilon=0.5)
    assert rdp.rdp([2.0]).epsilons[0] <= 0.5 and rdp.calibration.method == "exact"
    dl = DiscreteLaplaceMechanism.calibrate(2, epsilon=0.5, delta=1e-4)
    assert dl.epsilon(1e-4) <= 0.5 and dl.scale < 4
    assert LaplaceMechanism(1.0).rdp([2.0]).epsilons[0] <= RandomizedResponse(
        1 / (1 + math.exp(-LaplaceMechanism(1.0).pure_epsilon))
    ).rdp([2.0]).epsilons[0] * (1 + 1e-12)


# ---------------------------------------------------------------- monotonicity properties
@given(e1=st.floats(0.05, 5.0), e2=st.floats(0.05, 5.0))
@settings(max_examples=15, deadline=None)
def test_more_budget_means_less_noise(e1, e2):
    lo, hi = sorted((e1, e2))
    assert RandomizedResponse.calibrate(epsilon=lo).p <= RandomizedResponse.calibrate(epsilon=hi).p
    assert (
        LaplaceMechanism.calibrate(epsilon=lo).scale >= LaplaceMechanism.calibrate(epsilon=hi).scale
    )
    g_lo = GaussianMechanism.calibrate(1.0, rho=lo)
    g_hi = GaussianMechanism.calibrate(1.0, rho=hi)
    assert g_lo.sigma >= g_hi.sigma


@given(
    s2=st.floats(0.2, 400.0),
    shift=st.integers(1, 5),
    e1=st.floats(0.0, 5.0),
    e2=st.floats(0.0, 5.0),
)
@settings(max_examples=60, deadline=None)
def test_profiles_decrease_in_epsilon_and_curves_increase_in_order(s2, shift, e1, e2):
    lo, hi = sorted((e1, e2))
    d_lo, d_hi = discrete_gaussian_delta(s2, shift, lo), discrete_gaussian_delta(s2, shift, hi)
    assert 0.0 <= d_hi <= d_lo <= 1.0
    l_lo, l_hi = discrete_laplace_delta(s2, shift, lo), discrete_laplace_delta(s2, shift, hi)
    assert 0.0 <= l_hi <= l_lo <= 1.0
    curve = discrete_laplace_rdp(s2, shift, DEFAULT_ORDERS)
    assert np.isfinite(curve).all() and (np.diff(curve) >= -1e-12 * curve[1:]).all()
    assert curve[-1] <= shift / s2 * (1 + 1e-12)


@pytest.mark.parametrize("scale", [1e-6, 1e-3, 1e3, 1e6])
def test_discrete_laplace_curves_at_extreme_scales_are_finite(scale):
    c = discrete_laplace_rdp(scale, 3, [1.01, 2.0, 1e4, math.inf])
    assert np.isfinite(c).all() and (c >= 0).all() and c[-1] == 3 / scale
    assert 0.0 <= discrete_laplace_delta(scale, 3, 0.1) <= 1.0


def test_monotonic_halving_only_for_the_exponential_mechanism():
    assert ExponentialMechanism(1.0, monotonic=True).monotonic
    with pytest.raises(PrivacyParameterError, match="monotonic=True"):
        ExponentialMechanism(1.0, noise="exponential", monotonic=True)


@pytest.mark.parametrize("sigma2,shift,eps", [(100.0, 1, 0.05), (1e4, 3, 0.02), (1e6, 7, 0.001)])
def test_wide_discrete_gaussian_bound_is_above_the_exact_sum_by_at_most_its_slack(
    sigma2, shift, eps
):
    exact = discrete_gaussian_delta(sigma2, shift, eps)
    bound = discrete_gaussian_delta_bound(sigma2, shift, eps)
    assert exact <= bound <= exact + 1.0001 / math.sqrt(2 * math.pi * sigma2)


def test_gaussian_with_noise_far_above_sensitivity_stays_near_analytic():
    # sigma / Delta ~ 240: the lattice noise is too wide for the exact sum; the bound is used
    m = GaussianMechanism.calibrate(1.0, epsilon=0.02, delta=1e-5)
    mu = optimize.brentq(lambda x: mp_analytic_delta(x, 0.02) - 1e-5, 1e-4, 5, xtol=1e-15)
    assert m.sigma >= 1.0 / mu
    assert m.sigma <= 1.0 / mu * 1.01  # far tighter than the zCDP route (~10% more noise)
    assert m.delta(0.02) <= 1e-5 and m.calibration.achieved <= 0.02


def test_integer_mechanisms_stay_in_integers_beyond_float64():
    """2**53 + 1 is not a float64: the release must not pass through one (issue #12)."""
    from renyi.mechanisms import DiscreteGaussianMechanism, DiscreteLaplaceMechanism

    wide = 2**80  # a declared (public) range beyond int64: Python ints for every value
    for mech in (
        DiscreteLaplaceMechanism(2, 1, value_bound=wide),
        DiscreteGaussianMechanism(4, 1, value_bound=wide),
    ):
        for x in (2**53 + 1, 2**70 + 3, -(2**63) - 5):
            y = mech.release(x)
            assert isinstance(y, int) and abs(y - x) < 200  # exact: noise of scale ~2
        v = DiscreteLaplaceMechanism(2, 1, dimension=2).release(np.array([2**53 + 1, -3]))
        assert v.dtype == np.int64 and abs(int(v[0]) - (2**53 + 1)) < 200
        big = DiscreteLaplaceMechanism(2, 1, dimension=2, value_bound=wide).release(
            [2**64 + 1, 2**53 + 1]
        )
        assert int(big[0]) - (2**64 + 1) in range(-200, 200)
        assert int(big[1]) - (2**53 + 1) in range(-200, 200)
    assert isinstance(DiscreteLaplaceMechanism(2, 1).release(5.0), int)
    with pytest.raises(PrivacyParameterError, match=r"2\*\*62"):
        DiscreteLaplaceMechanism(2, 1).release(2**70)  # beyond the default public range
    with pytest.raises(PrivacyParameterError):
        DiscreteLaplaceMechanism(2, 1).release(2.5)
    with pytest.raises(PrivacyParameterError):
        DiscreteLaplaceMechanism(2, 1).release(True)


@pytest.mark.parametrize(
    "make",
    [
        lambda: LaplaceMechanism(1.0, 1e308),
        lambda: GaussianMechanism(1.0, 1e300),
        lambda: GaussianMechanism(1e300, 1.0),
        lambda: LaplaceMechanism(1e300, 1.0),
    ],
    ids=[
        "laplace-huge-sensitivity",
        "gaussian-huge-sensitivity",
        "gaussian-huge-sigma",
        "laplace-huge-scale",
    ],
)
def test_parameters_beyond_the_lattice_range_get_our_error(make: Any) -> None:
    """Ratios of noise scale to sensitivity that the integer lattice cannot hold are refused
    up front, naming the parameter and the range (they raised OverflowError)."""
    with pytest.raises(PrivacyParameterError, match="within a factor"):
        make()


def test_wide_shift_profile_is_bounded_not_enumerated() -> None:
    """sigma = 1 with sensitivity 1e6 used to sum the exact CKS profile over ~2e9 integers
    (15 GiB, killed by the OOM killer); the cheap proven bound is used instead. It is never
    below the continuous Gaussian's epsilon at the sampler's own lattice parameters (its
    sigma is rounded up a little, so mu there is slightly below sensitivity / sigma)."""
    m = GaussianMechanism(1.0, 1e6)
    eps = m.epsilon(1e-5)
    ev = m.event()  # lattice units: sigma rounded down, so this mu is an upper bound
    assert math.isfinite(eps)
    assert eps >= gaussian_epsilon(ev.sensitivity / ev.sigma, 1e-5) * (1 - 1e-6)
    assert eps <= gaussian_epsilon(1e6, 1e-5) * (1 + 1e-6)
    m = GaussianMechanism(1.0, 1e11)
    assert math.isfinite(m.epsilon(1e-5))
