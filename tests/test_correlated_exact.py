"""Correlated-noise releases are exact (issue 23): the released lattice index equals the ideal
one, ``round(x/g + s·sens·Σ_j R[t,j] Z_j)``, for the ideal normals ``Z_j`` that the counters'
random bits define and the exact noising matrix ``R`` of the strategy's coefficients.

The reference here is independent of renyi's noise code: the keystream from
``cryptography``'s ChaCha20 with the documented counter layout, the normals in mpmath interval
arithmetic from 159-bit uniforms, the rows of ``R`` in exact rationals from the strategy's float
coefficients. Values are forced within about 1e-16 lattice units of a rounding boundary, where
the filter's float64 noise (error ~1e-14) decides the wrong side about half the time: on the
former code (``snap`` of the float noise) these tests fail.
"""

from __future__ import annotations

import struct
import warnings
from fractions import Fraction

import numpy as np
import pytest

from renyi import noise
from renyi.correlated.strategies import (
    BandedToeplitzStrategy,
    BltStrategy,
    TreeStrategy,
    bisr,
)
from renyi.errors import InsecureRandomnessWarning, PrivacyParameterError

torch = pytest.importorskip("torch")
mpmath = pytest.importorskip("mpmath")
warnings.filterwarnings("ignore", category=InsecureRandomnessWarning)

KEY = bytes(range(100, 132))
STRATEGIES = {
    "banded": BandedToeplitzStrategy((1.0, 0.6, 0.3, 0.1)),
    "blt": BltStrategy((0.9, 0.3), (0.2, 0.1)),
    "tree": TreeStrategy(),
    "banded_inverse": bisr(4, 0.9),
}


# --------------------------------------------------------------------- independent reference
def _keystream(domain: int, step: int, nbytes: int) -> bytes:
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    nonce = struct.pack("<I", 0) + struct.pack("<IQ", domain << 24, step)  # stream 0
    enc = Cipher(algorithms.ChaCha20(KEY, nonce), mode=None).encryptor()
    return enc.update(bytes(nbytes))


def _box(n: int, b: int):
    """The interval [n, n + 1] 2**-b (exact at the working precision)."""
    iv = mpmath.iv
    return iv.mpf([iv.ldexp(iv.mpf(n), -b).a, iv.ldexp(iv.mpf(n + 1), -b).b])


def _ends(v):
    """The endpoints of an mpmath interval as mpf numbers."""
    return mpmath.mp.make_mpf(v._mpi_[0]), mpmath.mp.make_mpf(v._mpi_[1])


def _mid(v):
    lo, hi = _ends(v)
    with mpmath.workprec(320):
        return (lo + hi) / 2


def _ivq(q: Fraction):
    iv = mpmath.iv
    return iv.mpf(q.numerator) / q.denominator


class _Ideal:
    """Ideal normals Z(stream 0, step, i) as mpmath intervals (levels 1..3: 159/160 bits)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.cache: dict[int, list] = {}

    def step(self, t: int) -> list:
        if t not in self.cache:
            iv = mpmath.iv
            nb = 8 * ((self.n + 1) // 2)
            words = [np.frombuffer(_keystream(d, t, nb), dtype="<u4") for d in range(4)]
            out = []
            with mpmath.workprec(300):
                iv.prec = 300
                for p in range((self.n + 1) // 2):
                    n1, n2 = int(words[0][2 * p]) & 0x7FFFFFFF, int(words[0][2 * p + 1])
                    for lv in (1, 2, 3):
                        n1 = (n1 << 32) | int(words[lv][2 * p])
                        n2 = (n2 << 32) | int(words[lv][2 * p + 1])
                    u1, u2 = _box(n1, 127), _box(n2, 128)
                    r = iv.sqrt(-2 * iv.log(u1))
                    out += [r * iv.cos(2 * iv.pi * u2), r * iv.sin(2 * iv.pi * u2)]
            self.cache[t] = out[: self.n]
        return self.cache[t]


def _exact_row(strategy, t: int) -> dict[int, Fraction]:
    """Row t of R as exact rationals of the strategy's float coefficients."""
    if isinstance(strategy, TreeStrategy):
        n = t + 1
        top = (n & -n).bit_length() - 1
        return {t: Fraction(1), **{t - (1 << lv): Fraction(-1) for lv in range(top)}}
    if strategy.name == "banded_inverse":
        r = strategy.inverse_coefficients
        return {t - j: Fraction(r[j]) for j in range(min(len(r), t + 1))}
    h: list[Fraction] = []
    if isinstance(strategy, BandedToeplitzStrategy):
        c = [Fraction(x) for x in strategy.coefficients]
        for k in range(t + 1):
            h.append(
                Fraction(1)
                if k == 0
                else -sum(c[m] * h[k - m] for m in range(1, min(k, len(c) - 1) + 1))
            )
    else:  # BLT: y = z - sum w_i S_i, S_i <- th_i S_i + y (impulse response)
        th = [Fraction(x) for x in strategy.thetas]
        om = [Fraction(x) for x in strategy.omegas]
        s = [Fraction(0)] * len(th)
        for k in range(t + 1):
            y = Fraction(1) if k == 0 else -sum(w * si for w, si in zip(om, s, strict=True))
            s = [y] * len(th) if k == 0 else [a * si + y for a, si in zip(th, s, strict=True)]
            h.append(y)
    return {j: h[t - j] for j in range(t + 1)}


