"""Authenticated, forward-secret channels between parties, and keyed pseudo-random noise.

GOPA (Sabater, Bellet & Ramon 2022) needs every pair of peers to agree on a secret that the
relaying server cannot read or substitute. Everything here is built on the ``cryptography``
package (optional extra ``renyi[federated]``):

* **Identity.** :class:`IdentityKey` is a party's long-term Ed25519 signing key. The parties
  agree *out of band* on a :class:`Roster` (party name -> Ed25519 public key; compare
  :meth:`Roster.fingerprint` values). The server only relays; it is not trusted for keys.
* **Session keys (forward secrecy).** Per protocol session each party makes a fresh X25519
  key pair (:class:`EphemeralSession`) and publishes a :class:`KeyAdvertisement`: the
  ephemeral public key signed, together with the session identifier and its name, by its
  identity key. A party checks every advertisement against the pinned roster before using
  it (:meth:`KeyAdvertisement.verify`): a relay that swaps a key, replays an advertisement
  from another session or renames a party is detected (:class:`KeySubstitutionError`) and
  the party stops before any value leaves it. Ephemeral private keys are never written
  anywhere by this module, so a later theft of identity keys does not open past sessions.
* **Key schedule.** For a pair, the X25519 secret goes through HKDF-SHA256 (RFC 5869) with
  the SHA-256 hash of the *transcript* (session, both names, identity and ephemeral public
  keys, in a fixed order) as salt, under separate labels: one AEAD key per direction
  (``lo -> hi`` and ``hi -> lo``), one key for pairwise noise/seed derivation and one for key
  confirmation. The AEAD key is never an HKDF input and the noise key never encrypts.
* **Channel.** :class:`SecureChannel` encrypts with ChaCha20-Poly1305 (RFC 8439) under a
  **fresh key per message**: ``HKDF(direction key, salt=16 random bytes, info=counter)``,
  the salt travelling with the ciphertext. The per-direction counter orders messages
  (replay and reordering are refused) but is not what keeps nonces unique: a channel state
  saved with :meth:`SecureChannel.export_state` and restored twice (a party process that
  restarts from the same stored state, a replayed round) encrypts its next message under
  two independent random keys, so no (key, nonce) pair ever carries two plaintexts
  (collision probability ``<= n² 2**-129`` for ``n`` messages). The associated data binds
  the transcript hash, sender and receiver; a tampered, replayed, reordered or mis-addressed
  message raises :class:`ChannelIntegrityError` before anything is derived from it.
  :meth:`SecureChannel.confirmation` / :meth:`~SecureChannel.confirm`
  give explicit key confirmation (HMAC-SHA256 under the confirmation key, per direction).
* **Keyed noise.** :class:`ChaCha20Source` is a :class:`renyi.random.RandomSource` whose
  64-bit words are the ChaCha20 keystream under a 256-bit key (a CSPRNG): two holders of
  the key draw the same numbers.

Threat model: an active relay (it may drop, reorder, replay, alter or substitute any
message and key) that does not hold a party's identity key; parties' private values are
protected by the AEAD and the signatures, their availability is not.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from numpy.typing import NDArray

from renyi._validation import check_int, fail
from renyi.errors import RenyiError
from renyi.random import RandomSource

__all__ = [
    "ChaCha20Source",
    "ChannelIntegrityError",
    "EphemeralSession",
    "IdentityKey",
    "KeyAdvertisement",
    "KeySubstitutionError",
    "Roster",
    "SecureChannel",
    "derive_key",
]

_KEY_BYTES = 32
_SIG_BYTES = 64
_TAG_BYTES = 32
_SALT_BYTES = 16
_LABEL = b"renyi-gopa-v3"
_RAW = (serialization.Encoding.Raw, serialization.PublicFormat.Raw)


class ChannelIntegrityError(RenyiError):
    """A message failed authentication (tampered, replayed or sent to the wrong party)."""


class KeySubstitutionError(ChannelIntegrityError):
    """A key advertisement is not signed by the party's pinned identity key (or not fresh)."""


def derive_key(secret: bytes, *, salt: bytes, info: bytes, length: int = _KEY_BYTES) -> bytes:
    """HKDF-SHA256 (RFC 5869) of ``secret`` with ``salt`` and context ``info``."""
    if not isinstance(secret, bytes) or len(secret) < 16:
        raise fail("secret", type(secret).__name__, "at least 16 bytes of key material")
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(secret)


def _u64(n: int) -> bytes:
    return struct.pack(">Q", n)


