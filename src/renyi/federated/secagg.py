"""GOPA with double masking: parties that pin their own privacy against a malicious server.

A :class:`SecAggParty` is a state machine: :meth:`SecAggParty.handle` consumes one message
(a ``dict`` of ``str``/``int``/``float``/``bytes`` and lists of them, e.g. a Flower
``ConfigRecord``) and returns the reply (same kinds), or ``{"abort": reason}`` when it
refuses. The transport only relays: new rounds need no change there. A
:class:`SecAggServer` drives the rounds and releases the mean; :class:`SecAggProtocol` runs
everything in one process (tests act as a malicious server between the rounds).

Rounds (server -> party: ``round``, payload; party -> server: reply)

==============  ==========================================  ==============================
round           server sends                                party answers
==============  ==========================================  ==============================
``propose``     ``proposal`` (:class:`SessionProposal` JSON)  ``advert``: signed keys and a
                                                              commitment to its randomness
``directory``   ``adverts`` of the cohort ``U1``              ``opening`` of the commitment
``openings``    every member's ``opening``                   ``to``/``ct``: encrypted shares
``shares``      ``u2``, and ``from``/``ct`` for this party   ``masked`` (uint64 bytes)
``survivors``   ``u3``                                       ``signature`` of ``U3``
``unmask``      ``signers``/``signatures`` of ``U3``         ``b_of``/``b``, ``s_of``/``s``
==============  ==========================================  ==============================

**1. Parties own their privacy** (:class:`PartyPolicy`, the node's own configuration).
A party refuses (before anything derived from its value exists) a proposal whose
independent noise is below its minimum, whose cohort or peers are below its minimum, whose
share threshold is unsafe for the number of corrupted parties it assumes, or whose
worst-case ε (point 4) exceeds its target; and, before it sends its masked value, it
charges the session to its own :class:`renyi.budget.Budget` (a local ledger), refusing once
that is spent. The ε it reports (:meth:`SecAggParty.guarantee`) is computed from what it
checked itself.

**2. Joint randomness, one story.** Each party commits to 32 random bytes in ``propose``
and opens them once it has seen the whole cohort's commitments; the graph is drawn from the
hash of all openings (a party aborts if any member of the cohort fails to open, so the
server can only restart, never pick a subset). Every advert signs the digest of the
proposal, so all parties hold the same parameters. The survivor list ``U3`` is signed by
each survivor (once per session); a party reveals shares only for a list it signed that
also carries more than ``(|U1| + c) / 2`` survivors' signatures, so all honest parties act
on the same ``U3``.

**3. Double masking** (Bonawitz et al. 2017; sparse Harary graphs as in SecAgg+, Bell et al.
2020). Party ``u`` sends ``K_u + PRG(b_u) mod 2**64``: ``K_u`` its GOPA message on the
session lattice (``renyi.noise.snap`` of ``X_u + eta_u + sum_v +-Y_uv``, as in
:mod:`renyi.federated.gopa_party`), ``Y_uv`` Gaussian pairwise terms from an X25519
agreement of mask keys, ``b_u`` a fresh self-mask seed. ``b_u`` and the mask key are
``t``-of-``k`` Shamir-shared among the neighbours (``Crypto.Protocol.SecretSharing``,
pycryptodome, GF(2**128), per 16-byte half). For a survivor (in ``U3``) honest neighbours
reveal shares of ``b_u``; for a party that dropped (in ``U2`` but not ``U3``) shares of its
mask key, which remove its pairwise terms: its masked value stays hidden behind ``b_u``
forever, and a late message is useless by construction (nobody reveals its ``b_u``).

**4. Honest ε.** :func:`renyi.federated.secagg_accounting.worst_case_mu`: for any graph,
coalition of ``c`` parties and survivor list, every released party keeps ``t - c`` hidden
pairwise terms with honest survivors, and the star bound holds.

**5. Bounded influence.** After removing ``b_u`` the server sees ``K_u``, a Gaussian-masked
value, and rejects the session (nothing released) if a coordinate lies outside
``domain +- (z sqrt(sigma_eta² + d_u sigma_delta²) + g)`` (false rejection probability at
most ``rejection_probability`` per party). A malicious party inside that window moves the
released mean by at most ``(1 + 2 z sqrt(sigma_eta² + k sigma_delta²) + 2 g) / |U3|``
(:meth:`SessionProposal.influence_bound`); range proofs would remove the window (not built).

Trust: the server is malicious (it may send anything, drop, reorder, lie about dropouts or
parameters); at most ``c`` parties collude with it; identity keys are pinned in a
:class:`~renyi.federated.channels.Roster` agreed out of band.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from numpy.typing import ArrayLike, NDArray
from scipy import special

from renyi import noise
from renyi._validation import check_delta, check_int, check_nonnegative, check_positive, fail
from renyi.analysis.closed_forms import gaussian_epsilon
from renyi.analysis.events import GaussianEvent, Neighbouring
from renyi.budget import Budget
from renyi.errors import BudgetExceededError, RenyiError
from renyi.federated.channels import (
    ChaCha20Source,
    ChannelIntegrityError,
    EphemeralSession,
    IdentityKey,
    KeyAdvertisement,
    Roster,
    SecureChannel,
    derive_key,
)
from renyi.federated.gopa_party import ProtocolAbortedError, _check_value
from renyi.federated.secagg_accounting import harary_neighbours, threshold_is_safe, worst_case_mu

__all__ = [
    "PartyGuarantee",
    "PartyPolicy",
    "PolicyRefusal",
    "SecAggParty",
    "SecAggProtocol",
    "SecAggResult",
    "SecAggServer",
    "SessionProposal",
]

_LABEL = b"renyi-secagg-v1"
_FRACTION_BITS = 32
_INDEX_LIMIT = 2.0**52
_TAIL = 40.0


class PolicyRefusal(ProtocolAbortedError):
    """A party refused a session that asks for less than its pinned policy."""


def _frame(*parts: bytes) -> bytes:
    return b"".join(struct.pack(">I", len(p)) + p for p in parts)


def _unframe(raw: object, count: int, what: str) -> list[bytes]:
    if not isinstance(raw, bytes):
        raise ChannelIntegrityError(f"malformed {what}")
    parts: list[bytes] = []
    pos = 0
    try:
        while pos < len(raw) and len(parts) < count:
            (n,) = struct.unpack(">I", raw[pos : pos + 4])
            parts.append(raw[pos + 4 : pos + 4 + n])
            if len(parts[-1]) != n:
                raise ValueError
            pos += 4 + n
        if len(parts) != count or pos != len(raw):
            raise ValueError
    except (ValueError, struct.error):
        raise ChannelIntegrityError(f"malformed {what}") from None
    return parts


def _h(*parts: bytes) -> bytes:
    return hashlib.sha256(_frame(_LABEL, *parts)).digest()


def _names_digest(names: Sequence[str]) -> bytes:
    return _h(b"names", *(n.encode() for n in sorted(names)))


def _verify(roster: Roster, name: str, signature: bytes, payload: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(roster[name]).verify(signature, payload)
    except (InvalidSignature, KeyError, ValueError):
        return False
    return True


# --------------------------------------------------------------------------- parameters


@dataclass(frozen=True)
class SessionProposal:
    """What the server proposes: public parameters of one session (parties check them).

    ``names``: the cohort invited (roster names); ``peers``: the degree ``k`` of the Harary
    graph (even, or ``len(names) - 1`` for the complete graph); ``threshold``: ``t`` of the
    ``t``-of-``k`` sharing; ``min_survivors``: the smallest ``U3`` the server will release.
    """

    session: bytes
    names: tuple[str, ...]
    sigma_eta: float
    sigma_delta: float
    peers: int
    threshold: int
    min_survivors: int
    dimension: int = 1
    vector: bool = False
    rejection_probability: float = 1e-9

    def __post_init__(self) -> None:
        if not isinstance(self.session, bytes) or not 16 <= len(self.session) <= 64:
            raise fail("session", type(self.session).__name__, "16 to 64 random bytes")
        names = tuple(str(n) for n in self.names)
        if len(names) < 2 or len(set(names)) != len(names):
            raise fail("names", names[:5], "at least 2 distinct party names")
        object.__setattr__(self, "names", names)
        check_nonnegative("sigma_eta", self.sigma_eta)
        check_nonnegative("sigma_delta", self.sigma_delta)
        check_int("peers", self.peers, 2)
        check_int("threshold", self.threshold, 1)
        check_int("min_survivors", self.min_survivors, 1)
        d = check_int("dimension", self.dimension, 1)
        if not self.vector and d != 1:
            raise fail("dimension", d, "1 for scalar values (vector=False)")
        p = float(self.rejection_probability)
        if not 0.0 < p < 1.0:
            raise fail("rejection_probability", p, "a probability in (0, 1)")

    @property
    def degree(self) -> int:
        """A party's number of neighbours: ``min(peers, K - 1)``."""
        return min(self.peers, len(self.names) - 1)

    @property
    def lattice(self) -> float:
        """Step ``g`` of the messages: ``renyi.noise.lattice_step(sigma_eta)``."""
        if self.sigma_eta == 0.0:
            return 2.0**-_FRACTION_BITS
        return noise.lattice_step(self.sigma_eta)

    def to_json(self) -> str:
        d = asdict(self)
        d["session"] = self.session.hex()
        d["names"] = list(self.names)
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: object) -> SessionProposal:
        try:
            d = json.loads(str(text))
            d["session"] = bytes.fromhex(d["session"])
            d["names"] = tuple(d["names"])
            return cls(**d)
        except (ValueError, KeyError, TypeError) as exc:
            raise ProtocolAbortedError(f"unreadable session proposal: {exc}") from None

    def digest(self) -> bytes:
        """SHA-256 of the canonical JSON: what every advert signs."""
        return _h(b"proposal", self.to_json().encode())

    def z(self) -> float:
        p = self.rejection_probability / self.dimension
        return float(special.ndtri(1.0 - p / 2.0))

    def acceptance_bound(self, active_degree: int) -> tuple[float, float]:
        """Per coordinate ``(low, high)`` of an acceptable unmasked message ``g K_u``."""
        std = math.sqrt(self.sigma_eta**2 + active_degree * self.sigma_delta**2)
        lo, hi = (-0.5, 0.5) if self.vector else (0.0, 1.0)
        slack = self.z() * std + self.lattice
        return lo - slack, hi + slack

    def influence_bound(self, survivors: int) -> float:
        """Largest change of the released mean (per coordinate) one accepted malicious
        party can cause against honest behaviour: the acceptance window over ``|U3|``."""
        lo, hi = self.acceptance_bound(self.degree)
        return (hi - lo) / survivors