def _ideal_y(ideal: _Ideal, row: dict[int, Fraction]) -> list:
    iv = mpmath.iv
    iv.prec = 300
    total = [iv.mpf(0)] * ideal.n
    for step, c in row.items():
        zs = ideal.step(step)
        cc = _ivq(c)
        total = [a + cc * z for a, z in zip(total, zs, strict=True)]
    return total


def _ideal_index(x: np.ndarray, y: list, g: float, s_scale: Fraction) -> np.ndarray:
    iv = mpmath.iv
    iv.prec = 300
    out = np.empty(x.size)
    for i, (xi, yi) in enumerate(zip(x.tolist(), y, strict=True)):
        v = _ivq(Fraction(xi) / Fraction(g)) + _ivq(s_scale) * yi
        lo, hi = _ends(v)
        with mpmath.workprec(320):
            k = int(mpmath.floor(lo + 0.5))
            assert lo > k - 0.5 and hi < k + 0.5, "reference undecided: read more bits"
        out[i] = k
    return out


def _forced_values(y: list, g: float, s_scale: Fraction, rng: np.random.Generator) -> np.ndarray:
    """A float value per coordinate: every third is random, the others are put within about
    1e-16 lattice units of a rounding boundary of the ideal noise (either side)."""
    x = rng.normal(scale=3 * g, size=len(y))
    for i in range(0, len(y), 3):
        x[i] = rng.normal(scale=30 * g)
    for i in [i for i in range(len(y)) if i % 3]:
        k = int(rng.integers(-4, 5))
        with mpmath.workprec(320):
            sc = mpmath.mpf(s_scale.numerator) / s_scale.denominator
            x[i] = float((mpmath.mpf(k) + 0.5 - sc * _mid(y[i])) * g)
    return x


def _canonical(k: np.ndarray, g: float, dtype: torch.dtype) -> torch.Tensor:
    """sat(fl(g K)) + 0 in ``dtype``: the bytes of a release of index K."""
    return (torch.tensor(k * g, dtype=torch.float64).to(dtype)) + 0.0


def _optimizer(kind: str, steps: int, key: bytes = KEY, regenerate: bool | None = None):
    from torch.utils.data import TensorDataset

    from renyi.dpsgd.correlated import make_private_correlated

    torch.manual_seed(0)
    model = torch.nn.Linear(20, 5)  # 105 parameters
    data = TensorDataset(torch.randn(200, 20), torch.randint(0, 5, (200,)))
    private = make_private_correlated(
        model, torch.optim.SGD(model.parameters(), lr=0.1), data,
        loss_fn=torch.nn.CrossEntropyLoss(), delta=1e-5, batch_size=20, max_grad_norm=1.0,
        noise_multiplier=0.9, steps=steps, accountant="rdp", seed=1, noise=kind,
        strategy=STRATEGIES[kind], counter_noise=noise.CounterNoise(key),
    )  # fmt: skip
    opt = private.optimizer
    if regenerate is not None:
        from renyi.correlated.streaming import streaming_noise

        opt._regenerate = regenerate
        opt.noise = streaming_noise(opt.strategy, regenerate=opt._fresh if regenerate else None)
    return opt


