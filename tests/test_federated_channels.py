"""Authenticated channels: signatures pinned in a roster, forward secrecy, nonce safety."""

from __future__ import annotations

import hashlib

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from renyi.errors import PrivacyParameterError
from renyi.federated.channels import (
    ChannelIntegrityError,
    EphemeralSession,
    IdentityKey,
    KeyAdvertisement,
    KeySubstitutionError,
    Roster,
)

SID = b"session-0123456789"


def _pair(sid: bytes = SID) -> tuple[object, object, Roster]:
    a, b = IdentityKey("a"), IdentityKey("b")
    roster = Roster.of([a, b])
    sa, sb = EphemeralSession(a, roster, sid), EphemeralSession(b, roster, sid)
    return sa.channel(sb.advertisement()), sb.channel(sa.advertisement()), roster


def test_roundtrip_confirmation_and_key_separation() -> None:
    ab, ba, _ = _pair()
    assert ba.decrypt(ab.encrypt(b"seed")) == b"seed"
    assert ab.decrypt(ba.encrypt(b"back")) == b"back"
    ba.confirm(ab.confirmation())
    ab.confirm(ba.confirmation())
    with pytest.raises(KeySubstitutionError, match="confirmation"):
        ab.confirm(ab.confirmation())  # a reflected tag is not the peer's
    # four distinct keys: two directions, noise, confirmation (labels separate them)
    assert len({ab.send_key, ba.send_key, ab.noise_key}) == 3
    assert ab.noise_key == ba.noise_key


def test_replay_reorder_and_wrong_receiver_are_rejected() -> None:
    ab, ba, _ = _pair()
    m0, m1 = ab.encrypt(b"0"), ab.encrypt(b"1")
    with pytest.raises(ChannelIntegrityError, match="counter"):
        ba.decrypt(m1)  # reordered
    assert ba.decrypt(m0) == b"0"
    with pytest.raises(ChannelIntegrityError, match="counter"):
        ba.decrypt(m0)  # replayed
    # reflected back to its sender: other direction key, fails authentication
    with pytest.raises(ChannelIntegrityError):
        ab.decrypt(m1)
    # a third party of the same session cannot read a's message to b
    c = IdentityKey("c")
    a2, b2 = IdentityKey("a"), IdentityKey("b")
    roster = Roster.of([a2, b2, c])
    sa, sb, sc = (EphemeralSession(i, roster, SID) for i in (a2, b2, c))
    msg = sa.channel(sb.advertisement()).encrypt(b"secret")
    with pytest.raises(ChannelIntegrityError, match="failed authentication"):
        sc.channel(sa.advertisement()).decrypt(msg)


def test_nonce_key_pairs_never_repeat_across_many_channel_objects() -> None:
    """The old API reused nonce 0 under one key when a channel was opened twice."""
    a, b = IdentityKey("a"), IdentityKey("b")
    roster = Roster.of([a, b])
    seen: set[bytes] = set()
    for _ in range(300):  # many channel objects, same parties, same session id
        sa, sb = EphemeralSession(a, roster, SID), EphemeralSession(b, roster, SID)
        ab, ba = sa.channel(sb.advertisement()), sb.channel(sa.advertisement())
        for ch in (ab, ba):
            for counter in range(3):
                ch.encrypt(b"x")
                # (key, nonce) identifies a keystream: it must be fresh
                ident = hashlib.sha256(ch.send_key + counter.to_bytes(12, "big")).digest()
                assert ident not in seen
                seen.add(ident)
        with pytest.raises(ChannelIntegrityError, match="already opened"):
            sa.channel(sb.advertisement())  # same session object: second channel refused
    assert len(seen) == 300 * 2 * 3


