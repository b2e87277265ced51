"""The ChaCha20 keystream behind :class:`renyi.noise.CounterNoise` (RFC 8439).

Two implementations of one function, ``keystream(key, nonce, first_block, n_blocks)``:

* :func:`keystream_openssl`: OpenSSL's ChaCha20 through the ``cryptography`` package (the
  fast CPU path; the 16-byte "nonce" of that API is RFC 8439's initial state words 12-15:
  a 32-bit little-endian block counter followed by the 96-bit nonce);
* :func:`chacha20_blocks`: the block function written with array operations (``numpy`` or
  ``torch``, CPU or CUDA), for any set of ``(nonce, counter)`` pairs at once: the GPU path
  and the few extension blocks of the exact recomputation. Both are checked against RFC
  8439's test vectors (section 2.3.2 block, 2.4.2 encryption) and against each other.

Counter layout (see ``docs/noise.md``): the 96-bit nonce is ``domain (u8) | stream (u24)``
as its first little-endian 32-bit word, then ``step`` as a little-endian 64-bit integer. A
block counter never wraps: a request that would pass block ``2**32 - 1`` is refused (OpenSSL
would carry into the nonce, i.e. into another stream's keystream).
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from renyi._validation import fail

__all__ = [
    "BLOCK_BYTES",
    "MAX_BLOCKS",
    "chacha20_blocks",
    "keystream",
    "keystream_openssl",
    "make_nonce",
]

BLOCK_BYTES = 64
MAX_BLOCKS = 1 << 32
_MASK = 0xFFFFFFFF
_SIGMA = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)  # "expand 32-byte k"


def make_nonce(domain: int, stream: int, step: int) -> bytes:
    """The 12-byte nonce of ``(domain, stream, step)``: ``domain`` in ``[0, 256)``,
    ``stream`` in ``[0, 2**24)``, ``step`` in ``[0, 2**64)`` (checked by the caller)."""
    return struct.pack("<IQ", (domain << 24) | stream, step)


def keystream_openssl(key: bytes, nonce: bytes, first_block: int, n_bytes: int) -> bytearray:
    """``n_bytes`` of keystream from block ``first_block`` on (OpenSSL via ``cryptography``)."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    if first_block < 0 or first_block + (n_bytes + BLOCK_BYTES - 1) // BLOCK_BYTES > MAX_BLOCKS:
        raise fail("counter", first_block, "a block range inside [0, 2**32)")
    buf = bytearray(n_bytes)
    enc = Cipher(
        algorithms.ChaCha20(key, struct.pack("<I", first_block) + nonce), mode=None
    ).encryptor()
    enc.update_into(buf, buf)
    return buf


def keystream(key: bytes, nonce: bytes, first_block: int, n_bytes: int) -> bytearray:
    """``n_bytes`` of keystream: OpenSSL when ``cryptography`` is installed, else numpy."""
    try:
        return keystream_openssl(key, nonce, first_block, n_bytes)
    except ImportError:  # pragma: no cover - cryptography is in every extra that draws noise
        n_blocks = (n_bytes + BLOCK_BYTES - 1) // BLOCK_BYTES
        if first_block < 0 or first_block + n_blocks > MAX_BLOCKS:
            raise fail("counter", first_block, "a block range inside [0, 2**32)") from None
        words = np.frombuffer(nonce, dtype="<u4")
        counters = np.arange(first_block, first_block + n_blocks, dtype=np.int64)
        nonces = np.broadcast_to(words.astype(np.int64), (n_blocks, 3))
        out = chacha20_blocks(key, nonces, counters, np)
        return bytearray(out.astype("<u4").tobytes()[:n_bytes])


def _key_words(key: bytes) -> list[int]:
    return list(struct.unpack("<8I", key))


def _rotl(x: Any, n: int) -> Any:
    return ((x << n) | (x >> (32 - n))) & _MASK


def _quarter(s: list[Any], a: int, b: int, c: int, d: int) -> None:
    s[a] = (s[a] + s[b]) & _MASK
    s[d] = _rotl(s[d] ^ s[a], 16)
    s[c] = (s[c] + s[d]) & _MASK
    s[b] = _rotl(s[b] ^ s[c], 12)
    s[a] = (s[a] + s[b]) & _MASK
    s[d] = _rotl(s[d] ^ s[a], 8)
    s[c] = (s[c] + s[d]) & _MASK
    s[b] = _rotl(s[b] ^ s[c], 7)


def chacha20_blocks(key: bytes, nonces: Any, counters: Any, xp: Any = np) -> Any:
    """The ChaCha20 block function (RFC 8439, section 2.3) for many blocks at once.

    ``nonces``: integer array ``(n, 3)`` of the nonce's three little-endian 32-bit words;
    ``counters``: ``(n,)`` block counters in ``[0, 2**32)``. Returns an ``(n, 16)`` int64 array of
    the keystream words (each in ``[0, 2**32)``, little-endian order within the block). All
    arithmetic is on int64 holding 32-bit values (masked), so numpy and torch (CPU or CUDA)
    compute the same integers.
    """
    kw = _key_words(key)
    if xp is np:
        ctr = np.asarray(counters, dtype=np.int64)
        non = np.asarray(nonces, dtype=np.int64)

        def const(v: int) -> Any:
            return np.full(ctr.shape, v, dtype=np.int64)
    else:
        ctr = counters.to(xp.int64)
        non = nonces.to(xp.int64)

        def const(v: int) -> Any:
            return xp.full(ctr.shape, v, dtype=xp.int64, device=ctr.device)

    init = [const(v) for v in _SIGMA] + [const(v) for v in kw]
    init += [ctr & _MASK, non[:, 0] & _MASK, non[:, 1] & _MASK, non[:, 2] & _MASK]
    s = list(init)
    for _ in range(10):
        _quarter(s, 0, 4, 8, 12)
        _quarter(s, 1, 5, 9, 13)
        _quarter(s, 2, 6, 10, 14)
        _quarter(s, 3, 7, 11, 15)
        _quarter(s, 0, 5, 10, 15)
        _quarter(s, 1, 6, 11, 12)
        _quarter(s, 2, 7, 8, 13)
        _quarter(s, 3, 4, 9, 14)
    out = [(a + b) & _MASK for a, b in zip(s, init, strict=True)]
    return xp.stack(out, axis=1) if xp is np else xp.stack(out, dim=1)