# --------------------------------------------------------------------- the tests
@pytest.mark.parametrize(
    ("kind", "steps"),
    [(k, 9) for k in STRATEGIES]
    + [pytest.param(k, 40, marks=pytest.mark.slow, id=f"{k}-40") for k in STRATEGIES],
)
def test_release_index_is_the_ideal_one_and_the_bytes_canonical(kind, steps):
    """Every coordinate of every step, random and (float64 steps) forced within ~1e-16 of a
    boundary, float32 and float64 sums: released bytes == sat(fl(g K_ideal)) + 0 (so a
    function of the ideal index only, never -0.0). The slow cases run 40 steps (rows of up
    to 40 terms)."""
    opt = _optimizer(kind, steps)
    n = 105
    ideal = _Ideal(n)
    std = opt.noise_std()
    g = noise.lattice_step(std)
    s_scale = Fraction(std / g) * Fraction(opt.plan.sensitivity.value)
    rng = np.random.default_rng(7)
    forced_total = 0
    for t in range(steps):
        y = _ideal_y(ideal, _exact_row(opt.strategy, t))
        x = _forced_values(y, g, s_scale, rng)
        dtype = torch.float32 if t % 2 else torch.float64
        x = torch.tensor(x, dtype=dtype).numpy().astype(np.float64)  # representable in dtype
        if t == 1:
            x[0] = -0.0
        k = _ideal_index(x, y, g, s_scale)
        out = opt.release_noisy_sum(torch.tensor(x, dtype=dtype))
        assert out.dtype == dtype
        want = _canonical(k, g, dtype)
        assert out.numpy().tobytes() == want.numpy().tobytes(), (kind, t)
        assert not torch.any(torch.signbit(out) & (out == 0))
        if dtype == torch.float64:  # float32 sums cannot come closer than ~1e-7
            forced_total += n - len(range(0, n, 3))
    assert forced_total >= 350  # 70 values per float64 step


@pytest.mark.parametrize("kind", list(STRATEGIES))
def test_buffered_noise_releases_what_the_counters_alone_release(kind):
    """The buffered float filter (+ exact recomputation near boundaries) and a release from
    the counters alone (every coordinate recomputed from the exact row: error bound inf) give
    the same bytes; for the banded inverse, so does the filter that regenerates its past
    draws instead of storing them."""
    steps = 6
    opt = _optimizer(kind, steps, regenerate=False)
    regen = _optimizer(kind, steps, regenerate=True) if kind == "banded_inverse" else None
    cn = noise.CounterNoise(KEY)
    n = 105
    ideal = _Ideal(n)
    std = opt.noise_std()
    g = noise.lattice_step(std)
    sens = opt.plan.sensitivity.value
    s_scale = Fraction(std / g) * Fraction(sens)
    rng = np.random.default_rng(3)
    for t in range(steps):
        y = _ideal_y(ideal, _exact_row(opt.strategy, t))
        x = _forced_values(y, g, s_scale, rng)[:40]
        x = np.concatenate([x, rng.normal(scale=g, size=n - 40)])
        a = opt.release_noisy_sum(torch.tensor(x))
        row = opt.exactness.row(t, 128)
        b = cn.snap_combination(
            torch.tensor(x), torch.zeros(n, dtype=torch.float64), std, error_bound=float("inf"),
            row=row, stream=0, scale=sens,
        )  # fmt: skip
        assert a.numpy().tobytes() == b.numpy().tobytes(), (kind, t)
        if regen is not None:
            c = regen.release_noisy_sum(torch.tensor(x))
            assert a.numpy().tobytes() == c.numpy().tobytes()


