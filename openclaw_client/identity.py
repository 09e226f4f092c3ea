"""Ed25519 device identity and the signed connect payloads (v2, v3) of the gateway protocol.

Both sides use these functions, so the signing format exists exactly once:
the client signs with :func:`build_device_auth_payload`, the gateway verifies against the same string.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

RAW_PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64

# --- Ed25519 encodings that verify but prove nothing ----------------------------------------------
# A verifier that takes any 32 bytes as a key accepts "devices" nobody holds a private key for: with
# a small-order public key (the all-zero key, the identity, …) the signature R = identity, S = 0
# verifies for every message. Keys and signatures are therefore checked here, with plain integer
# arithmetic on the curve (RFC 8032 §5.1), before `cryptography` verifies the signature itself.

_P = 2**255 - 19  # the field prime
_L = 2**252 + 27742317777372353535851937790883648493  # the order of the base point's group
_D = -121665 * pow(121666, _P - 2, _P) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)
_IDENTITY = (0, 1, 1, 0)  # extended coordinates (X, Y, Z, T)


def _decode_point(encoded: bytes) -> tuple[int, int, int, int] | None:
    """A canonical encoding's point in extended coordinates, or None (not canonical, not on the curve)."""
    if len(encoded) != 32:
        return None
    value = int.from_bytes(encoded, "little")
    sign, y = value >> 255, value & ((1 << 255) - 1)
    if y >= _P:
        return None  # y not reduced: a second encoding of a small y (e.g. of the identity)
    u, v = (y * y - 1) % _P, (_D * y * y + 1) % _P
    # x = sqrt(u/v) with one exponentiation, x = u·v³·(u·v⁷)^((p-5)/8) (RFC 8032 §5.1.3): every
    # handshake decodes its signature's R, and two exponentiations cost more than the verification.
    v3 = v * v * v % _P
    x = u * v3 * pow(u * v3 * v3 * v % _P, (_P - 5) // 8, _P) % _P
    vx2 = v * x * x % _P
    if vx2 != u:
        if vx2 != (-u) % _P:
            return None  # no x for this y
        x = x * _SQRT_M1 % _P
    if x == 0 and sign:
        return None  # "-0": a second encoding of the points with x = 0
    if x & 1 != sign:
        x = _P - x
    return (x, y, 1, x * y % _P)


def _add(p: tuple[int, int, int, int], q: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    # Unified addition on the twisted Edwards curve -x² + y² = 1 + d·x²·y² (RFC 8032 §5.1.4).
    x1, y1, z1, t1 = p
    x2, y2, z2, t2 = q
    a = (y1 - x1) * (y2 - x2) % _P
    b = (y1 + x1) * (y2 + x2) % _P
    c = 2 * _D * t1 * t2 % _P
    d = 2 * z1 * z2 % _P
    e, f, g, h = b - a, d - c, d + c, b + a
    return (e * f % _P, g * h % _P, f * g % _P, e * h % _P)


def _multiply(point: tuple[int, int, int, int], scalar: int) -> tuple[int, int, int, int]:
    result = _IDENTITY
    while scalar:
        if scalar & 1:
            result = _add(result, point)
        point = _add(point, point)
        scalar >>= 1
    return result


def _is_identity(point: tuple[int, int, int, int]) -> bool:
    x, y, z, _t = point
    return x % _P == 0 and (y - z) % _P == 0


def _has_small_order(point: tuple[int, int, int, int]) -> bool:
    """One of the 8 points of order 1, 2, 4 or 8: [8]P is the identity."""
    return _is_identity(_multiply(point, 8))


@functools.lru_cache(maxsize=4096)  # a device presents the same key on every connect; a check costs ~1.5 ms
def is_strong_public_key(raw: bytes) -> bool:
    """A canonical encoding of a point of the prime-order subgroup other than the identity.

    Refused: non-canonical encodings (y ≥ p, or x = 0 with the sign bit set), points not on the
    curve, the 8 small-order points, and points with a small-order component (no key made from a
    private key has one; they let one private key sign for several device ids).
    """
    point = _decode_point(raw)
    return point is not None and not _has_small_order(point) and _is_identity(_multiply(point, _L))


def is_canonical_signature(raw: bytes) -> bool:
    """R a canonical encoding of a point that is not of small order, and S reduced (S < L)."""
    if len(raw) != SIGNATURE_BYTES or int.from_bytes(raw[32:], "little") >= _L:
        return False
    r_point = _decode_point(raw[:32])
    return r_point is not None and not _has_small_order(r_point)


def b64url_encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64_decode_any(text: str) -> bytes | None:
    """Decode base64url or standard base64, with or without padding; None when it is neither."""
    cleaned = text.strip()
    if not cleaned:
        return None
    padded = cleaned + "=" * (-len(cleaned) % 4)
    try:
        if "-" in cleaned or "_" in cleaned:
            return base64.urlsafe_b64decode(padded)
        return base64.b64decode(padded, validate=True)
    except (binascii.Error, ValueError):
        return None


def raw_public_key_from_text(public_key: str) -> bytes | None:
    """The raw key bytes of a base64url/base64 or PEM public key, or None when unparseable.

    The length is not checked here: a caller that derives the device id hashes whatever
    decodes, and :func:`load_public_key` rejects keys that are not 32-byte Ed25519 keys.
    """
    text = public_key.strip()
    if text.startswith("-----BEGIN"):
        try:
            key = serialization.load_pem_public_key(text.encode("ascii"))
        except (ValueError, TypeError):
            return None
        if not isinstance(key, Ed25519PublicKey):
            return None
        return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return b64_decode_any(text)


def derive_device_id(public_key: str) -> str | None:
    raw = raw_public_key_from_text(public_key)
    if raw is None:
        return None
    return hashlib.sha256(raw).hexdigest()


def load_public_key(public_key: str) -> Ed25519PublicKey | None:
    """The device's Ed25519 key, or None when it is not one a private key stands behind."""
    raw = raw_public_key_from_text(public_key)
    if raw is None or len(raw) != RAW_PUBLIC_KEY_BYTES or not is_strong_public_key(raw):
        return None
    try:
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        return None


def normalize_public_key(public_key: str) -> str | None:
    key = load_public_key(public_key)
    if key is None:
        return None
    return b64url_encode(key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))


def _lower_ascii(value: str | None) -> str:
    return (value or "").strip().lower()


def build_device_auth_payload(
    *,
    version: str,
    device_id: str,
    client_id: str,
    client_mode: str,
    role: str,
    scopes: list[str],
    signed_at_ms: int,
    token: str | None,
    nonce: str,
    platform: str | None = None,
    device_family: str | None = None,
) -> str:
    """The exact string a device signs: ``v2|…|nonce`` or ``v3|…|nonce|platform|deviceFamily``."""
    fields = [
        version,
        device_id,
        client_id,
        client_mode,
        role,
        ",".join(scopes),
        str(signed_at_ms),
        token or "",
        nonce,
    ]
    if version == "v3":
        fields += [_lower_ascii(platform), _lower_ascii(device_family)]
    elif version != "v2":
        raise ValueError(f"unsupported device auth payload version: {version}")
    return "|".join(fields)


def verify_signature(public_key: Ed25519PublicKey, payload: str, signature: str) -> bool:
    raw_signature = b64_decode_any(signature)
    if raw_signature is None or not is_canonical_signature(raw_signature):
        return False
    try:
        public_key.verify(raw_signature, payload.encode("utf-8"))
    except InvalidSignature:
        return False
    return True


@dataclass
class DeviceIdentity:
    """A device's Ed25519 key pair; ``device_id`` is the SHA-256 hex of the raw public key."""

    private_key: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> DeviceIdentity:
        return cls(Ed25519PrivateKey.generate())

    @property
    def public_key_raw(self) -> bytes:
        return self.private_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    @property
    def public_key(self) -> str:
        return b64url_encode(self.public_key_raw)

    @property
    def device_id(self) -> str:
        return hashlib.sha256(self.public_key_raw).hexdigest()

    def sign(self, payload: str) -> str:
        return b64url_encode(self.private_key.sign(payload.encode("utf-8")))

    def private_key_pem(self) -> str:
        return self.private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode("ascii")

    @classmethod
    def from_private_key_pem(cls, pem: str) -> DeviceIdentity:
        key = serialization.load_pem_private_key(pem.encode("ascii"), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError("device identity key is not an Ed25519 private key")
        return cls(key)


class IdentityStore:
    """A device identity and its device tokens kept in a state directory.

    Layout: ``<dir>/identity/device.json`` (key pair) and ``<dir>/identity/device-auth.json``
    (device tokens by role). Files are written atomically with mode 0600.
    """

    def __init__(self, state_dir: str | os.PathLike[str]):
        self.root = Path(state_dir) / "identity"

    @property
    def _identity_path(self) -> Path:
        return self.root / "device.json"

    @property
    def _tokens_path(self) -> Path:
        return self.root / "device-auth.json"

    def _write_private(self, path: Path, data: dict) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2)
        os.replace(tmp, path)

    def load_or_create(self) -> DeviceIdentity:
        if self._identity_path.exists():
            data = json.loads(self._identity_path.read_text(encoding="utf-8"))
            return DeviceIdentity.from_private_key_pem(data["privateKeyPem"])
        identity = DeviceIdentity.generate()
        self._write_private(
            self._identity_path,
            {
                "version": 1,
                "deviceId": identity.device_id,
                "publicKey": identity.public_key,
                "privateKeyPem": identity.private_key_pem(),
            },
        )
        return identity

    def _tokens(self) -> dict:
        if not self._tokens_path.exists():
            return {}
        return json.loads(self._tokens_path.read_text(encoding="utf-8")).get("tokens", {})

    def device_token(self, role: str) -> str | None:
        entry = self._tokens().get(role)
        return entry.get("token") if entry else None

    def save_device_token(self, role: str, token: str, scopes: list[str]) -> None:
        tokens = self._tokens()
        tokens[role] = {"token": token, "scopes": list(scopes)}
        self._write_private(self._tokens_path, {"version": 1, "tokens": tokens})

    def forget_device_token(self, role: str) -> None:
        tokens = self._tokens()
        if tokens.pop(role, None) is not None:
            self._write_private(self._tokens_path, {"version": 1, "tokens": tokens})