def _frame(*parts: bytes) -> bytes:
    """Unambiguous concatenation: every part prefixed by its 4-byte length."""
    return b"".join(struct.pack(">I", len(p)) + p for p in parts)


def _unframe(raw: bytes, count: int, what: str) -> list[bytes]:
    """Inverse of :func:`_frame` for exactly ``count`` parts."""
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


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name or len(name) > 256:
        raise fail("name", name, "a non-empty party name of at most 256 characters")
    return name


def _check_session(session: object) -> bytes:
    if not isinstance(session, bytes) or not 16 <= len(session) <= 64:
        raise fail("session", type(session).__name__, "16 to 64 bytes (a fresh random id)")
    return session


class ChaCha20Source(RandomSource):
    """A deterministic CSPRNG: the ChaCha20 keystream under a 256-bit key.

    Two holders of the same key (and ``stream`` number) read the same 64-bit words; without
    the key the words are indistinguishable from uniform. Each instance consumes its stream
    sequentially.

    >>> a = ChaCha20Source(bytes(32)); b = ChaCha20Source(bytes(32))
    >>> bool((a.words(4) == b.words(4)).all())
    True
    """

    secure = True

    def __init__(self, key: bytes, stream: int = 0) -> None:
        if not isinstance(key, bytes) or len(key) != _KEY_BYTES:
            raise fail("key", type(key).__name__, "32 bytes")
        stream = check_int("stream", stream, 0)
        # cryptography's ChaCha20 takes a 16-byte nonce: 64-bit block counter || 64-bit nonce.
        nonce = struct.pack("<QQ", 0, stream)
        self._enc = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor()

    def words(self, n: int) -> NDArray[np.uint64]:
        n = check_int("n", n)
        raw = self._enc.update(bytes(8 * n))
        return np.frombuffer(raw, dtype="<u8").astype(np.uint64)

    def __repr__(self) -> str:
        return "ChaCha20Source(<key hidden>)"


# --------------------------------------------------------------------------- identity


@dataclass
class IdentityKey:
    """A party's long-term Ed25519 identity: a name and a signing key.

    >>> alice = IdentityKey("alice")
    >>> len(alice.public_bytes)
    32
    >>> IdentityKey.from_private_bytes("alice", alice.private_bytes()).public_bytes == (
    ...     alice.public_bytes)
    True
    """

    name: str
    _private: Ed25519PrivateKey = field(default_factory=Ed25519PrivateKey.generate, repr=False)

    def __post_init__(self) -> None:
        _check_name(self.name)

    @classmethod
    def from_private_bytes(cls, name: str, raw: bytes) -> IdentityKey:
        """Load a key saved with :meth:`private_bytes` (32 raw bytes)."""
        if not isinstance(raw, bytes) or len(raw) != _KEY_BYTES:
            raise fail("raw", type(raw).__name__, "32 raw Ed25519 private-key bytes")
        return cls(name, Ed25519PrivateKey.from_private_bytes(raw))

    def private_bytes(self) -> bytes:
        """The 32 raw private-key bytes (store them with owner-only permissions)."""
        return self._private.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )

    @property
    def public_bytes(self) -> bytes:
        """The 32-byte Ed25519 public key that goes into the roster."""
        return self._private.public_key().public_bytes(*_RAW)

    def sign(self, data: bytes) -> bytes:
        """Ed25519 signature of ``data``."""
        return self._private.sign(data)


