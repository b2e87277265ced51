"""Calibrate DP-SGD-style parameters to a target (ε, δ) with any accountant.

"What noise multiplier gives ε = 3?" — bracket, root-find, then verify: the returned
parameter is always on the safe side of the boundary (its ε never exceeds the target, as
computed by the chosen accountant) and within ``rtol`` (default 0.01%) of it, so no utility
is thrown away.

The event calibrated is T = ``steps`` compositions of the Poisson-subsampled Gaussian with
rate ``sample_rate`` (add/remove neighbours), or of the Gaussian sampled without replacement
when ``sampling="without_replacement"`` (replace-one neighbours).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any

from scipy.optimize import brentq

from renyi._validation import check_delta, check_int, check_positive, check_probability, fail
from renyi.accountants import Accountant, EpsilonResult, PldAccountant, make_accountant
from renyi.analysis.events import Event, dpsgd_event
from renyi.errors import OrderAtGridEdgeWarning, PrivacyParameterError, UnsupportedEventError

__all__ = [
    "CalibrationResult",
    "calibrate_event_noise",
    "calibrate_noise_multiplier",
    "calibrate_sample_rate",
    "calibrate_steps",
    "dpsgd_epsilon",
    "dpsgd_event",
    "epochs_to_steps",
]


@dataclass(frozen=True)
class CalibrationResult:
    """A calibrated parameter with the ε it achieves (≤ ``target_epsilon``) and how."""

    parameter: str
    value: float
    epsilon: float
    target_epsilon: float
    delta: float
    accountant: str
    order: float | None
    evaluations: int
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def noise_multiplier(self) -> float:
        if self.parameter != "noise_multiplier":
            raise AttributeError("this result calibrated " + self.parameter)
        return self.value


def dpsgd_epsilon(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    accountant: str | Accountant = "rdp",
    **event_kwargs: Any,
) -> EpsilonResult:
    """ε at δ after ``steps`` DP-SGD steps, by the chosen accountant."""
    acc = make_accountant(accountant)
    acc.compose(dpsgd_event(noise_multiplier, sample_rate, **event_kwargs), steps)
    return acc.epsilon(delta)


def epochs_to_steps(epochs: float, dataset_size: int, batch_size: int) -> tuple[int, float]:
    """(steps, sample_rate) for ``epochs`` passes with expected batch ``batch_size``.

    steps = ⌈epochs · dataset_size / batch_size⌉ computed in exact rational arithmetic, with
    ``epochs`` read as the decimal the user wrote (0.1 is one tenth, not the binary float just
    above it), so 2 epochs of 60000 at 256 is 469 steps (468.75 rounded *up*: the accountant
    charges at least the requested epochs, never fewer) and 0.1 epoch of 1000 at 10 is 10.
    sample_rate = batch_size / dataset_size.
    """
    epochs = check_positive("epochs", epochs)
    n = check_int("dataset_size", dataset_size, 1)
    b = check_int("batch_size", batch_size, 1)
    if b > n:
        raise fail("batch_size", b, f"an integer in [1, dataset_size={n}]")
    steps = math.ceil(Fraction(Decimal(repr(epochs))) * n / b)
    return int(steps), b / n


def _epsilon_fn(
    accountant: str | Accountant, delta: float, build: Callable[[float], tuple[Event, int]]
) -> tuple[Callable[[float], EpsilonResult], list[int]]:
    calls = [0]

    def eps(x: float) -> EpsilonResult:
        calls[0] += 1
        acc = make_accountant(accountant)
        event, count = build(x)
        acc.compose(event, count)
        with warnings.catch_warnings():
            # probing far from the answer often hits the grid's edge; only the answer matters
            warnings.simplefilter("ignore", OrderAtGridEdgeWarning)
            return acc.epsilon(delta)

    return eps, calls


def calibrate_noise_multiplier(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: str | Accountant = "rdp",
    *,
    rtol: float = 1e-4,
    max_noise_multiplier: float = 1e4,
    **event_kwargs: Any,
) -> CalibrationResult:
    """Smallest noise multiplier (within ``rtol``) whose ε at δ is ≤ ``target_epsilon``.

    Bracketing starts from a wide interval and doubles outward; Brent's method on log σ
    finds the boundary; the answer is then moved up until the accountant verifies
    ε ≤ target. Raises if no σ ≤ ``max_noise_multiplier`` reaches the target (e.g. an RDP
    grid whose largest order cannot get below log(1/δ)/(α_max - 1)).
    """
    target = check_positive("target_epsilon", target_epsilon)
    delta = check_delta(delta)
    q = check_probability("sample_rate", sample_rate)
    t = check_int("steps", steps, 1)
    rtol = check_positive("rtol", rtol)
    if q == 0.0:
        raise fail("sample_rate", sample_rate, "a number in (0, 1] (q = 0 releases nothing)")

    guess, factor = _guess(target, delta, q, t, accountant, event_kwargs)
    return calibrate_event_noise(
        target,
        delta,
        lambda s: (dpsgd_event(s, q, **event_kwargs), t),
        accountant,
        rtol=rtol,
        max_noise_multiplier=max_noise_multiplier,
        guess=guess,
        factor=factor,
    )


def calibrate_event_noise(
    target_epsilon: float,
    delta: float,
    build: Callable[[float], tuple[Event, int]],
    accountant: str | Accountant = "rdp",
    *,
    rtol: float = 1e-4,
    max_noise_multiplier: float = 1e4,
    guess: float | None = None,
    factor: float = 1.25,
) -> CalibrationResult:
    """Smallest noise multiplier σ (within ``rtol``, verified on the safe side) whose event
    ``count`` times, ``(event, count) = build(σ)``, costs at most ``target_epsilon`` at
    ``delta``: the one calibration loop every noise calibration uses.

    An unreachable target is found at once (the largest noise allowed is cheap to account).
    With a ``guess`` (a cheap answer from a faster accountant, close and usually above) the
    bracket grows from it by ``factor``, so tiny σs, where PLD work explodes, are never
    probed; without one it starts wide and grows 4-fold outward. Brent's method on log σ
    then finds the boundary (:func:`_finish`).
    """
    target = check_positive("target_epsilon", target_epsilon)
    delta = check_delta(delta)
    rtol = check_positive("rtol", rtol)
    eps, calls = _epsilon_fn(accountant, delta, build)
    if eps(max_noise_multiplier).epsilon > target:
        raise _unreachable(target, delta, accountant, max_noise_multiplier)
    if guess is not None:
        hi = guess
        while eps(hi).epsilon > target:
            hi *= factor
            if hi > max_noise_multiplier:
                raise _unreachable(target, delta, accountant, max_noise_multiplier)
        lo = hi / factor
        while eps(lo).epsilon <= target:
            hi, lo = lo, lo / factor
            if lo < 1e-6:
                raise fail("target_epsilon", target, "a target that some noise multiplier exceeds")
        return _finish(
            "noise_multiplier", eps, calls, lo, hi, target, delta, rtol, increasing=False
        )
    lo, hi = 0.05, 2.0
    while eps(lo).epsilon <= target:
        lo /= 4.0
        if lo < 1e-6:
            raise fail("target_epsilon", target, "a target that some noise multiplier exceeds")
    while eps(hi).epsilon > target:
        lo, hi = hi, hi * 4.0
        if hi > max_noise_multiplier:
            raise _unreachable(target, delta, accountant, max_noise_multiplier)
    return _finish("noise_multiplier", eps, calls, lo, hi, target, delta, rtol, increasing=False)


def _unreachable(
    target: float, delta: float, accountant: str | Accountant, limit: float
) -> PrivacyParameterError:
    return PrivacyParameterError(
        f"target_epsilon={target!r} is unreachable at delta={delta!r} with the "
        f"{make_accountant(accountant).name} accountant for noise_multiplier <= {limit:g}"
    )


def _guess(
    target: float,
    delta: float,
    q: float,
    steps: int,
    accountant: str | Accountant,
    event_kwargs: dict[str, Any],
) -> tuple[float | None, float]:
    """A cheap starting noise multiplier for slow accountants, and the bracket factor.

    PLD with a fine grid: the same accountant on a 10x coarser grid (pessimistic, so its
    sigma is slightly above the fine one: a 0.4% bracket, widened if needed). Other non-RDP
    accountants: the RDP answer (25% bracket). None for the fast accountants, which bracket
    from scratch.
    """
    acc = make_accountant(accountant)
    if acc.name in ("rdp", "zcdp", "approx"):
        return None, 1.25
    coarse: str | Accountant = "rdp"
    factor = 1.25
    if isinstance(acc, PldAccountant):
        config = acc._config()
        h = config["value_discretization_interval"]
        if h < 1e-3:
            coarse = PldAccountant(min(10 * h, 1e-3), config["tail_mass"])
            factor = 1.004
    try:
        value = calibrate_noise_multiplier(
            target, delta, q, steps, coarse, rtol=1e-3, **event_kwargs
        ).value
    except (PrivacyParameterError, UnsupportedEventError):
        return None, 1.25
    return value, factor


def calibrate_steps(
    target_epsilon: float,
    delta: float,
    noise_multiplier: float,
    sample_rate: float,
    accountant: str | Accountant = "rdp",
    *,
    max_steps: int = 10**9,
    **event_kwargs: Any,
) -> CalibrationResult:
    """Largest number of steps whose ε at δ stays ≤ ``target_epsilon`` (exact integer search)."""
    target = check_positive("target_epsilon", target_epsilon)
    delta = check_delta(delta)
    event = dpsgd_event(noise_multiplier, sample_rate, **event_kwargs)
    eps, calls = _epsilon_fn(accountant, delta, lambda n: (event, int(n)))
    first = eps(1)
    if first.epsilon > target:
        raise PrivacyParameterError(
            f"target_epsilon={target!r} is below the ε of a single step ({first.epsilon:.6g})"
        )
    lo, best = 1, first
    hi = 2
    while True:
        r = eps(hi)
        if r.epsilon > target:
            break
        lo, best = hi, r
        if hi >= max_steps:
            return _steps_result(lo, best, target, delta, calls[0])
        hi = min(hi * 2, max_steps)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        r = eps(mid)
        if r.epsilon <= target:
            lo, best = mid, r
        else:
            hi = mid
    return _steps_result(lo, best, target, delta, calls[0])


def _steps_result(
    steps: int, best: EpsilonResult, target: float, delta: float, evaluations: int
) -> CalibrationResult:
    return CalibrationResult(
        "steps",
        float(steps),
        best.epsilon,
        target,
        delta,
        best.accountant,
        best.order,
        evaluations,
    )


def calibrate_sample_rate(
    target_epsilon: float,
    delta: float,
    noise_multiplier: float,
    steps: int,
    accountant: str | Accountant = "rdp",
    *,
    rtol: float = 1e-4,
) -> CalibrationResult:
    """Largest Poisson sampling rate (within ``rtol``) whose ε at δ is ≤ ``target_epsilon``."""
    target = check_positive("target_epsilon", target_epsilon)
    delta = check_delta(delta)
    t = check_int("steps", steps, 1)
    eps, calls = _epsilon_fn(accountant, delta, lambda q: (dpsgd_event(noise_multiplier, q), t))
    top = eps(1.0)
    if top.epsilon <= target:
        return CalibrationResult(
            "sample_rate", 1.0, top.epsilon, target, delta, top.accountant, top.order, calls[0]
        )
    lo, hi = 1e-3, 1.0
    while eps(lo).epsilon > target:
        hi, lo = lo, lo / 10.0
        if lo < 1e-12:
            raise PrivacyParameterError(
                f"target_epsilon={target!r} is unreachable even at sample_rate=1e-12"
            )
    return _finish("sample_rate", eps, calls, lo, hi, target, delta, rtol, increasing=True)


def _finish(
    parameter: str,
    eps: Callable[[float], EpsilonResult],
    calls: list[int],
    lo: float,
    hi: float,
    target: float,
    delta: float,
    rtol: float,
    *,
    increasing: bool,
) -> CalibrationResult:
    """Root-find on log x between lo and hi, then step to the verified safe side.

    ``increasing``: ε grows with x (sample rate) — safe side is below; otherwise (noise) above.
    """

    def f(logx: float) -> float:
        return math.log(max(eps(math.exp(logx)).epsilon, 1e-300)) - math.log(target)

    step = math.log1p(rtol / 4.0)
    root = brentq(f, math.log(lo), math.log(hi), xtol=step)
    x = math.exp(root - step) if increasing else math.exp(root + step)
    for _ in range(200):
        r = eps(x)
        if r.epsilon <= target:
            return CalibrationResult(
                parameter,
                x,
                r.epsilon,
                target,
                delta,
                r.accountant,
                r.order,
                calls[0],
                details={"epsilon_lower": r.epsilon_lower} if r.epsilon_lower is not None else {},
            )
        x = x / (1.0 + rtol / 4.0) if increasing else x * (1.0 + rtol / 4.0)
    raise PrivacyParameterError(  # pragma: no cover - would mean a non-monotone accountant
        f"could not verify a conservative {parameter} near {x!r}"
    )