def test_substituted_replayed_or_renamed_advertisements_are_detected() -> None:
    a, b = IdentityKey("a"), IdentityKey("b")
    roster = Roster.of([a, b])
    sa = EphemeralSession(a, roster, SID)
    good = EphemeralSession(b, roster, SID).advertisement()
    # the relay swaps in its own ephemeral key, keeping b's (now invalid) signature
    mitm = X25519PrivateKey.generate().public_key().public_bytes_raw()
    swapped = KeyAdvertisement(good.name, good.session, mitm, good.signature)
    with pytest.raises(KeySubstitutionError, match="pinned"):
        sa.channel(swapped)
    # the relay signs with a key it owns: not the pinned one
    rogue = IdentityKey("b")
    forged = EphemeralSession(rogue, Roster.of([rogue]), SID).advertisement()
    with pytest.raises(KeySubstitutionError, match="pinned"):
        sa.channel(forged)
    # replay of b's advertisement from an older session
    old = EphemeralSession(b, roster, b"older-session-id-xx").advertisement()
    with pytest.raises(KeySubstitutionError, match="another session"):
        sa.channel(old)
    # unknown party, malformed bytes
    with pytest.raises(KeySubstitutionError, match="roster"):
        sa.channel(KeyAdvertisement("z", SID, mitm, bytes(64)))
    with pytest.raises(ChannelIntegrityError, match="malformed"):
        KeyAdvertisement.from_bytes(b"\x00\x00\x00\x09abc")
    assert KeyAdvertisement.from_bytes(good.to_bytes()) == good
    sa.channel(good)  # the genuine one still works


def test_roster_and_identity_validation() -> None:
    a = IdentityKey("a")
    r = Roster.of([a, IdentityKey("b")])
    assert Roster.from_json(r.to_json()) == r and len(r.fingerprint()) == 64
    assert IdentityKey.from_private_bytes("a", a.private_bytes()).public_bytes == a.public_bytes
    with pytest.raises(PrivacyParameterError, match="duplicate"):
        Roster({"a": a.public_bytes, "b": a.public_bytes})
    with pytest.raises(PrivacyParameterError, match="roster"):
        Roster.from_json("not json")
    with pytest.raises(PrivacyParameterError, match="session"):
        EphemeralSession(a, r, b"short")
    with pytest.raises(KeySubstitutionError, match="does not pin"):
        EphemeralSession(IdentityKey("a"), r, SID)
    with pytest.raises(PrivacyParameterError, match="name"):
        IdentityKey("")


def test_restoring_a_channel_twice_never_reuses_a_key_and_nonce(monkeypatch) -> None:
    """Issue 22.6: a state restored twice used to encrypt two different plaintexts under the
    same ChaCha20-Poly1305 key and counter (a two-time pad plus a forgeable Poly1305 key).
    Every (key, nonce) pair the AEAD is asked to encrypt under is recorded here."""
    from renyi.federated import channels
    from renyi.federated.channels import SecureChannel

    used: list[tuple[bytes, bytes, bytes]] = []
    real = channels.ChaCha20Poly1305

    class Recording:
        def __init__(self, key: bytes) -> None:
            self._aead, self._k = real(key), key

        def encrypt(self, nonce: bytes, data: bytes, aad: bytes | None) -> bytes:
            used.append((self._k, nonce, data))
            return self._aead.encrypt(nonce, data, aad)

        def decrypt(self, nonce: bytes, data: bytes, aad: bytes | None) -> bytes:
            return self._aead.decrypt(nonce, data, aad)

    monkeypatch.setattr(channels, "ChaCha20Poly1305", Recording)
    ab, ba, _ = _pair()
    m0 = ab.encrypt(b"first")
    saved = ab.export_state()
    one, two = SecureChannel.restore(saved), SecureChannel.restore(saved)
    m1, m2 = one.encrypt(b"seed for edge 1"), two.encrypt(b"another seed!!!")
    for _ in range(50):  # and many more restores of the same state
        SecureChannel.restore(saved).encrypt(b"x")
    pairs = [(k, n) for k, n, _ in used]
    assert len(set(pairs)) == len(pairs)  # no (key, nonce) twice, whatever the plaintexts
    assert len({n for _, n, _ in used[1:]}) == 1  # ... although the counter did repeat
    # the receiver takes one message per counter: the first, then the copy is a replay
    assert ba.decrypt(m0) == b"first"
    assert ba.decrypt(m1) == b"seed for edge 1"
    with pytest.raises(ChannelIntegrityError, match="counter"):
        ba.decrypt(m2)
