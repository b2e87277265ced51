"""Distributed discrete Gaussian (DDG) under secure aggregation (Kairouz, Liu & Steinke 2021).

"The Distributed Discrete Gaussian Mechanism for Federated Learning with Secure
Aggregation", ICML 2021, arXiv:2102.06387. Each of ``n`` clients clips its update to L2 norm
``C``, scales by ``1/gamma``, rounds to integers (unbiased randomized rounding), adds its own
discrete Gaussian ``N_Z(0, sigma²)`` per coordinate and sends the result masked by pairwise
one-time pads modulo ``2**64``; the server learns only the sum. The sum of ``n``
independent ``N_Z(0, sigma²)`` is not a discrete Gaussian, but it is close to
``N_Z(0, n sigma²)``: with

``tau = 10 sum_{k=1}^{n-1} exp(-2 pi² sigma² k / (k + 1))``

and ``a = Delta_2 / (sqrt(n) sigma)``, ``b = Delta_1 / (sqrt(n) sigma)`` (sensitivities of the
integer sum in L2 and L1, ``d`` coordinates), the release satisfies for every ``alpha > 1``
(their Thm 1 with Prop 14, valid for ``sigma >= 1/2``):

``eps(alpha) = min(alpha a²/2 + tau d, alpha (a² + 2 b tau + tau² d)/2,
alpha (a + tau sqrt(d))²/2)``

The last two are zCDP bounds, so the round is also ``rho``-zCDP with ``rho`` the smaller of
them over ``alpha``. :func:`ddg_rdp` is that formula (pure);
:class:`DistributedDiscreteGaussianEvent` gives it to every accountant through the event
registry.

Sensitivities (replace-one: one participant's update changes, the others and the number of
participants do not): randomized rounding moves each coordinate by less than 1, so a
scaled update of norm ``<= C/gamma`` is rounded to norm ``< C/gamma + sqrt(d)`` (KLS's
conditional rounding gives a smaller bound at the price of a data-dependent retry loop; not
used), hence
``Delta_2 = 2 (C/gamma + sqrt(d))`` and, the difference being an integer vector,
``Delta_1 = min(sqrt(d) Delta_2, Delta_2²)`` (:func:`ddg_sensitivities`).

Secure aggregation here is pairwise masking over the authenticated channels of
:mod:`renyi.federated.channels` (every pair of participants shares a ChaCha20 mask stream
derived from its channel's noise key; one adds it, the other subtracts it). Any single
masked vector is uniformly distributed modulo ``2**64`` given the others' keys are unknown,
so the server sees only the sum. A participant that drops out after sending would leave
its masks in the sum: :meth:`DdgServer.aggregate` refuses (no dropout recovery here).

**For DP-FedAvg under secure aggregation use** :mod:`renyi.federated.secure_fedavg`
**instead** (rounded continuous Gaussian under the double masking of
:mod:`renyi.federated.secagg`): dropouts are recovered without unmasking anyone, a
malicious client's influence is bounded, and the accounting is exact (rounding after the
continuous noise is post-processing, so the parties' μ-GDP star bound converts to (ε, δ)
through the Gaussian's exact profile, where this module's bound is an RDP curve with τ and
a rounding-inflated sensitivity). At the same worst-case ε against a server lying about
dropouts (same graph, threshold and coalition), DDG needs about 8 % more noise per client
at ε = 1, δ = 1e-5 and is otherwise no more accurate (``benchmarks/secure_noise.py``,
docs/federated.md). Flower's SecAgg+ workflow cannot carry client-side noise under
``DpFedAvgStrategy`` either (it lacks the legacy hooks SecAgg+ needs).

Lattice (issue 22.2): the update is rounded to the integers before the integer noise and
the masks are added, and the release is ``gamma * (integer sum) / n``: no residue of the
inputs survives below ``gamma`` (``test_ddg_release_carries_no_residue_of_the_inputs``);
the rounding's effect on sensitivity is in :func:`ddg_sensitivities`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from renyi._validation import check_int, check_orders, check_positive, fail
from renyi.analysis.events import Event, Neighbouring
from renyi.federated.channels import (
    ChaCha20Source,
    EphemeralSession,
    IdentityKey,
    KeyAdvertisement,
    Roster,
    derive_key,
)
from renyi.federated.fedavg import row_norms
from renyi.random import get_source
from renyi.samplers import discrete_gaussian

__all__ = [
    "DdgClient",
    "DdgServer",
    "DistributedDiscreteGaussianEvent",
    "ddg_rdp",
    "ddg_sensitivities",
    "ddg_tau",
    "ddg_zcdp_rho",
]

_LIMIT = 2.0**62


def ddg_tau(local_sigma: float, clients: int) -> float:
    """``tau = 10 sum_{k=1}^{n-1} exp(-2 pi² sigma² k/(k+1))`` (KLS 2021, Thm 1).

    >>> ddg_tau(1.0, 1)
    0.0
    """
    s = check_positive("local_sigma", local_sigma)
    n = check_int("clients", clients, 1)
    k = np.arange(1, n, dtype=np.float64)
    return float(10.0 * np.sum(np.exp(-2.0 * math.pi**2 * s * s * k / (k + 1.0))))


def _scales(
    local_sigma: float, clients: int, l2_sensitivity: float, l1_sensitivity: float
) -> tuple[float, float]:
    total = math.sqrt(clients) * local_sigma
    return l2_sensitivity / total, l1_sensitivity / total


def ddg_rdp(
    orders: ArrayLike,
    *,
    local_sigma: float,
    clients: int,
    l2_sensitivity: float,
    l1_sensitivity: float,
    dimension: int,
) -> NDArray[np.float64]:
    """RDP ``eps(alpha)`` of one DDG sum (module docstring; KLS 2021 Thm 1 / Prop 14).

    With one client ``tau = 0`` and this is the discrete Gaussian's ``alpha a²/2``.

    >>> float(ddg_rdp([2.0], local_sigma=2.0, clients=1, l2_sensitivity=1.0,
    ...               l1_sensitivity=1.0, dimension=3)[0])
    0.25
    """
    a_ = check_orders(orders)
    s = check_positive("local_sigma", local_sigma)
    if s < 0.5:
        raise fail("local_sigma", s, ">= 1/2 (KLS 2021, Prop 14)")
    n = check_int("clients", clients, 1)
    d = check_int("dimension", dimension, 1)
    l2 = check_positive("l2_sensitivity", l2_sensitivity)
    l1 = check_positive("l1_sensitivity", l1_sensitivity)
    tau = ddg_tau(s, n)
    a, b = _scales(s, n, l2, l1)
    t1 = a_ * a * a / 2.0 + tau * d
    t2 = a_ * (a * a + 2.0 * b * tau + tau * tau * d) / 2.0
    t3 = a_ * (a + tau * math.sqrt(d)) ** 2 / 2.0
    return np.minimum(np.minimum(t1, t2), t3)


def ddg_zcdp_rho(
    *,
    local_sigma: float,
    clients: int,
    l2_sensitivity: float,
    l1_sensitivity: float,
    dimension: int,
) -> float:
    """``rho`` of the zCDP forms of :func:`ddg_rdp` (the smaller of its last two terms)."""
    s = check_positive("local_sigma", local_sigma)
    tau = ddg_tau(s, clients)
    a, b = _scales(s, clients, l2_sensitivity, l1_sensitivity)
    return 0.5 * min(
        a * a + 2.0 * b * tau + tau * tau * dimension, (a + tau * math.sqrt(dimension)) ** 2
    )


def ddg_sensitivities(clip_norm: float, gamma: float, dimension: int) -> tuple[float, float]:
    """Replace-one ``(Delta_2, Delta_1)`` of the integer sum (module docstring).

    >>> ddg_sensitivities(1.0, 0.01, 4)
    (204.0, 408.0)
    """
    c = check_positive("clip_norm", clip_norm)
    g = check_positive("gamma", gamma)
    d = check_int("dimension", dimension, 1)
    l2 = 2.0 * (c / g + math.sqrt(d))
    return l2, min(math.sqrt(d) * l2, l2 * l2)


@dataclass(frozen=True)
class DistributedDiscreteGaussianEvent(Event):
    """One DDG secure-aggregation sum of ``clients`` participants (replace-one)."""

    local_sigma: float
    clients: int
    l2_sensitivity: float
    l1_sensitivity: float
    dimension: int
    neighbouring: Neighbouring = Neighbouring.REPLACE_ONE  # type: ignore[misc]
    kind: ClassVar[str] = "distributed_discrete_gaussian"

    def __post_init__(self) -> None:
        s = check_positive("local_sigma", self.local_sigma)
        if s < 0.5:
            raise fail("local_sigma", s, ">= 1/2 (KLS 2021, Prop 14)")
        check_int("clients", self.clients, 1)
        check_int("dimension", self.dimension, 1)
        check_positive("l2_sensitivity", self.l2_sensitivity)
        check_positive("l1_sensitivity", self.l1_sensitivity)
        object.__setattr__(self, "neighbouring", Neighbouring(self.neighbouring))

    def _kw(self) -> dict[str, float | int]:
        return {
            "local_sigma": self.local_sigma,
            "clients": self.clients,
            "l2_sensitivity": self.l2_sensitivity,
            "l1_sensitivity": self.l1_sensitivity,
            "dimension": self.dimension,
        }

    def rdp_epsilons(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        return ddg_rdp(orders, **self._kw())  # type: ignore[arg-type]

    def zcdp_rho(self) -> float:
        return ddg_zcdp_rho(**self._kw())  # type: ignore[arg-type]


def _mask(noise_key: bytes, session: bytes, d: int) -> NDArray[np.uint64]:
    key = derive_key(noise_key, salt=session, info=b"renyi-secagg-mask")
    return ChaCha20Source(key).words(d)


class DdgClient:
    """One participant: clips, scales, rounds, adds its discrete Gaussian share, masks.

    Holds only its own update and identity key; ``rng`` draws its rounding and noise
    (``None``: OS CSPRNG).
    """

    def __init__(
        self,
        identity: IdentityKey,
        roster: Roster,
        update: ArrayLike,
        *,
        clip_norm: float,
        gamma: float,
        local_sigma: float,
        rng: object = None,
    ) -> None:
        u = np.asarray(update, dtype=np.float64)
        if u.ndim != 1 or u.size == 0 or not np.isfinite(u).all():
            raise fail("update", u.shape, "a non-empty finite 1-D array")
        self.identity, self.roster = identity, roster
        self._update = u
        self.clip_norm = check_positive("clip_norm", clip_norm)
        self.gamma = check_positive("gamma", gamma)
        self.local_sigma = check_positive("local_sigma", local_sigma)
        self._rng = rng
        self._session: EphemeralSession | None = None
        self._sent = False
        self.encoded: NDArray[np.int64] | None = None  # kept for tests only

    @property
    def name(self) -> str:
        return self.identity.name

    def join(self, session: bytes) -> KeyAdvertisement:
        if self._session is not None:
            raise fail("session", "second join", "one session per client object")
        self._session = EphemeralSession(self.identity, self.roster, session)
        return self._session.advertisement()

    def masked(self, directory: Mapping[str, KeyAdvertisement | bytes]) -> NDArray[np.uint64]:
        """The masked encoded update; every other participant must be in ``directory``."""
        if self._session is None or self._sent:
            raise fail("masked", "called out of order", "join() then masked() once")
        src = get_source(self._rng)
        x = self._update * min(
            1.0, self.clip_norm / max(float(row_norms(self._update[None])[0]), 1e-300)
        )
        scaled = x / self.gamma
        low = np.floor(scaled)
        rounded = low + (src.uniform(scaled.size) < (scaled - low))  # unbiased rounding
        noise = discrete_gaussian(self.local_sigma**2, scaled.size, src)
        self.encoded = rounded.astype(np.int64) + noise
        out = self.encoded.view(np.uint64).copy()
        for peer in sorted(directory):
            if peer == self.name:
                continue
            adv = directory[peer]
            if isinstance(adv, bytes):
                adv = KeyAdvertisement.from_bytes(adv)
            ch = self._session.channel(adv)  # verifies the signature against the roster
            m = _mask(ch.noise_key, self._session.session, out.size)
            out = out + m if self.name < peer else out - m  # wraps modulo 2**64
        self._sent = True
        return out


class DdgServer:
    """Sums masked vectors modulo ``2**64`` and releases ``gamma * sum / n`` (the average).

    Knows only public parameters; :attr:`event` is the round's privacy event.
    """

    def __init__(
        self,
        names: Sequence[str],
        *,
        clip_norm: float,
        gamma: float,
        local_sigma: float,
        dimension: int,
    ) -> None:
        self.names = tuple(names)
        n = check_int("clients", len(self.names), 1)
        self.gamma = check_positive("gamma", gamma)
        d = check_int("dimension", dimension, 1)
        l2, l1 = ddg_sensitivities(clip_norm, gamma, d)
        self.event = DistributedDiscreteGaussianEvent(local_sigma, n, l2, l1, d)
        if n * (clip_norm / gamma + 1.0 + 40.0 * local_sigma) >= _LIMIT:
            raise fail("gamma", gamma, "a granularity keeping the integer sum below 2**62")
        self.dimension = d

    def aggregate(self, masked: Mapping[str, ArrayLike]) -> NDArray[np.float64]:
        """The noisy average update; every participant's message is required."""
        missing = sorted(set(self.names) - set(masked))
        if missing:
            raise fail(
                "masked",
                f"missing {missing}",
                "a message from every participant (their masks would not cancel)",
            )
        total = np.zeros(self.dimension, dtype=np.uint64)
        for name in self.names:
            m = np.asarray(masked[name])
            if m.dtype != np.uint64 or m.shape != (self.dimension,):
                raise fail(f"masked[{name!r}]", m.shape, f"{self.dimension} uint64 values")
            total = total + m
        return total.view(np.int64).astype(np.float64) * self.gamma / len(self.names)
