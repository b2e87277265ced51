"""DP-FedAvg with client-level DP (McMahan et al. 2018) and adaptive clipping (Andrew et al. 2021).

Each round the server samples clients, each sampled client sends a model update, the server
clips every update to L2 norm ``C``, sums them, adds ``N(0, (z C)²)`` per coordinate and
divides by the *expected* number of sampled clients ``m`` (a fixed denominator: dividing by
the realised count would leak it), so the noise on the average is ``z C / m``.

**Guarantee** (client-level: neighbouring datasets differ in one client's whole data):

* ``sampling="poisson"``: every client joins a round independently with probability
  ``q = m / population``; **add/remove** neighbours; the sum has sensitivity ``C``, so one
  round is the Poisson-subsampled Gaussian mechanism with noise multiplier ``z`` (Mironov,
  Talwar & Zhang 2019), composed over the rounds by an accountant of :mod:`renyi.accountants`.
* ``sampling="fixed"``: exactly ``m`` clients drawn without replacement; **replace-one**
  neighbours (one client's data swapped); replacing an update moves the sum by up to ``2C``,
  so the event is the Gaussian with noise multiplier ``z / 2`` sampled without replacement
  (Wang, Balle & Kasiviswanathan 2019).

**Adaptive clipping** (Andrew et al. 2021, Algorithm 1 and Theorem 1): each client also
reports ``b_i = 1[||Delta_i|| <= C]``; the server releases the centred noisy count
``sum (b_i - 1/2) + N(0, sigma_b²)`` (add/remove sensitivity 1/2; replace-one 1, matching the
value's ``2C``), estimates ``b~ = that / m + 1/2`` and updates
``C <- C exp(-eta (b~ - gamma))`` (geometric update towards the ``gamma`` quantile). The
pair (clipped sum, count) is then as private as one Gaussian mechanism with noise
multiplier ``z`` when the value noise multiplier is
``z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)`` (requires ``z < 2 sigma_b``). Defaults as in the
paper: ``C0 = 0.1, gamma = 0.5, eta = 0.2, sigma_b = m / 20``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from renyi import noise
from renyi._validation import check_delta, check_int, check_positive, check_probability, fail
from renyi.accountants import Accountant, EpsilonResult, make_accountant
from renyi.analysis.events import (
    Event,
    GaussianEvent,
    Neighbouring,
    PoissonSampledEvent,
    SampledWithoutReplacementEvent,
)
from renyi.random import get_source

__all__ = [
    "AdaptiveClipping",
    "DpFedAvg",
    "RoundReport",
    "clip_updates",
    "effective_noise_multiplier",
    "fedavg_epsilon",
    "fedavg_event",
]

Sampling = Literal["poisson", "fixed"]


def effective_noise_multiplier(noise_multiplier: float, count_stddev: float) -> float:
    """Value noise multiplier ``(z^-2 - (2 sigma_b)^-2)^(-1/2)`` (Andrew et al. 2021, Thm 1).

    With this noise on the clipped sum and ``N(0, sigma_b²)`` on the unclipped count, the
    round is as private as a Gaussian mechanism of noise multiplier ``z``. Needs
    ``z < 2 sigma_b``.

    >>> round(effective_noise_multiplier(1.0, 5.0), 6)
    1.005038
    """
    z = check_positive("noise_multiplier", noise_multiplier)
    sb = check_positive("count_stddev", count_stddev)
    if z >= 2.0 * sb:
        raise fail(
            "noise_multiplier",
            noise_multiplier,
            f"< 2 * count_stddev = {2.0 * sb:g} (the count query would use the whole budget)",
        )
    return float((z**-2 - (2.0 * sb) ** -2) ** -0.5)


def row_norms(u: NDArray[np.float64]) -> NDArray[np.float64]:
    """L2 norm of each row without overflow: ``max|u| * ||u / max|u|||``.

    ``numpy.linalg.norm`` squares the entries, so a finite row with entries near ``1e200``
    gets norm ``inf`` (and clipping would then scale it to zero); scaling first keeps the
    norm finite whenever it is representable.

    >>> float(row_norms(np.full((1, 4), 1e200))[0])
    2e+200
    """
    scale = np.max(np.abs(u), axis=1) if u.shape[1] else np.zeros(u.shape[0])
    safe = np.where(scale > 0, scale, 1.0)
    return scale * np.linalg.norm(u / safe[:, None], axis=1)


def clip_updates(
    updates: ArrayLike, clip_norm: float
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """Clip each row to L2 norm ``clip_norm``; also return which rows were within it."""
    u = np.asarray(updates, dtype=np.float64)
    if u.ndim != 2 or not np.isfinite(u).all():
        raise fail("updates", u.shape, "a finite array of shape (clients, dimension)")
    c = check_positive("clip_norm", clip_norm)
    norms = row_norms(u)
    within = norms <= c
    scale = np.where(within, 1.0, c / np.maximum(norms, np.finfo(float).tiny))
    return u * scale[:, None], within


def fedavg_event(
    noise_multiplier: float,
    *,
    population: int,
    clients_per_round: int,
    sampling: Sampling = "poisson",
) -> Event:
    """The event of one DP-FedAvg round (module docstring for the neighbouring relation).

    >>> fedavg_event(1.0, population=1000, clients_per_round=100).sampling_rate
    0.1
    """
    z = check_positive("noise_multiplier", noise_multiplier)
    n = check_int("population", population, 1)
    m = check_int("clients_per_round", clients_per_round, 1)
    if m > n:
        raise fail("clients_per_round", m, f"an integer in [1, population={n}]")
    if sampling == "poisson":
        return PoissonSampledEvent(m / n, GaussianEvent(z))
    if sampling == "fixed":
        inner = GaussianEvent(z / 2.0, neighbouring=Neighbouring.REPLACE_ONE)
        return SampledWithoutReplacementEvent(n, m, inner)
    raise fail("sampling", sampling, "'poisson' or 'fixed'")


def fedavg_epsilon(
    noise_multiplier: float,
    *,
    population: int,
    clients_per_round: int,
    rounds: int,
    delta: float,
    sampling: Sampling = "poisson",
    accountant: str | Accountant = "rdp",
) -> EpsilonResult:
    """Client-level ε of ``rounds`` DP-FedAvg rounds at ``delta`` (accountant's bound).

    >>> r = fedavg_epsilon(1.0, population=1000, clients_per_round=100, rounds=100,
    ...                    delta=1e-5)
    >>> 0 < r.epsilon < 10
    True
    """
    t = check_int("rounds", rounds, 1)
    d = check_delta(delta)
    event = fedavg_event(
        noise_multiplier,
        population=population,
        clients_per_round=clients_per_round,
        sampling=sampling,
    )
    return make_accountant(accountant).compose(event, count=t).epsilon(d)


@dataclass
class AdaptiveClipping:
    """Geometric clip-norm update towards a quantile (Andrew et al. 2021, Alg. 1).

    ``count_stddev=None`` means ``clients_per_round / 20`` (the paper's default).
    """

    initial: float = 0.1
    target_quantile: float = 0.5
    learning_rate: float = 0.2
    count_stddev: float | None = None

    def __post_init__(self) -> None:
        check_positive("initial", self.initial)
        check_probability("target_quantile", self.target_quantile)
        check_positive("learning_rate", self.learning_rate)
        if self.count_stddev is not None:
            check_positive("count_stddev", self.count_stddev)

    def stddev(self, clients_per_round: int) -> float:
        """``sigma_b`` for ``m`` expected clients."""
        if self.count_stddev is not None:
            return float(self.count_stddev)
        return clients_per_round / 20.0


@dataclass(frozen=True)
class RoundReport:
    """What one round released (``clip_norm`` is the norm used in that round)."""

    round: int
    participants: int
    clip_norm: float
    value_noise_multiplier: float
    unclipped_fraction: float | None
    noise_std_on_average: float


@dataclass
class DpFedAvg:
    """Server side of client-level DP-FedAvg: sampling, clipping, noise and accounting.

    ``noise_multiplier`` is the ``z`` of the guarantee; with adaptive clipping the value
    noise uses :func:`effective_noise_multiplier` so that the accounted ``z`` still holds.
    :meth:`round` takes the updates of the sampled clients and returns the noisy average
    update; :meth:`epsilon` reports the guarantee so far.

    >>> server = DpFedAvg(population=100, clients_per_round=10, noise_multiplier=1.0,
    ...                   clip_norm=1.0, rng=np.random.default_rng(0))
    >>> ids = server.sample_clients()
    >>> avg = server.round(np.zeros((len(ids), 3)))
    >>> avg.shape
    (3,)
    """

    population: int
    clients_per_round: int
    noise_multiplier: float
    clip_norm: float = 1.0
    sampling: Sampling = "poisson"
    adaptive: AdaptiveClipping | None = None
    accountant: str = "rdp"
    rng: np.random.Generator | None = None
    rounds_done: int = 0
    history: list[RoundReport] = field(default_factory=list)

    def __post_init__(self) -> None:
        # validates population, clients_per_round, noise_multiplier and sampling
        fedavg_event(
            self.noise_multiplier,
            population=self.population,
            clients_per_round=self.clients_per_round,
            sampling=self.sampling,
        )
        check_positive("clip_norm", self.clip_norm)
        if self.adaptive is not None:
            self.clip_norm = float(self.adaptive.initial)
            effective_noise_multiplier(
                self.noise_multiplier, self.adaptive.stddev(self.clients_per_round)
            )

    def sample_clients(self) -> NDArray[np.int64]:
        """Indices of this round's clients (Poisson or fixed-size, as configured)."""
        src = get_source(self.rng)
        n, m = self.population, self.clients_per_round
        if self.sampling == "poisson":
            return np.flatnonzero(src.bernoulli(np.full(n, m), np.full(n, n))).astype(np.int64)
        keys = src.words(n).astype(np.float64)
        return np.sort(np.argsort(keys, kind="stable")[:m]).astype(np.int64)

    def round(self, updates: ArrayLike) -> NDArray[np.float64]:
        """Clip, sum, add noise, divide by ``clients_per_round``; adapt the clip norm."""
        u = np.asarray(updates, dtype=np.float64)
        if u.ndim != 2:
            raise fail("updates", u.shape, "shape (participants, dimension)")
        m = self.clients_per_round
        if self.sampling == "fixed" and u.shape[0] != m:
            raise fail("updates", u.shape[0], f"exactly clients_per_round={m} rows")
        c = self.clip_norm
        z_value = self.noise_multiplier
        frac: float | None = None
        if u.shape[0]:
            clipped, within = clip_updates(u, c)
            total = clipped.sum(axis=0)
        else:
            within = np.zeros(0, dtype=bool)
            total = np.zeros(u.shape[1])
        if self.adaptive is not None:
            sb = self.adaptive.stddev(m)
            z_value = effective_noise_multiplier(self.noise_multiplier, sb)
            # centred bits b_i - 1/2: add/remove sensitivity 1/2 (replace-one: 1), as the
            # noise split of Andrew et al. (Thm 1) requires
            centred = float(within.sum()) - 0.5 * within.size
            frac = float(noise.gaussian(centred, sb, rng=self.rng)) / m + 0.5
            self.clip_norm = c * math.exp(
                -self.adaptive.learning_rate * (frac - self.adaptive.target_quantile)
            )
        noisy = noise.gaussian(total, z_value * c, rng=self.rng)
        self.rounds_done += 1
        self.history.append(
            RoundReport(
                round=self.rounds_done,
                participants=int(u.shape[0]),
                clip_norm=c,
                value_noise_multiplier=z_value,
                unclipped_fraction=frac,
                noise_std_on_average=z_value * c / m,
            )
        )
        return noisy / m

    def epsilon(self, delta: float) -> EpsilonResult:
        """Client-level ε after the rounds done so far (0 before the first round)."""
        d = check_delta(delta)
        if self.rounds_done == 0:
            return EpsilonResult(0.0, d, str(self.accountant))
        return fedavg_epsilon(
            self.noise_multiplier,
            population=self.population,
            clients_per_round=self.clients_per_round,
            rounds=self.rounds_done,
            delta=d,
            sampling=self.sampling,
            accountant=self.accountant,
        )