class Roster(Mapping[str, bytes]):
    """Pinned identity keys: party name -> 32-byte Ed25519 public key.

    Parties agree on the roster out of band (compare :meth:`fingerprint`); the relay cannot
    change it. Serialises to JSON (hex keys).

    >>> r = Roster({"a": IdentityKey("a").public_bytes, "b": IdentityKey("b").public_bytes})
    >>> Roster.from_json(r.to_json()).fingerprint() == r.fingerprint()
    True
    """

    def __init__(self, keys: Mapping[str, bytes]) -> None:
        entries: dict[str, bytes] = {}
        for name, pub in keys.items():
            _check_name(name)
            if not isinstance(pub, bytes) or len(pub) != _KEY_BYTES:
                raise fail(f"roster[{name!r}]", type(pub).__name__, "32-byte Ed25519 key")
            try:
                Ed25519PublicKey.from_public_bytes(pub)
            except ValueError:
                raise fail(f"roster[{name!r}]", pub.hex(), "a valid Ed25519 key") from None
            entries[name] = pub
        if len(set(entries.values())) != len(entries):
            raise fail("keys", "duplicate public keys", "one distinct identity key per party")
        self._keys = dict(sorted(entries.items()))

    @classmethod
    def of(cls, identities: Iterable[IdentityKey]) -> Roster:
        """The roster of some identities' public keys."""
        return cls({i.name: i.public_bytes for i in identities})

    def __getitem__(self, name: str) -> bytes:
        return self._keys[name]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def fingerprint(self) -> str:
        """SHA-256 of the sorted entries (hex): what parties compare out of band."""
        return hashlib.sha256(
            _frame(_LABEL + b"|roster", *(_frame(n.encode(), k) for n, k in self._keys.items()))
        ).hexdigest()

    def to_json(self) -> str:
        """``{"name": "hex key", ...}``."""
        return json.dumps({n: k.hex() for n, k in self._keys.items()}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Roster:
        """Parse :meth:`to_json` output."""
        try:
            raw = json.loads(text)
            return cls({str(n): bytes.fromhex(k) for n, k in raw.items()})
        except (ValueError, AttributeError, TypeError) as exc:
            raise fail("roster", "unparsable JSON", f"{{name: hex key}} ({exc})") from None


# --------------------------------------------------------------------------- advertisements


def _advert_payload(session: bytes, name: str, ephemeral: bytes) -> bytes:
    return _frame(_LABEL + b"|advertisement", session, name.encode(), ephemeral)


@dataclass(frozen=True)
class KeyAdvertisement:
    """A party's ephemeral X25519 public key for one session, signed by its identity key."""

    name: str
    session: bytes
    ephemeral: bytes
    signature: bytes

    def to_bytes(self) -> bytes:
        """Wire format (length-framed fields)."""
        return _frame(self.name.encode(), self.session, self.ephemeral, self.signature)

    @classmethod
    def from_bytes(cls, raw: bytes) -> KeyAdvertisement:
        """Parse :meth:`to_bytes`; malformed input raises :class:`ChannelIntegrityError`."""
        if not isinstance(raw, bytes):
            raise ChannelIntegrityError("malformed key advertisement")
        parts = _unframe(raw, 4, "key advertisement")
        try:
            return cls(parts[0].decode(), parts[1], parts[2], parts[3])
        except UnicodeDecodeError:
            raise ChannelIntegrityError("malformed key advertisement") from None

    def verify(self, roster: Roster, session: bytes) -> None:
        """Check the signature against the pinned key of :attr:`name` and the session.

        Raises :class:`KeySubstitutionError` if the party is not in the roster, the
        advertisement is for another session, the ephemeral key is malformed or the
        signature does not verify (a relay substituted or altered the key).
        """
        if self.name not in roster:
            raise KeySubstitutionError(f"{self.name!r} is not in the pinned roster")
        if not hmac.compare_digest(self.session, session):
            raise KeySubstitutionError(
                f"advertisement of {self.name!r} is for another session (replayed)"
            )
        if len(self.ephemeral) != _KEY_BYTES or len(self.signature) != _SIG_BYTES:
            raise KeySubstitutionError(f"advertisement of {self.name!r} is malformed")
        try:
            Ed25519PublicKey.from_public_bytes(roster[self.name]).verify(
                self.signature, _advert_payload(session, self.name, self.ephemeral)
            )
        except InvalidSignature:
            raise KeySubstitutionError(
                f"the ephemeral key advertised for {self.name!r} is not signed by its pinned"
                " identity key: the relay substituted or altered it; aborting before any"
                " value is sent"
            ) from None


class EphemeralSession:
    """One party's side of one protocol session: a fresh X25519 key and its channels.

    >>> a, b = IdentityKey("a"), IdentityKey("b")
    >>> roster, sid = Roster.of([a, b]), bytes(16)
    >>> sa, sb = EphemeralSession(a, roster, sid), EphemeralSession(b, roster, sid)
    >>> ab, ba = sa.channel(sb.advertisement()), sb.channel(sa.advertisement())
    >>> ba.decrypt(ab.encrypt(b"hi"))
    b'hi'
    >>> ab.noise_key == ba.noise_key and ab.noise_key != ab.send_key
    True
    """

    def __init__(
        self,
        identity: IdentityKey,
        roster: Roster,
        session: bytes,
        *,
        _state: tuple[bytes, Iterable[str]] | None = None,
    ) -> None:
        if not isinstance(identity, IdentityKey):
            raise fail("identity", type(identity).__name__, "an IdentityKey")
        if not isinstance(roster, Roster):
            raise fail("roster", type(roster).__name__, "a Roster")
        self.session = _check_session(session)
        if roster.get(identity.name) != identity.public_bytes:
            raise KeySubstitutionError(
                f"the roster does not pin {identity.name!r} to this identity key"
            )
        self.identity = identity
        self.roster = roster
        if _state is None:
            self._ephemeral = X25519PrivateKey.generate()
            self._opened: set[str] = set()
        else:
            self._ephemeral = X25519PrivateKey.from_private_bytes(_state[0])
            self._opened = set(_state[1])

    def export_state(self) -> tuple[bytes, list[str]]:
        """Ephemeral private key and opened peers, for a party whose process restarts
        between protocol rounds (e.g. a Flower ClientApp). Secret: keep it in the party's
        own storage only, and drop it once pairing is done."""
        raw = self._ephemeral.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        return raw, sorted(self._opened)

    @classmethod
    def restore(
        cls,
        identity: IdentityKey,
        roster: Roster,
        session: bytes,
        state: tuple[bytes, Iterable[str]],
    ) -> EphemeralSession:
        """The session saved by :meth:`export_state` (same key, same opened peers)."""
        return cls(identity, roster, session, _state=state)

    @property
    def name(self) -> str:
        return self.identity.name

    @property
    def ephemeral_public(self) -> bytes:
        return self._ephemeral.public_key().public_bytes(*_RAW)

    def advertisement(self) -> KeyAdvertisement:
        """The signed advertisement of this session's ephemeral key."""
        eph = self.ephemeral_public
        sig = self.identity.sign(_advert_payload(self.session, self.name, eph))
        return KeyAdvertisement(self.name, self.session, eph, sig)

    def channel(self, peer: KeyAdvertisement) -> SecureChannel:
        """Verify ``peer``'s advertisement and open the (only) channel to it.

        A second channel to the same peer in this session is refused: its counters would
        restart under the same keys.
        """
        peer.verify(self.roster, self.session)
        if peer.name == self.name:
            raise fail("peer", peer.name, "a party other than oneself")
        if peer.name in self._opened:
            raise ChannelIntegrityError(
                f"a channel to {peer.name!r} was already opened in this session; reusing its"
                " keys would repeat nonces"
            )
        try:
            secret = self._ephemeral.exchange(X25519PublicKey.from_public_bytes(peer.ephemeral))
        except ValueError:
            raise KeySubstitutionError(f"ephemeral key of {peer.name!r} is invalid") from None
        if secret == bytes(_KEY_BYTES):
            raise KeySubstitutionError(f"ephemeral key of {peer.name!r} is a low-order point")
        mine = (self.name, self.identity.public_bytes, self.ephemeral_public)
        theirs = (peer.name, self.roster[peer.name], peer.ephemeral)
        lo, hi = sorted([mine, theirs])
        transcript = hashlib.sha256(
            _frame(
                _LABEL + b"|transcript",
                self.session,
                lo[0].encode(),
                *lo[1:],
                hi[0].encode(),
                *hi[1:],
            )
        ).digest()

        def key(label: str) -> bytes:
            return derive_key(secret, salt=transcript, info=_LABEL + b"|" + label.encode())

        lo_name, hi_name = lo[0], hi[0]
        up, down = key(f"aead {lo_name}->{hi_name}"), key(f"aead {hi_name}->{lo_name}")
        mine_is_lo = self.name == lo_name
        self._opened.add(peer.name)
        return SecureChannel(
            me=self.name,
            peer=peer.name,
            transcript=transcript,
            send_key=up if mine_is_lo else down,
            receive_key=down if mine_is_lo else up,
            noise_key=key("pairwise-noise"),
            confirm_key=key("key-confirmation"),
        )


class SecureChannel:
    """ChaCha20-Poly1305 channel of one pair in one session (made by :class:`EphemeralSession`).

    Each direction has its own key; every message is encrypted under a fresh key derived
    from it and a random salt (sent along), with the message counter as nonce; the
    associated data binds the transcript, sender and receiver.
    """

    def __init__(
        self,
        *,
        me: str,
        peer: str,
        transcript: bytes,
        send_key: bytes,
        receive_key: bytes,
        noise_key: bytes,
        confirm_key: bytes,
    ) -> None:
        for name, k in (
            ("send_key", send_key),
            ("receive_key", receive_key),
            ("noise_key", noise_key),
            ("confirm_key", confirm_key),
        ):
            if not isinstance(k, bytes) or len(k) != _KEY_BYTES:
                raise fail(name, type(k).__name__, "32 bytes")
        if send_key == receive_key:
            raise fail("receive_key", "equal to send_key", "a key distinct per direction")
        self.me, self.peer, self.transcript = me, peer, transcript
        self._send_key = send_key
        self._receive_key = receive_key
        self._noise_key = noise_key
        self._confirm_key = confirm_key
        self._sent = 0
        self._received = 0

    @property
    def send_key(self) -> bytes:
        """The AEAD key of this party's direction (for tests; never sent)."""
        return self._send_key

    @property
    def noise_key(self) -> bytes:
        """The key both ends use to derive pairwise noise; never used to encrypt."""
        return self._noise_key

    def _aad(self, sender: str, receiver: str) -> bytes:
        return _frame(_LABEL + b"|aad", self.transcript, sender.encode(), receiver.encode())

    def confirmation(self) -> bytes:
        """Key-confirmation tag this party sends: HMAC(confirm key, sender -> receiver)."""
        return hmac.new(self._confirm_key, self._aad(self.me, self.peer), "sha256").digest()

    def confirm(self, tag: bytes) -> None:
        """Check the peer's confirmation tag (constant time); raise if it does not match."""
        want = hmac.new(self._confirm_key, self._aad(self.peer, self.me), "sha256").digest()
        if not isinstance(tag, bytes) or not hmac.compare_digest(tag, want):
            raise KeySubstitutionError(
                f"key confirmation from {self.peer!r} failed: the two ends do not hold the"
                " same keys (substituted key or wrong session)"
            )

    @staticmethod
    def _message_key(direction_key: bytes, salt: bytes, counter: int) -> bytes:
        return derive_key(direction_key, salt=salt, info=_LABEL + b"|message" + _u64(counter))

    def encrypt(self, plaintext: bytes) -> bytes:
        """Encrypt and authenticate ``plaintext``; returns ``counter || salt || ciphertext``.

        The AEAD key is fresh for every call (random 128-bit salt), so even a channel
        restored twice from the same saved state never reuses a (key, nonce) pair.
        """
        counter = self._sent
        self._sent += 1
        salt = os.urandom(_SALT_BYTES)
        key = self._message_key(self._send_key, salt, counter)
        nonce = struct.pack(">IQ", 0, counter)
        return (
            _u64(counter)
            + salt
            + ChaCha20Poly1305(key).encrypt(nonce, plaintext, self._aad(self.me, self.peer))
        )

    def decrypt(self, message: bytes) -> bytes:
        """Verify and decrypt the peer's next message; raise on tampering or replay."""
        if not isinstance(message, bytes) or len(message) < 8 + _SALT_BYTES + 16:
            raise ChannelIntegrityError(f"message from {self.peer!r} is too short")
        (counter,) = struct.unpack(">Q", message[:8])
        if counter != self._received:
            raise ChannelIntegrityError(
                f"message from {self.peer!r} has counter {counter}, expected {self._received}"
                " (replayed, reordered or dropped)"
            )
        salt = message[8 : 8 + _SALT_BYTES]
        key = self._message_key(self._receive_key, salt, counter)
        nonce = struct.pack(">IQ", 0, counter)
        try:
            out = ChaCha20Poly1305(key).decrypt(
                nonce, message[8 + _SALT_BYTES :], self._aad(self.peer, self.me)
            )
        except InvalidTag:
            raise ChannelIntegrityError(
                f"message from {self.peer!r} to {self.me!r} failed authentication"
                " (tampered or forged); nothing was derived from it"
            ) from None
        self._received += 1
        return out

    def export_state(self) -> bytes:
        """Keys and counters (secret), so that a restarted party continues the channel
        where it stopped. Restoring the same state twice is safe: each message draws a fresh
        random key (the counters repeat, the keys do not); the peer accepts only one message
        per counter."""
        return _frame(
            self.me.encode(),
            self.peer.encode(),
            self.transcript,
            self._send_key,
            self._receive_key,
            self._noise_key,
            self._confirm_key,
            struct.pack(">QQ", self._sent, self._received),
        )

    @classmethod
    def restore(cls, raw: bytes) -> SecureChannel:
        """The channel saved by :meth:`export_state`."""
        parts = _unframe(raw, 8, "channel state")
        ch = cls(
            me=parts[0].decode(),
            peer=parts[1].decode(),
            transcript=parts[2],
            send_key=parts[3],
            receive_key=parts[4],
            noise_key=parts[5],
            confirm_key=parts[6],
        )
        ch._sent, ch._received = struct.unpack(">QQ", parts[7])
        return ch

    def __repr__(self) -> str:
        return f"SecureChannel({self.me!r} -> {self.peer!r}, <keys hidden>)"
