"""GOPA as separate parties: what one party holds and sends, and what the server may check.

This is the protocol with a reveal budget (an honest-but-curious server). Against a
malicious server use :mod:`renyi.federated.secagg`: the same GOPA messages on the same
lattice, with party-pinned policies, commit-reveal randomness, double masking and a
consistency round, behind a transport-neutral message API (``SecAggParty.handle(message)
-> reply``, six rounds listed in that module's docstring).

A :class:`GopaParty` holds only its own value, its long-term identity key and the pinned
roster; a :class:`GopaAggregator` (the server) holds only what parties send it. They exchange
five kinds of messages, in this order, whatever the transport (in-process lists in
:class:`renyi.federated.gopa.GopaProtocol`, Flower messages in
:mod:`renyi.federated.gopa_flower`):

1. **join** - party -> server: a :class:`~renyi.federated.channels.KeyAdvertisement` (fresh
   X25519 key signed by the party's Ed25519 identity key);
2. **pair** - the server relays the directory of advertisements; each party verifies every
   neighbour's signature against the roster (a substituted key aborts the party here,
   before any value leaves it), opens one channel per neighbour and sends, per neighbour,
   one AEAD message: its key-confirmation tag and a fresh 256-bit seed for each edge it
   initiates; the server routes the ciphertexts;
3. **mask** - with the list of parties still present, each party checks key confirmation,
   derives its pairwise terms ``+-Y_e`` from ``HKDF(noise key, seed, edge id)`` ->
   ChaCha20 -> normal, and sends the lattice index of ``X_u + eta_u + sum_e +-Y_e``
   (see *one lattice* below) as a two's-complement integer modulo ``2**64``;
4. **reveal** (only after a dropout) - survivors reveal their terms with parties that
   paired but sent no acceptable masked message (fixed point ``2**-FRACTION_BITS``);
5. **result** - the server subtracts the revealed terms and releases the mean.

**One lattice** (issue 22.2). Every message is an integer ``K_u`` on the session's lattice
``g = GopaSession.lattice`` (``renyi.noise.lattice_step(sigma_eta)``: a power of two with
``sigma_eta / g`` in ``[8, 16)``): ``g K_u = renyi.noise.snap(X_u, N_u / sigma_eta,
sigma_eta)`` with ``N_u = eta_u + sum_e +-Y_e`` the party's whole noise (continuous
normals). The server sums integers modulo ``2**64``, subtracts the revealed terms rounded
to the same lattice, and releases ``g S / n`` with ``S`` an integer. So the release is a
deterministic function of the messages, and each message a deterministic function of the
real number ``X_u + N_u``: the released value is a **post-processing of the continuous
GOPA view**, and :func:`renyi.federated.gopa.gopa_mu` is its exact guarantee (no
sensitivity inflation from rounding; the implementation slack of ``renyi.noise.snap``
applies per message). Nothing of the inputs survives below the lattice: the residue of
``K * estimate`` modulo ``g`` is that of ``g S``, whatever the values (the old arithmetic,
values in fixed point ``2**-32`` and ``eta`` on ``g Z``, released ``sum X mod g`` exactly).
The price: pairwise terms cancel only up to each message's rounding, an error of at most
``g / 2`` per message in the sum (roughly uniform and centred; about ``g / sqrt(12 n)`` on
the mean, at most 3.6 % of the noise's standard deviation ``sigma_eta / sqrt(n)``).
Without independent noise (``sigma_eta = 0``, no privacy, tests) the lattice is
``2**-FRACTION_BITS``.

**State.** A party draws its independent noise and the seeds of the edges it initiates
when it joins and keeps them in its exported state, so a state restored twice answers the
same round with the same bytes (no fresh ``eta`` over the same pairwise terms, no second
seed for an edge); channels draw a fresh AEAD key per message
(:class:`~renyi.federated.channels.SecureChannel`), so a restored channel never repeats a
(key, nonce) pair.

**Bounded trust in the server.** A party drops an edge when the server says the neighbour
is gone, either before masking (the edge is left out) or after (its term is revealed).
Both tell the server ``Y_e``. A party does this for at most ``reveal_budget`` distinct
neighbours per session and otherwise refuses (:class:`ProtocolAbortedError`): with
``reveal_budget=0`` any dropout aborts the session and a lying server gains nothing. With
``reveal_budget >= 1`` a server that lies about dropouts can strip a target's edges (each
of its neighbours spends one reveal) and learns ``X_u + eta_u``: the worst case is the
Gaussian mechanism with ``mu = 1 / sigma_eta`` (local DP at the independent noise only;
exact, attained), reported by :meth:`GopaSession.lying_server_mu` next to the honest-server
guarantee.

**Input checks.** Each party validates (or, with ``clip=True``, clips) its own value to the
declared domain before masking. The server cannot see values, but a masked message ``m_u``
is ``X_u`` plus a centred Gaussian of variance ``sigma_eta² + d_u sigma_delta²`` (``d_u``:
the party's active edges), so :meth:`GopaAggregator.check_message` rejects a coordinate
outside ``domain +- z sqrt(sigma_eta² + d_u sigma_delta²)`` with ``z`` chosen so that an
honest message is rejected with probability at most ``rejection_probability`` (union
over its coordinates). A rejected message counts as a dropout. This catches gross garbage
(``1e6`` where values lie in ``[0, 1]``), not a small bias hidden in the noise; that needs
commitments and zero-knowledge range proofs (Sabater et al. 2022, Sec. 6), see
``docs/federated.md``.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import special

from renyi import noise
from renyi._validation import check_int, check_nonnegative, check_range, fail
from renyi.errors import RenyiError
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
from renyi.random import get_source

__all__ = [
    "FRACTION_BITS",
    "GopaAggregator",
    "GopaParty",
    "GopaResult",
    "GopaSession",
    "ProtocolAbortedError",
    "fixed_mean",
    "lattice_mean",
    "to_fixed",
]

FRACTION_BITS = 32
"""Fixed-point resolution of the messages: values are integers times ``2**-FRACTION_BITS``."""

_SCALE = float(2**FRACTION_BITS)
_TERM_LIMIT = 2.0**63  # one fixed-point term must be a valid int64 before reduction
_SUM_LIMIT = 2.0**62  # |sum of X + eta| in lattice units: released sum must stay signed
_INDEX_LIMIT = 2.0**52  # |message| in lattice units: exact in float64 (renyi.noise.snap)
_TAIL = 40.0  # |N(0, 1)| > 40 has probability < 1e-348: a term never exceeds 40 sigma
_SEED = 32
_CONFIRM = 32


class ProtocolAbortedError(RenyiError):
    """The protocol stopped before releasing anything (dropout, tampering, refusal)."""


def to_fixed(x: ArrayLike, name: str = "value") -> NDArray[np.uint64]:
    """``round(x * 2**FRACTION_BITS)`` as two's-complement integers modulo ``2**64``.

    >>> int(to_fixed([-1.0])[0]) == 2**64 - 2**32
    True
    """
    scaled = np.rint(np.asarray(x, dtype=np.float64) * _SCALE)
    if not (np.abs(scaled) < _TERM_LIMIT).all():
        raise fail(name, float(np.max(np.abs(scaled)) / _SCALE), f"|x| < 2**{63 - FRACTION_BITS}")
    return scaled.astype(np.int64).view(np.uint64)


def fixed_mean(total: NDArray[np.uint64], count: int) -> NDArray[np.float64]:
    """The signed value of a modular fixed-point sum, divided by ``count``."""
    return np.asarray(total, dtype=np.uint64).view(np.int64).astype(np.float64) / _SCALE / count


def lattice_mean(total: NDArray[np.uint64], count: int, step: float) -> NDArray[np.float64]:
    """``step * S / count`` with ``S`` the signed value of a modular lattice sum."""
    return np.asarray(total, dtype=np.uint64).view(np.int64).astype(np.float64) * step / count


def _check_session_id(session: object) -> bytes:
    if not isinstance(session, bytes) or not 16 <= len(session) <= 64:
        raise fail("session", type(session).__name__, "16 to 64 random bytes")
    return session


@dataclass(frozen=True)
class GopaSession:
    """The public parameters of one GOPA session, agreed by every party and the server.

    ``names[i]`` is party ``i``; ``edges`` rows ``(u, v)`` (u initiates the pairwise noise
    of that edge); ``dimension`` the length of each value (``vector=False``: scalars in
    ``[0, 1]``, ``dimension`` must be 1; ``vector=True``: vectors of L2 norm <= 1/2).
    """

    session: bytes
    names: tuple[str, ...]
    edges: NDArray[np.int64] = field(repr=False)
    sigma_eta: float
    sigma_delta: float
    dimension: int = 1
    vector: bool = False
    reveal_budget: int = 0
    rejection_probability: float = 1e-9

    def __post_init__(self) -> None:
        _check_session_id(self.session)
        names = tuple(self.names)
        if len(names) < 2 or len(set(names)) != len(names):
            raise fail("names", names[:5], "at least 2 distinct party names")
        object.__setattr__(self, "names", names)
        e = np.asarray(self.edges, dtype=np.int64)
        k = len(names)
        if e.ndim != 2 or e.shape[1] != 2 or e.shape[0] == 0:
            raise fail("edges", e.shape, "an (E, 2) array of party indices with E >= 1")
        if (e < 0).any() or (e >= k).any() or (e[:, 0] == e[:, 1]).any():
            raise fail("edges", "out-of-range or self loop", f"pairs of distinct indices < {k}")
        e = e.copy()
        e.setflags(write=False)
        object.__setattr__(self, "edges", e)
        se = check_nonnegative("sigma_eta", self.sigma_eta)
        sd = check_nonnegative("sigma_delta", self.sigma_delta)
        d = check_int("dimension", self.dimension, 1)
        if not self.vector and d != 1:
            raise fail("dimension", d, "1 for scalar values (vector=False)")
        check_int("reveal_budget", self.reveal_budget, 0)
        check_range("rejection_probability", self.rejection_probability, 0.0, 1.0, low_open=True)
        if _TAIL * sd * _SCALE >= _TERM_LIMIT:
            raise fail(
                "sigma_delta",
                sd,
                f"< {_TERM_LIMIT / _SCALE / _TAIL:.4g} (one pairwise term in"
                f" fixed point 2**-{FRACTION_BITS} must fit in 64 bits)",
            )
        g = self.lattice
        degree = int(np.bincount(e.ravel(), minlength=k).max())
        if (1.0 + _TAIL * math.sqrt(se * se + degree * sd * sd)) / g >= _INDEX_LIMIT:
            raise fail(
                "sigma_delta",
                sd,
                f"(1 + 40 sqrt(sigma_eta² + degree sigma_delta²)) / g < 2**52 (a message's"
                f" lattice index must be exact in float64; g = {g:g}, degree {degree})",
            )
        # the released sum of X + eta must stay a signed 64-bit value (40 sigma tails)
        if k * (1.0 + _TAIL * se) / g >= _SUM_LIMIT:
            raise fail("sigma_eta", se, f"K (1 + 40 sigma_eta) / g < 2**62 with K = {k}")

    @property
    def parties(self) -> int:
        return len(self.names)

    @property
    def lattice(self) -> float:
        """The step ``g`` of the session's integer lattice: ``lattice_step(sigma_eta)``
        (``2**-FRACTION_BITS`` without independent noise). Messages are integers times ``g``."""
        if self.sigma_eta == 0.0:
            return 1.0 / _SCALE
        return noise.lattice_step(self.sigma_eta)

    def index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise fail("name", name, "a party of this session") from None

    def incident(self, u: int) -> NDArray[np.int64]:
        """Edge ids touching party ``u``."""
        return np.flatnonzero((self.edges == u).any(axis=1))

    def neighbours(self, u: int) -> list[int]:
        """Distinct peers of party ``u``, sorted."""
        e = self.edges[self.incident(u)]
        return sorted(set(e.ravel().tolist()) - {u})

    def acceptance_bound(self, u: int, active_degree: int) -> tuple[float, float]:
        """Per coordinate ``(low, high)`` of an acceptable masked message of party ``u``."""
        std = math.sqrt(self.sigma_eta**2 + active_degree * self.sigma_delta**2)
        p = self.rejection_probability / self.dimension
        z = float(special.ndtri(1.0 - p / 2.0))  # P(|N(0,1)| > z) = p
        lo, hi = (-0.5, 0.5) if self.vector else (0.0, 1.0)
        slack = z * std + self.lattice  # + the message's rounding to the lattice
        return lo - slack, hi + slack

    def lying_server_mu(self) -> float:
        """Worst GDP ``mu`` of one party if the server lies about dropouts.

        ``reveal_budget = 0``: parties refuse every edge removal, nothing changes (``0`` is
        returned: no extra loss beyond the honest-server analysis). Otherwise the server can
        strip one target's edges (one reveal per neighbour) and sees ``X_u + eta_u``:
        ``mu = 1 / sigma_eta`` (attained; ``Sigma >= sigma_eta² I`` makes it the maximum).
        """
        if self.reveal_budget == 0:
            return 0.0
        return math.inf if self.sigma_eta == 0 else 1.0 / self.sigma_eta


def _edge_term(
    noise_key: bytes, seed: bytes, eid: int, sigma: float, d: int
) -> NDArray[np.float64]:
    """``sigma z`` with ``z`` the raw normals keyed by the channel's noise key and the seed
    (never released on their own: they enter a message through ``renyi.noise.snap``)."""
    key = derive_key(noise_key, salt=seed, info=b"renyi-gopa-edge|" + struct.pack(">Q", eid))
    z = noise.standard_normal(d, rng=ChaCha20Source(key))
    return np.asarray(sigma * z, dtype=np.float64)


def _check_value(
    value: ArrayLike, dimension: int | None, vector: bool, clip: bool
) -> NDArray[np.float64]:
    arr = np.atleast_1d(np.asarray(value, dtype=np.float64)).copy()
    if arr.ndim != 1 or (dimension is not None and arr.shape[0] != dimension):
        raise fail("value", arr.shape, f"a value of shape ({dimension},)")
    if not np.isfinite(arr).all():
        raise fail("value", "NaN/inf", "finite numbers")
    if vector:
        norm = float(np.linalg.norm(arr))
        if norm > 0.5:
            if not clip:
                raise fail("value", f"L2 norm {norm:.4g}", "a vector of L2 norm <= 1/2")
            arr *= 0.5 / norm
    else:
        if arr.shape[0] != 1:
            raise fail("value", arr.shape, "one number in [0, 1]")
        if (arr < 0).any() or (arr > 1).any():
            if not clip:
                raise fail("value", float(arr[0]), "a number in [0, 1]")
            arr = np.clip(arr, 0.0, 1.0)
    return arr


class GopaParty:
    """One GOPA participant: its own value, identity key and the pinned roster, nothing else.

    ``rng`` draws the independent noise ``eta`` (``None``: the OS CSPRNG; a
    :class:`~renyi.random.RandomSource` such as ``ChaCha20Source(key)`` makes a run
    reproducible); ``seed_rng`` the pairing seeds (``None``: OS CSPRNG).
    A party takes part in one session at a time and sends one masked message per session.
    """

    def __init__(
        self,
        identity: IdentityKey,
        roster: Roster,
        value: ArrayLike,
        *,
        vector: bool = False,
        clip: bool = False,
        rng: object = None,
        seed_rng: object = None,
    ) -> None:
        if not isinstance(identity, IdentityKey):
            raise fail("identity", type(identity).__name__, "an IdentityKey")
        if not isinstance(roster, Roster):
            raise fail("roster", type(roster).__name__, "a Roster")
        if roster.get(identity.name) != identity.public_bytes:
            raise fail("roster", identity.name, "a roster pinning this party's identity key")
        self.identity = identity
        self.roster = roster
        self._value = _check_value(value, None, vector, clip)
        self._vector = vector
        self._rng = rng
        self._seed_rng = seed_rng
        self._session: GopaSession | None = None
        self._eph: EphemeralSession | None = None
        self._channels: dict[str, SecureChannel] = {}
        self._seeds: dict[int, bytes] = {}  # edge id -> seed (edges this party initiated)
        self._terms: dict[int, NDArray[np.float64]] = {}  # edge id -> signed term it added
        self._z_eta: NDArray[np.float64] | None = None  # standard normals of eta (from join)
        self._removed: set[int] = set()  # peers whose edges were left out or revealed
        self._masked = False
        self._paired = False
        self.eta: NDArray[np.float64] | None = None  # kept for tests/reproduction only

    @property
    def name(self) -> str:
        return self.identity.name

    def __repr__(self) -> str:
        return f"GopaParty({self.name!r}, <value hidden>)"

    def export_state(self) -> str:
        """The party's protocol state between rounds, as JSON (secret: keys, seeds, terms).

        For a party whose process restarts between rounds (a Flower ClientApp); keep it in
        the party's own storage. The ephemeral private key is in it only between join and
        pairing; the value is not in it. Persist it after each round and before the reply
        leaves the party, and restore only the latest copy: the reveal budget counts the
        neighbours revealed in this state, so a party restored from an older copy could be
        asked to reveal other neighbours again (a restored party's masked answer is the same
        bytes; its reveals are not bounded across copies).
        """
        eph = None
        if self._eph is not None:
            raw, opened = self._eph.export_state()
            eph = [raw.hex(), opened]
        return json.dumps(
            {
                "eph": eph,
                "channels": {n: c.export_state().hex() for n, c in self._channels.items()},
                "seeds": {str(e): v.hex() for e, v in self._seeds.items()},
                "terms": {str(e): t.astype("<f8").tobytes().hex() for e, t in self._terms.items()},
                "z_eta": None if self._z_eta is None else self._z_eta.astype("<f8").tobytes().hex(),
                "removed": sorted(self._removed),
                "paired": self._paired,
                "masked": self._masked,
            }
        )

    def restore_state(self, session: GopaSession, state: str) -> None:
        """Continue ``session`` from :meth:`export_state` (this object must be fresh)."""
        if self._session is not None:
            raise ProtocolAbortedError(f"{self.name!r} already holds a session")
        session.index(self.name)
        try:
            st = json.loads(state)
            self._session = session
            if st["eph"] is not None:
                self._eph = EphemeralSession.restore(
                    self.identity,
                    self.roster,
                    session.session,
                    (bytes.fromhex(st["eph"][0]), st["eph"][1]),
                )
            self._channels = {
                n: SecureChannel.restore(bytes.fromhex(c)) for n, c in st["channels"].items()
            }
            self._seeds = {int(e): bytes.fromhex(v) for e, v in st["seeds"].items()}
            self._terms = {
                int(e): np.frombuffer(bytes.fromhex(t), dtype="<f8").astype(np.float64)
                for e, t in st["terms"].items()
            }
            z = st["z_eta"]
            self._z_eta = (
                None if z is None else np.frombuffer(bytes.fromhex(z), "<f8").astype(np.float64)
            )
            self._removed = {int(r) for r in st["removed"]}
            self._paired = bool(st["paired"])
            self._masked = bool(st["masked"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ProtocolAbortedError(
                f"stored state of {self.name!r} is unreadable: {exc}"
            ) from None

    # -- phase 1
    def join(self, session: GopaSession) -> KeyAdvertisement:
        """Start ``session``: a fresh ephemeral key, signed. One session per party object."""
        if self._session is not None:
            raise ProtocolAbortedError(f"{self.name!r} already joined a session")
        if not isinstance(session, GopaSession):
            raise fail("session", type(session).__name__, "a GopaSession")
        u = session.index(self.name)
        self._value = _check_value(self._value, session.dimension, session.vector, False)
        if session.vector != self._vector:
            raise fail(
                "session", "vector mismatch", "the domain this party's value was checked for"
            )
        for v in session.neighbours(u):
            if session.names[v] not in self.roster:
                raise ProtocolAbortedError(f"neighbour {session.names[v]!r} is not in the roster")
        self._session = session
        self._eph = EphemeralSession(self.identity, self.roster, session.session)
        # all of this session's randomness is drawn now and kept in the state, so that a
        # state restored twice gives the same answers (never a second eta or seed)
        self._z_eta = np.asarray(
            noise.standard_normal(session.dimension, rng=self._rng), dtype=np.float64
        )
        src = get_source(self._seed_rng)
        for v in session.neighbours(u):
            for eid in self._initiated(u, v):
                self._seeds[eid] = bytes(src.words(_SEED // 8).view(np.uint8))
        return self._eph.advertisement()

    def _require(self) -> tuple[GopaSession, int]:
        if self._session is None:
            raise ProtocolAbortedError(f"{self.name!r} has not joined a session")
        return self._session, self._session.index(self.name)

    # -- phase 2
    def pair(self, directory: Mapping[str, KeyAdvertisement | bytes]) -> dict[str, bytes]:
        """Verify the neighbours' advertisements and return one ciphertext per neighbour.

        A substituted, altered or replayed advertisement of a neighbour raises
        :class:`~renyi.federated.channels.KeySubstitutionError` before anything derived
        from the value is made; a missing one means the neighbour is absent.
        """
        s, u = self._require()
        if self._paired or self._eph is None:
            raise ProtocolAbortedError(f"{self.name!r} already paired in this session")
        out: dict[str, bytes] = {}
        for v in s.neighbours(u):
            peer = s.names[v]
            adv = directory.get(peer)
            if adv is None:
                continue  # absent: the edge is left out at masking (within the budget)
            if isinstance(adv, bytes):
                adv = KeyAdvertisement.from_bytes(adv)
            if adv.name != peer:
                raise ChannelIntegrityError(f"advertisement for {peer!r} names {adv.name!r}")
            ch = self._eph.channel(adv)
            self._channels[peer] = ch
            body = [ch.confirmation()]
            for eid in self._initiated(u, v):
                body.append(struct.pack(">Q", eid) + self._seeds[eid])
            out[peer] = ch.encrypt(b"".join(body))
        self._eph = None  # the ephemeral private key is no longer needed: forward secrecy
        self._paired = True
        return out

    def _initiated(self, u: int, v: int) -> list[int]:
        s = self._session
        assert s is not None
        return np.flatnonzero((s.edges[:, 0] == u) & (s.edges[:, 1] == v)).tolist()

    # -- phase 3
    def mask(self, inbox: Mapping[str, bytes], present: Collection[str]) -> NDArray[np.uint64]:
        """Check the neighbours' pairing messages and return the masked value (once).

        ``present``: the parties the server says paired. Edges to absent neighbours are
        left out, which counts against ``reveal_budget``; beyond it the party refuses.
        """
        s, u = self._require()
        if not self._paired:
            raise ProtocolAbortedError(f"{self.name!r} masked before pairing")
        if self._masked:
            raise ProtocolAbortedError(
                f"{self.name!r} already sent its masked value in this session; a second one"
                " (fresh eta over the same pairwise noise) would be an unaccounted release"
            )
        present = set(present)
        absent = [s.names[v] for v in s.neighbours(u) if s.names[v] not in present]
        self._spend(absent)
        d = s.dimension
        terms: dict[int, NDArray[np.float64]] = {}
        for v in s.neighbours(u):
            peer = s.names[v]
            if peer not in present:
                continue
            msg = inbox.get(peer)
            if msg is None:
                raise ProtocolAbortedError(
                    f"{peer!r} is said to be present but its pairing message to {self.name!r}"
                    " is missing"
                )
            ch = self._channels.get(peer)
            if ch is None:
                raise ProtocolAbortedError(
                    f"{peer!r} is said to be present but advertised no key to {self.name!r}"
                )
            plain = ch.decrypt(msg)
            ch.confirm(plain[:_CONFIRM])
            body = plain[_CONFIRM:]
            expect = self._initiated(v, u)
            if len(body) != len(expect) * (8 + _SEED):
                raise ChannelIntegrityError(f"pairing message of {peer!r} has the wrong length")
            for i, eid in enumerate(expect):
                chunk = body[i * (8 + _SEED) : (i + 1) * (8 + _SEED)]
                (got,) = struct.unpack(">Q", chunk[:8])
                if got != eid:
                    raise ChannelIntegrityError(f"seed from {peer!r} labelled {got}, not {eid}")
                terms[eid] = -_edge_term(ch.noise_key, chunk[8:], eid, s.sigma_delta, d)
            for eid in self._initiated(u, v):
                terms[eid] = _edge_term(ch.noise_key, self._seeds[eid], eid, s.sigma_delta, d)
        if self._z_eta is None or self._z_eta.shape != (d,):
            raise ProtocolAbortedError(f"{self.name!r} holds no noise for this session")
        self._terms = terms
        pairwise = np.zeros(d)
        for eid in sorted(terms):  # a fixed order: the same state gives the same bytes
            pairwise += terms[eid]
        self.eta = s.sigma_eta * self._z_eta
        g = s.lattice
        if s.sigma_eta > 0.0:
            # one release of X + eta + pairwise on the lattice g Z (renyi.noise.snap)
            out = noise.snap(self._value, self._z_eta + pairwise / s.sigma_eta, s.sigma_eta)
            index = np.asarray(out, dtype=np.float64) / g
        else:  # no independent noise (no privacy): the value plus the pairwise terms
            index = np.rint((self._value + pairwise) / g)
        self._masked = True
        self._seeds.clear()
        return index.astype(np.int64).view(np.uint64)

    def active_degree(self) -> int:
        """Number of pairwise terms in the masked message (known to the server too)."""
        return len(self._terms)

    def _spend(self, peers: list[str]) -> None:
        s, _ = self._require()
        new = {p for p in peers if p not in {s.names[i] for i in self._removed}}
        if len(self._removed) + len(new) > s.reveal_budget:
            raise ProtocolAbortedError(
                f"{self.name!r} refuses: removing the edges to {sorted(new)} would exceed its"
                f" reveal budget of {s.reveal_budget} neighbours per session (a server that"
                " lies about dropouts could otherwise unmask it)"
            )
        self._removed |= {s.index(p) for p in new}

    # -- phase 4
    def reveal(self, dropped: Collection[str]) -> dict[int, NDArray[np.uint64]]:
        """This party's terms on its edges to ``dropped`` parties, within the reveal budget
        (fixed point ``2**-FRACTION_BITS``, modulo ``2**64``)."""
        s, u = self._require()
        if not self._masked:
            raise ProtocolAbortedError(f"{self.name!r} is asked to reveal before masking")
        if self.name in dropped:
            raise ProtocolAbortedError(f"{self.name!r} is told that it dropped out itself")
        drop = {s.index(p) for p in dropped}
        peers = [s.names[v] for v in s.neighbours(u) if v in drop]
        self._spend(peers)
        out = {}
        for eid in self._terms:
            a, b = s.edges[eid].tolist()
            if (a if b == u else b) in drop:
                out[eid] = to_fixed(self._terms[eid], "pairwise term")
        return out


@dataclass(frozen=True)
class GopaResult:
    """What the server released and what happened on the way."""

    estimate: NDArray[np.float64] | float
    included: tuple[int, ...]
    dropped: tuple[int, ...]
    revealed_edges: tuple[int, ...]
    rejected: tuple[int, ...]
    edges: NDArray[np.int64] = field(repr=False)
    false_rejection_bound: float = 0.0
    total: NDArray[np.int64] | None = field(default=None, repr=False)
    """The released integer sum ``S`` (lattice units): ``estimate = lattice * S / n``."""
    lattice: float = 0.0


class GopaAggregator:
    """The server's side: routes messages, checks masked values, releases the mean once.

    It never holds a value or a key; its checks use only public parameters.
    """

    def __init__(self, session: GopaSession) -> None:
        if not isinstance(session, GopaSession):
            raise fail("session", type(session).__name__, "a GopaSession")
        self.session = session
        self._released = False

    @staticmethod
    def route(outboxes: Mapping[str, Mapping[str, bytes]]) -> dict[str, dict[str, bytes]]:
        """Sender -> receiver -> ciphertext, turned into receiver -> sender -> ciphertext."""
        inbox: dict[str, dict[str, bytes]] = {}
        for sender, msgs in outboxes.items():
            for receiver, ct in msgs.items():
                inbox.setdefault(receiver, {})[sender] = ct
        return inbox

    def active_degree(self, u: int, present: Collection[int]) -> int:
        e = self.session.edges
        live = np.isin(e, list(present)).all(axis=1)
        return int(((e == u).any(axis=1) & live).sum())

    def check_message(self, u: int, message: object, present: Collection[int]) -> str | None:
        """``None`` if ``message`` is an acceptable masked value of party ``u``, else why not."""
        s = self.session
        arr = np.asarray(message) if isinstance(message, np.ndarray | list) else None
        if arr is None or arr.dtype != np.uint64 or arr.shape != (s.dimension,):
            return f"not {s.dimension} unsigned 64-bit integers"
        lo, hi = s.acceptance_bound(u, self.active_degree(u, present))
        val = arr.view(np.int64).astype(np.float64) * s.lattice
        if not ((val >= lo) & (val <= hi)).all():
            return (
                f"outside [{lo:.6g}, {hi:.6g}], the range the noise scales allow (false"
                f" rejection probability {s.rejection_probability:.1e})"
            )
        return None

    def release(
        self,
        messages: Mapping[int, object],
        present: Collection[int],
        reveal: object,
    ) -> GopaResult:
        """Check ``messages`` (party index -> masked value), recover dropouts, release.

        ``present``: parties that paired. A present party without an acceptable message is
        a dropout; ``reveal(dropped_names) -> {party: {edge id: term}}`` collects the
        survivors' terms on the broken edges (``reveal_budget`` limits what they give).
        Raises :class:`ProtocolAbortedError` (nothing released) if a survivor refuses or a
        needed term is missing.
        """
        s = self.session
        if self._released:
            raise ProtocolAbortedError("this session already released its aggregate")
        present_set = set(present)
        rejected = []
        ok: dict[int, NDArray[np.uint64]] = {}
        for u in sorted(present_set):
            if u not in messages:
                continue
            why = self.check_message(u, messages[u], present_set)
            if why is None:
                ok[u] = np.asarray(messages[u], dtype=np.uint64)
            else:
                rejected.append(u)
        if not ok:
            raise ProtocolAbortedError("no acceptable masked message; nothing is released")
        alive = sorted(ok)
        dropped = sorted(present_set - set(alive))
        e = s.edges
        in_present = np.isin(e, list(present_set)).all(axis=1)
        touches = np.isin(e, dropped)
        broken = np.flatnonzero(in_present & touches.any(axis=1) & ~touches.all(axis=1))
        correction = np.zeros(s.dimension, dtype=np.uint64)
        if broken.size:
            got = reveal([s.names[i] for i in dropped]) if callable(reveal) else None
            if not isinstance(got, Mapping):
                raise ProtocolAbortedError("dropout recovery failed: no reveal answers")
            for eid in broken.tolist():
                a, b = e[eid].tolist()
                survivor = a if b in dropped else b
                term = got.get(survivor, {}).get(eid)
                if term is None:
                    raise ProtocolAbortedError(
                        f"party {s.names[survivor]!r} did not reveal its term for edge {eid};"
                        " the masks do not cancel, nothing is released"
                    )
                correction = correction + np.asarray(term, dtype=np.uint64)
        total = np.zeros(s.dimension, dtype=np.uint64)
        for u in alive:
            total = total + ok[u]
        # the revealed terms (public now) rounded to the lattice: post-processing
        shift = np.rint(correction.view(np.int64).astype(np.float64) / _SCALE / s.lattice)
        total = total - shift.astype(np.int64).view(np.uint64)
        self._released = True
        mean = lattice_mean(total, len(alive), s.lattice)
        return GopaResult(
            estimate=float(mean[0]) if not s.vector else mean,
            included=tuple(alive),
            dropped=tuple(dropped),
            revealed_edges=tuple(broken.tolist()),
            rejected=tuple(rejected),
            edges=np.asarray(s.edges),
            false_rejection_bound=min(1.0, len(present_set) * s.rejection_probability),
            total=total.view(np.int64).copy(),
            lattice=s.lattice,
        )