def test_rows_and_error_bounds_hold_against_the_exact_combination():
    """The filters' float64 noise is within the proven bound B_t of the ideal combination
    (with the exact rows), and B_t is small: about 1e-13, so about 1e-12 of the values are
    recomputed at 16 x sens lattice units of noise."""
    n, steps = 60, 10
    ideal = _Ideal(n)
    for kind, strategy in STRATEGIES.items():
        opt = _optimizer(kind, steps)
        for t in range(steps):
            yhat, bound, _ = opt._next_noise()
            y = _ideal_y(ideal, _exact_row(strategy, t))
            with mpmath.workprec(320):
                pairs = zip(yhat.tolist()[:n], y, strict=True)
                err = max(float(abs(mpmath.mpf(a) - _mid(b))) for a, b in pairs)
            assert err <= bound < 5e-13, (kind, t, err, bound)
            row = opt.exactness.row(t, 128)
            want = _exact_row(strategy, t)
            assert set(row.steps) == set(want)
            for st, num in zip(row.steps, row.numerators, strict=True):
                assert abs(Fraction(num, 2**row.shift) - want[st]) <= Fraction(
                    row.radius, 2**row.shift
                )


def test_counter_normals_are_within_their_bound_including_the_extreme_cells():
    """|z - Z| <= err for random draws and for forced radius uniforms at both ends (U1 below
    2**-9, which reads more levels, and 1 - U1 below 2**-40)."""
    cn = noise.CounterNoise(KEY)
    z, err = cn.standard_normal(400, stream=0, step=2, with_bound=True)
    ideal = _Ideal(400).step(2)
    with mpmath.workprec(320):
        worst = max(float(abs(mpmath.mpf(a) - _mid(b))) for a, b in zip(z, ideal, strict=True))
    assert worst <= err < 1e-13

    class Fake:  # one unit per case: main words, then level words, chosen
        def __init__(self, rows):
            self.rows = rows  # list of per-unit [(w1, w2), (e1, e2) level 1, level 2, ...]

        def main_bytes(self, u0, k):
            return np.array([self.rows[u][0] for u in range(u0, u0 + k)], "<u4").tobytes()

        def _blocks_bytes(self, level, start, nbytes):
            u0 = start // 8
            return np.array(
                [self.rows[u][level] for u in range(u0, u0 + nbytes // 8)], "<u4"
            ).tobytes()

        def ext(self, level, units):
            w = np.array([self.rows[int(u)][level] for u in units], dtype=np.int64)
            return w[:, 0], w[:, 1]

    from renyi.noise import _combination

    rows = []
    r = np.random.default_rng(0)
    for w1 in [0, 1, 2**20, 2**30 - 1, 2**31 - 1, 2**31 - 2, 2**30 + 12345]:
        levels = [(w1, int(r.integers(2**32)))] + [
            (int(r.integers(2**32)), int(r.integers(2**32))) for _ in range(6)
        ]
        if w1 == 0:
            levels[1] = (0, levels[1][1])  # U1 < 2**-63: reads levels 2 and 3
        if w1 == 2**31 - 1:
            levels[1] = (2**32 - 1, levels[1][1])  # 1 - U1 <= 2**-63
        rows.append(levels)
    fake = Fake(rows)
    z, err = _combination.normals(fake, 0, 2 * len(rows))
    iv = mpmath.iv
    iv.prec = 400
    for p, levels in enumerate(rows):
        n1, n2 = levels[0][0] & 0x7FFFFFFF, levels[0][1]
        for e1, e2 in levels[1:]:
            n1, n2 = (n1 << 32) | e1, (n2 << 32) | e2
        b = 31 + 32 * 6
        u1, u2 = _box(n1, b), _box(n2, b + 1)
        rr = iv.sqrt(-2 * iv.log(u1))
        for which, zz in ((0, rr * iv.cos(2 * iv.pi * u2)), (1, rr * iv.sin(2 * iv.pi * u2))):
            with mpmath.workprec(320):
                d = float(abs(mpmath.mpf(z[2 * p + which]) - _mid(zz)))
            assert d <= err, (p, which)
    assert err < 1e-12


def test_libm_accuracy_assumed_by_the_bound():
    """The bound assumes float64 log, log1p, cos, sin within LIBM_ULPS = 16 ulp; measured
    here at most 4 on the ranges the normals use (a 4-fold margin)."""
    r = np.random.default_rng(1)
    u = np.concatenate([r.random(3000), 2.0 ** -r.uniform(0, 60, 1000)])
    m = r.random(3000) * 0.5
    th = r.random(3000) * 2 * np.pi
    cases = [(np.log, mpmath.log, u), (np.log1p, mpmath.log1p, -m), (np.cos, mpmath.cos, th)]
    cases.append((np.sin, mpmath.sin, th))
    mpmath.mp.prec = 120
    for fn, ref, xs in cases:
        got = fn(xs)
        worst = 0.0
        for x, y in zip(xs.tolist(), got.tolist(), strict=True):
            exact = ref(mpmath.mpf(x))
            if exact == 0:
                continue
            ulp = np.spacing(abs(float(exact)))
            worst = max(worst, float(abs(mpmath.mpf(y) - exact)) / ulp)
        assert worst <= 4.0 <= noise.LIBM_ULPS / 4, (fn.__name__, worst)


def test_exact_tier_reads_more_levels_and_settles_a_tie_at_the_cap():
    """An exact cancellation (Z_a - Z_a, an impossible event for the ideal sum of distinct
    normals) lying on a boundary is never decided: the tier reads every level up to the cap
    and takes the midpoint's index; off the boundary it decides at the first level."""
    from renyi.noise import _combination

    row = noise.CombinationRow.from_floats([3, 3], [1.0, -1.0])
    pos = np.array([4, 5])
    j = _combination.decide(KEY, 0, pos, np.array([0.25, -0.25]), 10.0, 1.0, lambda b: row)
    assert list(j) == [0.0, 0.0]
    j = _combination.decide(KEY, 0, pos, np.array([0.5, -0.5]), 10.0, 1.0, lambda b: row, 3)
    assert list(j) == [1.0, 0.0]  # round-half-up of the midpoint


def test_snap_combination_checks_its_inputs():
    cn = noise.CounterNoise(KEY)
    row = noise.CombinationRow.from_floats([0], [1.0])
    x = np.zeros(3)
    for bad in ({"error_bound": -1.0}, {"error_bound": float("nan")}, {"scale": 0.0}):
        kw = {"error_bound": 0.0, "row": row, "stream": 0, **bad}
        with pytest.raises(PrivacyParameterError):
            cn.snap_combination(x, np.zeros(3), 1.0, **kw)
    with pytest.raises(PrivacyParameterError, match="noise"):
        cn.snap_combination(x, np.zeros(2), 1.0, error_bound=0.0, row=row, stream=0)
    with pytest.raises(PrivacyParameterError, match="noise"):
        cn.snap_combination(x, np.array([0, np.nan, 0]), 1.0, error_bound=0.0, row=row, stream=0)
    with pytest.raises(PrivacyParameterError, match="row"):
        cn.snap_combination(x, np.zeros(3), 1.0, error_bound=0.0, row=[1.0], stream=0)
    with pytest.raises(PrivacyParameterError, match="coefficients"):
        cn.gaussian_combination(x, 1.0, steps=[0, 1], coefficients=[1.0], stream=0)
    with pytest.raises(PrivacyParameterError, match="row"):
        noise.CombinationRow((0,), (1, 2), 0)


def test_checkpoints_carry_the_error_record_and_refuse_one_without_it():
    """Resume rebuilds the filter's error bookkeeping: the bound of the next step is the one
    of an uninterrupted run; a checkpoint without it (or without the key) is refused."""
    import copy

    opt = _optimizer("blt", 6)
    x = torch.zeros(105, dtype=torch.float64)
    for _ in range(3):
        opt.release_noisy_sum(x)
        opt.steps_taken += 1  # the noise stage alone: the checkpoint's step count follows it
    state = copy.deepcopy(opt.state_dict())
    _, bound, _ = opt._next_noise()
    other = _optimizer("blt", 6, key=bytes(32))
    other.load_state_dict(copy.deepcopy(state))
    assert other.counter_noise.state_dict() == opt.counter_noise.state_dict()
    assert other._next_noise()[1] == bound
    for drop in ("exactness", "counter"):
        bad = copy.deepcopy(state)
        bad["correlated"][drop] = None
        with pytest.raises(PrivacyParameterError, match=drop):
            _optimizer("blt", 6).load_state_dict(bad)
