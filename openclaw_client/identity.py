"""Ed25519 device identity and the signed connect payloads (v2, v3) of the gateway protocol.

Both sides use these functions, so the signing format exists exactly once:
the client signs with :func:`build_device_auth_payload`, the gateway verifies against the same string.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

RAW_PUBLIC_KEY_BYTES = 32


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
    raw = raw_public_key_from_text(public_key)
    if raw is None or len(raw) != RAW_PUBLIC_KEY_BYTES:
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
    if raw_signature is None:
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
