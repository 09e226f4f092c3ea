"""Ed25519 keys and signatures that verify without proving anything are refused.

A public key of small order (the identity, the all-zero encoding, …) has no private key behind it:
a signature with R a small-order point and S = 0 verifies for many messages under a plain verifier
(``cryptography`` alone accepts them, as these tests show first), so anyone could claim the device.
"""

from __future__ import annotations

import itertools

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from openclaw_client import identity as identity_module
from openclaw_client.identity import (
    DeviceIdentity,
    b64url_encode,
    is_canonical_signature,
    is_strong_public_key,
    load_public_key,
    verify_signature,
)

L = 2**252 + 27742317777372353535851937790883648493
P = 2**255 - 19

# The 8 points of order 1, 2, 4 and 8, canonically encoded (libsodium's blocklist, sign bits included).
SMALL_ORDER = [
    "0100000000000000000000000000000000000000000000000000000000000000",  # identity (order 1)
    "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",  # y = p-1 (order 2)
    "0000000000000000000000000000000000000000000000000000000000000000",  # y = 0 (order 4), all zero
    "0000000000000000000000000000000000000000000000000000000000000080",  # y = 0, other x (order 4)
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",  # order 8
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85",  # order 8
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",  # order 8
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",  # order 8
]


def _encode_y(y: int, sign: int = 0) -> bytes:
    return (y | (sign << 255)).to_bytes(32, "little")


# Other encodings of the same small-order points: y not reduced (y ≥ p) and "-0" (x = 0 with the
# sign bit set).
NON_CANONICAL = [
    _encode_y(P),  # y = p ≡ 0
    _encode_y(P, 1),
    _encode_y(P + 1),  # y = p + 1 ≡ 1: the identity again
    _encode_y(P + 1, 1),
    _encode_y(1, 1),  # the identity with the sign bit set
    _encode_y(P - 1, 1),  # the order-2 point with the sign bit set
]


def _b64(raw: bytes) -> str:
    return b64url_encode(raw)


def _forged_signature(public_key: bytes, messages) -> tuple[str, bytes] | None:
    """(message, signature) with R a small-order point and S = 0 that ``cryptography`` accepts for this key."""
    key = Ed25519PublicKey.from_public_bytes(public_key)
    for message in messages:
        for r in SMALL_ORDER:
            signature = bytes.fromhex(r) + bytes(32)
            try:
                key.verify(signature, message.encode())
            except InvalidSignature:
                continue
            return message, signature
    return None


@pytest.mark.parametrize("encoded", SMALL_ORDER)
def test_small_order_public_keys_are_refused(encoded):
    raw = bytes.fromhex(encoded)
    assert not is_strong_public_key(raw)
    assert load_public_key(_b64(raw)) is None


@pytest.mark.parametrize("raw", NON_CANONICAL, ids=lambda raw: raw.hex()[-4:])
def test_non_canonical_public_keys_are_refused(raw):
    assert not is_strong_public_key(raw)
    assert load_public_key(_b64(raw)) is None


def test_a_key_with_a_small_order_component_is_refused():
    # A real key plus a point of order 2: still on the curve, not in the prime-order subgroup. It lets
    # one private key sign for a second device id.
    identity = DeviceIdentity.generate()
    point = identity_module._decode_point(identity.public_key_raw)
    order_two = identity_module._decode_point(bytes.fromhex(SMALL_ORDER[1]))
    x, y, z, _t = identity_module._add(point, order_two)
    zi = pow(z, P - 2, P)
    x, y = x * zi % P, y * zi % P
    mixed = (y | ((x & 1) << 255)).to_bytes(32, "little")
    assert mixed != identity.public_key_raw
    assert not is_strong_public_key(mixed)


def test_real_keys_and_signatures_pass():
    for _ in range(5):
        identity = DeviceIdentity.generate()
        key = load_public_key(identity.public_key)
        assert key is not None
        signature = identity.sign("v3|payload")
        assert verify_signature(key, "v3|payload", signature)
        assert not verify_signature(key, "v3|other payload", signature)


def test_forged_signatures_that_a_plain_verifier_accepts_are_refused():
    messages = (f"v3|dev|cli|cli|operator||{n}|tok|nonce|linux|" for n in itertools.count())
    for encoded in SMALL_ORDER:
        raw = bytes.fromhex(encoded)
        forged = _forged_signature(raw, itertools.islice(messages, 64))
        assert forged is not None, f"no forgery found for {encoded}"
        message, signature = forged
        # The hole: cryptography (OpenSSL) takes the key and the signature.
        Ed25519PublicKey.from_public_bytes(raw).verify(signature, message.encode())
        # Closed twice: the key is refused, and so is a signature whose R has small order.
        assert load_public_key(_b64(raw)) is None
        assert not is_canonical_signature(signature)


def test_signatures_with_s_not_reduced_are_refused():
    identity = DeviceIdentity.generate()
    key = load_public_key(identity.public_key)
    raw = identity.private_key.sign(b"payload")
    s = int.from_bytes(raw[32:], "little")
    unreduced = raw[:32] + (s + L).to_bytes(32, "little")
    assert is_canonical_signature(raw)
    assert not is_canonical_signature(unreduced)
    assert not verify_signature(key, "payload", _b64(unreduced))
    # S = L exactly (≡ 0) and the largest 32-byte S.
    assert not is_canonical_signature(raw[:32] + L.to_bytes(32, "little"))
    assert not is_canonical_signature(raw[:32] + b"\xff" * 32)


def test_signatures_with_a_non_canonical_r_are_refused():
    identity = DeviceIdentity.generate()
    key = load_public_key(identity.public_key)
    raw = identity.private_key.sign(b"payload")
    for r in NON_CANONICAL:
        assert not is_canonical_signature(r + raw[32:])
    # An R that is not on the curve at all: y = 2 has no x.
    assert not is_canonical_signature(_encode_y(2) + raw[32:])
    assert not verify_signature(key, "payload", _b64(NON_CANONICAL[0] + raw[32:]))