@dataclass(frozen=True)
class PartyPolicy:
    """A party's pins: what it accepts from any server (its node configuration).

    ``epsilon``/``delta``: the worst-case per-session target (the star bound for
    ``max_corrupt`` colluding parties must meet it); ``min_sigma_eta``: least independent
    noise; ``min_cohort``: least parties invited and surviving; ``min_peers``: least
    neighbours; ``max_corrupt``: parties the threat model lets collude with the server.
    """

    epsilon: float
    delta: float
    min_sigma_eta: float
    min_cohort: int
    min_peers: int
    max_corrupt: int

    def __post_init__(self) -> None:
        check_positive("epsilon", self.epsilon)
        check_delta(self.delta)
        check_positive("min_sigma_eta", self.min_sigma_eta)
        check_int("min_cohort", self.min_cohort, 2)
        check_int("min_peers", self.min_peers, 1)
        check_int("max_corrupt", self.max_corrupt, 0)

    def check(self, p: SessionProposal, me: str, roster: Roster) -> PartyGuarantee:
        """The guarantee ``p`` gives this party, or :class:`PolicyRefusal` saying why not."""

        def refuse(what: str) -> PolicyRefusal:
            return PolicyRefusal(f"{me!r} refuses the session: {what}")

        if me not in p.names:
            raise refuse("it is not in the proposed cohort")
        if unknown := [n for n in p.names if n not in roster]:
            raise refuse(f"parties {unknown[:3]} are not in its pinned roster")
        n, c = len(p.names), self.max_corrupt
        if n < self.min_cohort:
            raise refuse(f"cohort {n} < its minimum {self.min_cohort}")
        if p.sigma_eta < self.min_sigma_eta:
            raise refuse(f"sigma_eta = {p.sigma_eta} < its minimum {self.min_sigma_eta}")
        if p.degree < self.min_peers:
            raise refuse(f"{p.degree} peers < its minimum {self.min_peers}")
        if p.peers < n - 1 and p.peers % 2:
            raise refuse(f"peers = {p.peers} is odd (Harary graphs need an even degree)")
        if not threshold_is_safe(p.threshold, p.degree, c):
            raise refuse(
                f"threshold t = {p.threshold} of {p.degree} neighbours is unsafe with up to"
                f" {c} corrupted parties (needs {c} < t <= k and 2t > k + {c})"
            )
        quorum = (n + c) // 2 + 1
        if p.min_survivors < max(self.min_cohort, quorum):
            raise refuse(
                f"min_survivors = {p.min_survivors} < max(min cohort {self.min_cohort},"
                f" consistency quorum {quorum})"
            )
        g = p.lattice
        if (1.0 + _TAIL * math.sqrt(p.sigma_eta**2 + p.degree * p.sigma_delta**2)) / g >= (
            _INDEX_LIMIT
        ) or n * (1.0 + _TAIL * p.sigma_eta) / g >= 2.0**62:
            raise refuse("its messages would not fit the 64-bit lattice")
        mu = worst_case_mu(p.sigma_eta, p.sigma_delta, p.threshold, c)
        eps = gaussian_epsilon(mu, self.delta)
        if eps > self.epsilon * (1.0 + 1e-12):
            raise refuse(
                f"worst-case epsilon {eps:.4g} at delta {self.delta:g} (mu {mu:.4g}, {c}"
                f" corrupted) exceeds its target {self.epsilon}"
            )
        return PartyGuarantee(mu, eps, self.delta, p.threshold, c, quorum)


@dataclass(frozen=True)
class PartyGuarantee:
    """What a party verified for one session: ``mu``-GDP for its value (replace-one,
    values in a domain of diameter 1) whatever the graph, for at most ``corrupt``
    colluding parties; ``epsilon`` at ``delta`` (Balle & Wang 2018, Thm 8)."""

    mu: float
    epsilon: float
    delta: float
    threshold: int
    corrupt: int
    quorum: int

    def event(self) -> GaussianEvent:
        """The session as a Gaussian event (noise multiplier ``1/mu``), for a budget."""
        return GaussianEvent(1.0 / self.mu, neighbouring=Neighbouring.REPLACE_ONE)


# --------------------------------------------------------------------------- helpers


def graph_from(randomness: bytes, names: Sequence[str], peers: int) -> list[list[int]]:
    """The Harary graph of the session: the cyclic order is a permutation keyed by the
    joint randomness (ChaCha20), neighbours the ``peers/2`` nearest on either side."""
    keys = ChaCha20Source(hashlib.sha256(_LABEL + b"|graph" + randomness).digest()).words(
        len(names)
    )
    order = np.argsort(keys, kind="stable").tolist()
    return harary_neighbours(order, min(peers, len(names) - 1))


def _x25519_private(raw: bytes) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(raw)


def _x25519_public_raw(sk: X25519PrivateKey) -> bytes:
    return sk.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _x25519_private_raw(sk: X25519PrivateKey) -> bytes:
    return sk.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


def pairwise_term(
    mask_sk: bytes, peer_pk: bytes, context: bytes, a: str, b: str, sigma: float, d: int
) -> NDArray[np.float64]:
    """``sigma z`` with ``z`` normals keyed by the X25519 agreement of the two mask keys and
    the unordered pair; the party first in ``names`` adds it, the other subtracts it."""
    try:
        secret = _x25519_private(mask_sk).exchange(X25519PublicKey.from_public_bytes(peer_pk))
    except ValueError:
        raise ChannelIntegrityError("an invalid mask key") from None
    lo, hi = sorted((a, b))
    key = derive_key(
        secret, salt=context, info=_LABEL + b"|edge|" + _frame(lo.encode(), hi.encode())
    )
    return np.asarray(sigma * noise.standard_normal(d, rng=ChaCha20Source(key)), dtype=np.float64)


def self_mask(seed: bytes, d: int) -> NDArray[np.uint64]:
    """``PRG(b_u)``: ``d`` uniform 64-bit words (ChaCha20 keyed by HKDF of the seed)."""
    return ChaCha20Source(derive_key(seed, salt=b"", info=_LABEL + b"|self-mask")).words(d)


def _split(secret: bytes, t: int, n: int) -> list[bytes]:
    """32-byte ``secret`` -> ``n`` shares of 32 bytes (two 16-byte Shamir halves)."""
    from Crypto.Protocol.SecretSharing import Shamir

    lo = Shamir.split(t, n, secret[:16], False)
    hi = Shamir.split(t, n, secret[16:], False)
    return [lo[i][1] + hi[i][1] for i in range(n)]


def _combine(shares: Sequence[tuple[int, bytes]]) -> bytes:
    from Crypto.Protocol.SecretSharing import Shamir

    lo = Shamir.combine([(i, s[:16]) for i, s in shares], False)
    hi = Shamir.combine([(i, s[16:]) for i, s in shares], False)
    return bytes(lo) + bytes(hi)


# --------------------------------------------------------------------------- party


class SecAggParty:
    """One party: its value, identity key, pinned roster, policy and budget; nothing else.

    ``budget``: the party's own ledger across sessions (``None``: no cross-session limit —
    then 200 sessions average its noise away; give every deployed party one). ``rng``
    draws its independent noise (``None``: OS CSPRNG).
    """

    def __init__(
        self,
        identity: IdentityKey,
        roster: Roster,
        value: ArrayLike,
        policy: PartyPolicy,
        *,
        budget: Budget | None,
        vector: bool = False,
        rng: object = None,
    ) -> None:
        if not isinstance(identity, IdentityKey) or not isinstance(roster, Roster):
            raise fail("identity", type(identity).__name__, "an IdentityKey and a Roster")
        if roster.get(identity.name) != identity.public_bytes:
            raise fail("roster", identity.name, "a roster pinning this party's identity key")
        if not isinstance(policy, PartyPolicy):
            raise fail("policy", type(policy).__name__, "a PartyPolicy")
        if budget is not None and not isinstance(budget, Budget):
            raise fail("budget", type(budget).__name__, "a renyi.budget.Budget or None")
        self.identity, self.roster, self.policy, self.budget = identity, roster, policy, budget
        self._value = _check_value(value, None, vector, False)
        self._vector = vector
        self._rng = rng
        self._st: dict[str, Any] = {"round": None}
        self._proposal: SessionProposal | None = None
        self._guarantee: PartyGuarantee | None = None
        self._channels: dict[str, SecureChannel] = {}

    @property
    def name(self) -> str:
        return self.identity.name

    def __repr__(self) -> str:
        return f"SecAggParty({self.name!r}, <value hidden>)"

    def guarantee(self) -> PartyGuarantee | None:
        """The worst-case guarantee this party verified for its session (after ``propose``)."""
        return self._guarantee

    def handle(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """Consume one server message; the reply, or ``{"abort": reason}`` (then it stops)."""
        if self._st.get("round") == "aborted":
            return {"abort": f"{self.name!r} already aborted this session"}
        try:
            step = {
                "propose": self._propose,
                "directory": self._directory,
                "openings": self._openings,
                "shares": self._shares,
                "survivors": self._survivors,
                "unmask": self._unmask,
            }.get(str(message.get("round")))
            if step is None:
                raise ProtocolAbortedError(f"unknown round {message.get('round')!r}")
            return step(message)
        except (RenyiError, ValueError, KeyError, TypeError) as exc:
            self._st["round"] = "aborted"
            return {"abort": f"{type(exc).__name__}: {exc}"}

    def _expect(self, previous: str | None, now: str) -> SessionProposal:
        if self._st.get("round") != previous:
            raise ProtocolAbortedError(
                f"{self.name!r} got {now!r} after {self._st.get('round')!r} (expected after"
                f" {previous!r}): out of order or replayed"
            )
        self._st["round"] = now
        if now == "propose":
            return None  # type: ignore[return-value]
        assert self._proposal is not None
        return self._proposal

    # -- round 1: check the proposal against the policy, commit
    def _propose(self, msg: Mapping[str, Any]) -> dict[str, Any]:
        self._expect(None, "propose")
        p = SessionProposal.from_json(msg["proposal"])
        self._guarantee = self.policy.check(p, self.name, self.roster)
        if self.budget is not None and not self.budget.can_spend(self._guarantee.event()):
            raise PolicyRefusal(f"{self.name!r} refuses: its privacy budget is spent")
        if p.vector != self._vector:
            raise PolicyRefusal(f"{self.name!r} refuses: value domain mismatch")
        self._value = _check_value(self._value, p.dimension, p.vector, False)
        self._proposal = p
        digest = p.digest()
        eph = EphemeralSession(self.identity, self.roster, digest)
        mask_sk = X25519PrivateKey.generate()
        r = os.urandom(32)
        z = np.asarray(noise.standard_normal(p.dimension, rng=self._rng), dtype=np.float64)
        raw, _ = eph.export_state()
        self._st.update(
            eph=raw.hex(),
            mask_sk=_x25519_private_raw(mask_sk).hex(),
            r=r.hex(),
            b=os.urandom(32).hex(),
            z_eta=z.astype("<f8").tobytes().hex(),
        )
        body = _frame(
            self.name.encode(),
            digest,
            eph.advertisement().to_bytes(),
            _x25519_public_raw(mask_sk),
            _h(b"commit", digest, self.name.encode(), r),
        )
        return {"advert": _frame(body, self.identity.sign(_h(b"advert", body)))}

    def _parse_adverts(self, raws: Sequence[bytes], p: SessionProposal) -> dict[str, list[bytes]]:
        out: dict[str, list[bytes]] = {}
        digest = p.digest()
        for raw in raws:
            body, sig = _unframe(raw, 2, "advert")
            name_b, dig, adv, mask_pk, commit = _unframe(body, 5, "advert")
            name = name_b.decode(errors="replace")
            if name not in p.names or name in out:
                raise ChannelIntegrityError(f"advert of {name!r}: not in the cohort or repeated")
            if not _verify(self.roster, name, sig, _h(b"advert", body)):
                raise ChannelIntegrityError(f"advert of {name!r} is not signed by its pinned key")
            if dig != digest:
                raise ChannelIntegrityError(
                    f"{name!r} signed other session parameters: the server told parties"
                    " different stories"
                )
            out[name] = [adv, mask_pk, commit, raw]
        return out

    # -- round 2: the cohort U1 is known; open the commitment
    def _directory(self, msg: Mapping[str, Any]) -> dict[str, Any]:
        p = self._expect("propose", "directory")
        adverts = self._parse_adverts(list(msg["adverts"]), p)
        if self.name not in adverts:
            raise ProtocolAbortedError(f"{self.name!r}'s own advert is missing")
        mine = adverts[self.name]
        if _h(b"commit", p.digest(), self.name.encode(), bytes.fromhex(self._st["r"])) != mine[2]:
            raise ChannelIntegrityError(f"{self.name!r}'s advert was altered")
        if len(adverts) < max(self.policy.min_cohort, p.min_survivors):
            raise PolicyRefusal(
                f"{self.name!r} refuses: cohort of {len(adverts)} below its minimum"
                f" {max(self.policy.min_cohort, p.min_survivors)}"
            )
        u1 = sorted(adverts)
        self._st["adverts"] = {n: adverts[n][3].hex() for n in u1}
        u1_digest = _h(b"cohort", *(adverts[n][3] for n in u1))
        r = bytes.fromhex(self._st["r"])
        body = _frame(self.name.encode(), u1_digest, r)
        return {"opening": _frame(body, self.identity.sign(_h(b"opening", body)))}

    def _cohort(self, p: SessionProposal) -> dict[str, list[bytes]]:
        raws = [bytes.fromhex(v) for v in self._st["adverts"].values()]
        return self._parse_adverts(raws, p)

    # -- round 3: joint randomness, graph, shares to the neighbours
    def _openings(self, msg: Mapping[str, Any]) -> dict[str, Any]:
        p = self._expect("directory", "openings")
        cohort = self._cohort(p)
        u1 = sorted(cohort)
        u1_digest = _h(b"cohort", *(cohort[n][3] for n in u1))
        opened: dict[str, bytes] = {}
        for raw in list(msg["openings"]):
            body, sig = _unframe(raw, 2, "opening")
            name_b, dig, r = _unframe(body, 3, "opening")
            name = name_b.decode(errors="replace")
            if name not in cohort or not _verify(self.roster, name, sig, _h(b"opening", body)):
                raise ChannelIntegrityError(f"opening of {name!r} is not from the cohort")
            if dig != u1_digest:
                raise ChannelIntegrityError(f"{name!r} saw another cohort than {self.name!r}")
            if _h(b"commit", p.digest(), name_b, r) != cohort[name][2]:
                raise ChannelIntegrityError(f"{name!r}'s opening does not match its commitment")
            opened[name] = r
        if missing := sorted(set(u1) - set(opened)):
            raise ProtocolAbortedError(
                f"{missing[:3]} did not open their commitments; the graph is not drawn (a new"
                " session is needed, never a subset)"
            )
        randomness = _h(b"randomness", *(opened[n] for n in u1))
        self._st["randomness"] = randomness.hex()
        nb = self._neighbours(p)
        t = p.threshold
        eph = EphemeralSession.restore(
            self.identity, self.roster, p.digest(), (bytes.fromhex(self._st["eph"]), [])
        )
        b_shares = _split(bytes.fromhex(self._st["b"]), t, len(nb))
        s_shares = _split(bytes.fromhex(self._st["mask_sk"]), t, len(nb))
        to, ct = [], []
        for j, v in enumerate(nb):
            adv = KeyAdvertisement.from_bytes(cohort[v][0]) if v in cohort else None
            if adv is None:
                continue  # neighbour not in the cohort: no share, no pairwise term
            if adv.name != v:
                raise ChannelIntegrityError(f"channel advert of {v!r} names {adv.name!r}")
            ch = eph.channel(adv)
            self._channels[v] = ch
            to.append(v)
            ct.append(ch.encrypt(_frame(ch.confirmation(), b_shares[j], s_shares[j])))
        self._st["eph"] = None  # forward secrecy: the channel keys are all that remain
        return {"to": to, "ct": ct}

    def _neighbours(self, p: SessionProposal) -> list[str]:
        adj = graph_from(bytes.fromhex(self._st["randomness"]), p.names, p.peers)
        return [p.names[v] for v in adj[p.names.index(self.name)]]

    # -- round 4: keep the neighbours' shares, charge the budget, send the masked value
    def _shares(self, msg: Mapping[str, Any]) -> dict[str, Any]:
        p = self._expect("openings", "shares")
        cohort = self._cohort(p)
        u2 = [str(n) for n in msg["u2"]]
        if len(set(u2)) != len(u2) or not set(u2) <= set(cohort) or self.name not in u2:
            raise ProtocolAbortedError("U2 must be distinct members of the cohort, self included")
        if len(u2) < p.min_survivors:
            raise PolicyRefusal(f"{self.name!r} refuses: {len(u2)} parties left < min survivors")
        inbox = dict(zip([str(n) for n in msg["from"]], list(msg["ct"]), strict=True))
        held: dict[str, str] = {}
        live = [v for v in self._neighbours(p) if v in u2 and v in self._channels]
        for v in live:
            if v not in inbox:
                raise ProtocolAbortedError(f"{v!r} is said to be in U2 but sent no shares")
            ch = self._channels[v]
            tag, b_share, s_share = _unframe(ch.decrypt(bytes(inbox[v])), 3, "shares")
            ch.confirm(tag)
            if len(b_share) != 32 or len(s_share) != 32:
                raise ChannelIntegrityError(f"shares from {v!r} have the wrong length")
            held[v] = (b_share + s_share).hex()
        self._st["held"] = held
        self._st["u2"] = sorted(u2)
        assert self._guarantee is not None
        if self.budget is not None:
            try:  # charged before anything derived from the value leaves the party
                self.budget.spend(
                    self._guarantee.event(), label=f"secagg session {p.session.hex()}"
                )
            except BudgetExceededError as exc:
                raise PolicyRefusal(f"{self.name!r} refuses: {exc}") from None
        d = p.dimension
        pairwise = np.zeros(d)
        context = _h(b"context", p.digest(), bytes.fromhex(self._st["randomness"]))
        sk = bytes.fromhex(self._st["mask_sk"])
        for v in sorted(live):
            y = pairwise_term(sk, cohort[v][1], context, self.name, v, p.sigma_delta, d)
            pairwise += y if p.names.index(self.name) < p.names.index(v) else -y
        z = np.frombuffer(bytes.fromhex(self._st["z_eta"]), "<f8").astype(np.float64)
        g = p.lattice
        if p.sigma_eta > 0.0:
            out = noise.snap(self._value, z + pairwise / p.sigma_eta, p.sigma_eta)
            index = np.asarray(out, dtype=np.float64) / g
        else:
            index = np.rint((self._value + pairwise) / g)
        masked = index.astype(np.int64).view(np.uint64) + self_mask(bytes.fromhex(self._st["b"]), d)
        return {"masked": masked.astype("<u8").tobytes()}

    # -- round 5: sign the survivor list (once)
    def _survivors(self, msg: Mapping[str, Any]) -> dict[str, Any]:
        p = self._expect("shares", "survivors")
        u3 = sorted(str(n) for n in msg["u3"])
        if len(set(u3)) != len(u3) or not set(u3) <= set(self._st["u2"]) or self.name not in u3:
            raise ProtocolAbortedError("U3 must be distinct members of U2, self included")
        if len(u3) < p.min_survivors:
            raise PolicyRefusal(f"{self.name!r} refuses: {len(u3)} survivors < the minimum")
        self._st["u3"] = u3
        return {"signature": self.identity.sign(_h(b"survivors", p.digest(), _names_digest(u3)))}

    # -- round 6: reveal one kind of share per neighbour, for the list it signed
    def _unmask(self, msg: Mapping[str, Any]) -> dict[str, Any]:
        p = self._expect("survivors", "unmask")
        u3 = self._st["u3"]
        payload = _h(b"survivors", p.digest(), _names_digest(u3))
        signers = set()
        for name, sig in zip(
            [str(n) for n in msg["signers"]], list(msg["signatures"]), strict=True
        ):
            if name in u3 and _verify(self.roster, name, bytes(sig), payload):
                signers.add(name)
        assert self._guarantee is not None
        need = (len(self._st["adverts"]) + self.policy.max_corrupt) // 2 + 1
        if len(signers) < need:
            raise ProtocolAbortedError(
                f"only {len(signers)} survivors signed the list {self.name!r} signed; it needs"
                f" {need}: the server may be telling parties different stories"
            )
        b_of, b, s_of, s = [], [], [], []
        for v, shares in sorted(self._st["held"].items()):
            raw = bytes.fromhex(shares)
            if v in u3:
                b_of.append(v)
                b.append(raw[:32])
            else:
                s_of.append(v)
                s.append(raw[32:])
        self._st["held"] = {}  # one answer per session
        return {"b_of": b_of, "b": b, "s_of": s_of, "s": s}

    def export_state(self) -> str:
        """The session state as JSON (secret: keys, shares, noise), for a party process
        that restarts between rounds. The value is not in it.

        Persist it after each :meth:`handle` and *before* that reply leaves the party, and
        restore only the latest copy: then a restarted party refuses a round it already
        answered (out of order). Restored from an older copy it would answer that round
        again with whatever the server sends — sign a second survivor list, or reveal the
        other kind of share of a neighbour — which breaks the consistency round ("each
        honest party signs one list") and with it double masking.
        """
        st = dict(self._st)
        st["proposal"] = None if self._proposal is None else self._proposal.to_json()
        st["channels"] = {n: c.export_state().hex() for n, c in self._channels.items()}
        return json.dumps(st)

    def restore_state(self, state: str) -> None:
        """Continue from :meth:`export_state` (this object must be fresh)."""
        if self._st.get("round") is not None:
            raise ProtocolAbortedError(f"{self.name!r} already holds a session")
        try:
            st = json.loads(state)
            prop = st.pop("proposal")
            chans = st.pop("channels")
            self._proposal = None if prop is None else SessionProposal.from_json(prop)
            self._channels = {n: SecureChannel.restore(bytes.fromhex(c)) for n, c in chans.items()}
            self._st = st
            if self._proposal is not None:
                self._guarantee = self.policy.check(self._proposal, self.name, self.roster)
        except (ValueError, KeyError, TypeError) as exc:
            raise ProtocolAbortedError(
                f"stored state of {self.name!r} is unreadable: {exc}"
            ) from None


# --------------------------------------------------------------------------- server


@dataclass(frozen=True)
class SecAggResult:
    """The release: ``estimate = lattice * total / len(included)``."""

    estimate: NDArray[np.float64] | float
    included: tuple[str, ...]
    dropped: tuple[str, ...]
    total: NDArray[np.int64]
    lattice: float
    influence_bound: float


class SecAggServer:
    """The server's side: relays, collects, unmasks and releases once (public data only)."""

    def __init__(self, proposal: SessionProposal, roster: Roster) -> None:
        self.proposal, self.roster = proposal, roster
        self.adverts: dict[str, list[bytes]] = {}
        self.openings: dict[str, bytes] = {}
        self.neighbours: dict[str, list[str]] = {}
        self.u2: list[str] = []
        self.masked: dict[str, NDArray[np.uint64]] = {}
        self.u3: list[str] = []
        self.signatures: dict[str, bytes] = {}
        self._released = False

    def propose(self) -> dict[str, Any]:
        return {"round": "propose", "proposal": self.proposal.to_json()}

    def admit(self, reply: Mapping[str, Any]) -> str | None:
        """The party that verifiably sent this ``propose`` reply, else ``None``.

        A reply is admitted only if its ``advert`` names a member of the proposed cohort,
        signs this session's proposal digest and carries a valid signature by that
        member's pinned roster key: a transport binds a node to a party with it (a node
        whose reply is not admitted is ignored, never trusted with a name it claims).

        >>> from renyi.federated.channels import IdentityKey, Roster
        >>> ids = [IdentityKey(n) for n in ("a", "b")]
        >>> policy = PartyPolicy(epsilon=5.0, delta=1e-5, min_sigma_eta=1.0, min_cohort=2,
        ...                      min_peers=1, max_corrupt=0)
        >>> p = SessionProposal(session=bytes(16), names=("a", "b"), sigma_eta=1.0,
        ...                     sigma_delta=10.0, peers=2, threshold=1, min_survivors=2)
        >>> server = SecAggServer(p, Roster.of(ids))
        >>> party = SecAggParty(ids[0], Roster.of(ids), 0.5, policy, budget=None)
        >>> reply = party.handle(server.propose())
        >>> server.admit(reply), server.admit({"advert": b"forged"})
        ('a', None)
        """
        try:
            raw = bytes(reply["advert"])
            body, sig = _unframe(raw, 2, "advert")
            name_b, digest = _unframe(body, 5, "advert")[:2]
            name = name_b.decode()
        except (RenyiError, KeyError, TypeError, ValueError):
            return None
        if name not in self.proposal.names or digest != self.proposal.digest():
            return None
        return name if _verify(self.roster, name, sig, _h(b"advert", body)) else None

    def directory(self, replies: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        """The adverts of the cohort ``U1``: each reply admitted (:meth:`admit`) under the
        name it was received for; anything else is left out."""
        for name, r in replies.items():
            if "advert" not in r or self.admit(r) != name:
                continue
            body, _ = _unframe(bytes(r["advert"]), 2, "advert")
            parts = _unframe(body, 5, "advert")
            self.adverts[name] = [parts[2], parts[3], bytes(r["advert"])]
        return {"round": "directory", "adverts": [self.adverts[n][2] for n in sorted(self.adverts)]}

    def openings_round(self, replies: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        for name, r in replies.items():
            if "opening" in r:
                self.openings[name] = bytes(r["opening"])
        rs = {}
        for name, raw in self.openings.items():
            body, _ = _unframe(raw, 2, "opening")
            rs[name] = _unframe(body, 3, "opening")[2]
        if set(rs) == set(self.adverts):
            randomness = _h(b"randomness", *(rs[n] for n in sorted(self.adverts)))
            adj = graph_from(randomness, self.proposal.names, self.proposal.peers)
            names = self.proposal.names
            self.neighbours = {names[u]: [names[v] for v in adj[u]] for u in range(len(names))}
            self._context = _h(b"context", self.proposal.digest(), randomness)
        return {"round": "openings", "openings": [self.openings[n] for n in sorted(self.openings)]}

    def shares_round(self, replies: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
        """Per party: the ciphertexts addressed to it and ``U2`` (who sent shares)."""
        inbox: dict[str, dict[str, bytes]] = {}
        for sender, r in replies.items():
            if "to" not in r:
                continue
            for receiver, ct in zip(list(r["to"]), list(r["ct"]), strict=True):
                inbox.setdefault(str(receiver), {})[sender] = bytes(ct)
        self.u2 = sorted(n for n, r in replies.items() if "to" in r)
        return {
            n: {
                "round": "shares",
                "u2": self.u2,
                "from": list(inbox.get(n, {})),
                "ct": list(inbox.get(n, {}).values()),
            }
            for n in self.u2
        }

    def survivors_round(self, replies: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        d = self.proposal.dimension
        for name, r in replies.items():
            raw = r.get("masked")
            if name in self.u2 and isinstance(raw, bytes) and len(raw) == 8 * d:
                self.masked[name] = np.frombuffer(raw, "<u8").astype(np.uint64)
        self.u3 = sorted(self.masked)
        return {"round": "survivors", "u3": self.u3}

    def unmask_round(self, replies: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        self.signatures = {n: bytes(r["signature"]) for n, r in replies.items() if "signature" in r}
        return {
            "round": "unmask",
            "signers": list(self.signatures),
            "signatures": list(self.signatures.values()),
        }

    def release(self, replies: Mapping[str, Mapping[str, Any]]) -> SecAggResult:
        """Rebuild the self-masks of ``U3`` and the mask keys of ``U2 \\ U3``; release."""
        if self._released:
            raise ProtocolAbortedError("this session already released its aggregate")
        p = self.proposal
        t, d, g = p.threshold, p.dimension, p.lattice
        b_sh: dict[str, list[tuple[int, bytes]]] = {}
        s_sh: dict[str, list[tuple[int, bytes]]] = {}
        for w, r in replies.items():
            for kind, store in (("b", b_sh), ("s", s_sh)):
                for v, share in zip(
                    list(r.get(f"{kind}_of", [])), list(r.get(kind, [])), strict=True
                ):
                    nb = self.neighbours.get(str(v), [])
                    if w in nb:
                        store.setdefault(str(v), []).append((nb.index(w) + 1, bytes(share)))
        total = np.zeros(d, dtype=np.uint64)
        for u in self.u3:
            if len(b_sh.get(u, [])) < t:
                raise ProtocolAbortedError(f"fewer than t = {t} shares of {u!r}'s self-mask")
            k_u = self.masked[u] - self_mask(_combine(b_sh[u][:t]), d)
            live = sum(1 for v in self.neighbours[u] if v in self.u2)
            lo, hi = p.acceptance_bound(live)
            val = k_u.view(np.int64).astype(np.float64) * g
            if not ((val >= lo) & (val <= hi)).all():
                raise ProtocolAbortedError(
                    f"party {u!r}: its value is outside [{lo:.6g}, {hi:.6g}], the range its"
                    " noise allows; nothing is released"
                )
            total = total + k_u
        correction = np.zeros(d)
        for v in sorted(set(self.u2) - set(self.u3)):
            if len(s_sh.get(v, [])) < t:
                raise ProtocolAbortedError(f"fewer than t = {t} shares of {v!r}'s mask key")
            sk = _combine(s_sh[v][:t])
            for w in self.neighbours[v]:
                if w in self.u3:
                    y = pairwise_term(sk, self.adverts[w][1], self._context, v, w, p.sigma_delta, d)
                    correction += y if p.names.index(w) < p.names.index(v) else -y
        total = total - np.rint(correction / g).astype(np.int64).view(np.uint64)
        self._released = True
        signed = total.view(np.int64).copy()
        mean = signed.astype(np.float64) * g / len(self.u3)
        return SecAggResult(
            estimate=mean if p.vector else float(mean[0]),
            included=tuple(self.u3),
            dropped=tuple(sorted(set(self.u2) - set(self.u3))),
            total=signed,
            lattice=g,
            influence_bound=p.influence_bound(len(self.u3)),
        )


# --------------------------------------------------------------------------- in-process run


class SecAggProtocol:
    """All rounds in one process: ``parties`` answer, :attr:`server` relays. Tests play a
    malicious server by editing a round's messages (``tamper(round, name, message)``)."""

    def __init__(self, parties: Sequence[SecAggParty], server: SecAggServer) -> None:
        self.parties = {p.name: p for p in parties}
        self.server = server
        self.replies: dict[str, dict[str, dict[str, Any]]] = {}

    def _ask(
        self, rnd: str, msgs: Mapping[str, Mapping[str, Any]], tamper: Any, absent: set[str]
    ) -> dict[str, dict[str, Any]]:
        out = {}
        for name, m in msgs.items():
            if name in absent or name not in self.parties:
                continue
            m = dict(m)
            if tamper is not None:
                m = tamper(rnd, name, m)
            out[name] = self.parties[name].handle(m)
        self.replies[rnd] = out
        if bad := {n: r["abort"] for n, r in out.items() if "abort" in r}:
            raise ProtocolAbortedError(f"round {rnd!r}: parties refused: {bad}")
        return out

    def run(
        self,
        *,
        drop_after: Mapping[str, Sequence[str]] | None = None,
        tamper: Any = None,
    ) -> SecAggResult:
        """Every round; ``drop_after[round]``: parties that stop answering from that round."""
        s = self.server
        drop = {k: set(v) for k, v in (drop_after or {}).items()}
        gone: set[str] = set()
        names = list(self.parties)
        order = ["propose", "directory", "openings", "shares", "survivors", "unmask"]

        def absent(rnd: str) -> set[str]:
            gone.update(drop.get(rnd, set()))
            return gone

        r = self._ask("propose", dict.fromkeys(names, s.propose()), tamper, absent(order[0]))
        r = self._ask("directory", dict.fromkeys(r, s.directory(r)), tamper, absent(order[1]))
        r = self._ask("openings", dict.fromkeys(r, s.openings_round(r)), tamper, absent(order[2]))
        r = self._ask("shares", s.shares_round(r), tamper, absent(order[3]))
        r = self._ask("survivors", dict.fromkeys(r, s.survivors_round(r)), tamper, absent(order[4]))
        r = self._ask("unmask", dict.fromkeys(r, s.unmask_round(r)), tamper, absent(order[5]))
        return s.release(r)
