"""Device identity and the signed payload strings (vectors from OpenClaw's device-auth tests)."""

from __future__ import annotations

import hashlib

from openclaw_client.identity import (
    DeviceIdentity,
    IdentityStore,
    b64url_encode,
    build_device_auth_payload,
    derive_device_id,
    load_public_key,
    verify_signature,
)


def test_v3_payload_matches_the_reference_vector():
    payload = build_device_auth_payload(
        version="v3",
        device_id="dev-1",
        client_id="openclaw-macos",
        client_mode="ui",
        role="operator",
        scopes=["operator.admin", "operator.read"],
        signed_at_ms=1700000000000,
        token="tok-123",
        nonce="nonce-abc",
        platform="  IOS ",
        device_family="iPhone",
    )
    assert (
        payload
        == "v3|dev-1|openclaw-macos|ui|operator|operator.admin,operator.read|1700000000000|tok-123|nonce-abc|ios|iphone"
    )


def test_v2_payload_has_no_platform_fields_and_empty_token():
    payload = build_device_auth_payload(
        version="v2",
        device_id="d",
        client_id="cli",
        client_mode="cli",
        role="node",
        scopes=[],
        signed_at_ms=1,
        token=None,
        nonce="n",
    )
    assert payload == "v2|d|cli|cli|node||1||n"


def test_device_id_is_sha256_of_the_raw_public_key():
    identity = DeviceIdentity.generate()
    assert identity.device_id == hashlib.sha256(identity.public_key_raw).hexdigest()
    assert derive_device_id(identity.public_key) == identity.device_id
    # Standard base64 with padding names the same key.
    import base64

    assert derive_device_id(base64.b64encode(identity.public_key_raw).decode()) == identity.device_id


def test_signatures_verify_only_for_the_signed_payload():
    identity = DeviceIdentity.generate()
    key = load_public_key(identity.public_key)
    signature = identity.sign("v3|payload")
    assert verify_signature(key, "v3|payload", signature)
    assert not verify_signature(key, "v3|other", signature)
    assert not verify_signature(key, "v3|payload", "not base64 at all!")


def test_keys_that_are_not_32_bytes_are_invalid():
    assert load_public_key(b64url_encode(b"\x01" * 31)) is None
    assert load_public_key("") is None


def test_identity_store_keeps_the_key_and_tokens(tmp_path):
    store = IdentityStore(tmp_path)
    first = store.load_or_create()
    assert IdentityStore(tmp_path).load_or_create().device_id == first.device_id
    assert (tmp_path / "identity" / "device.json").stat().st_mode & 0o777 == 0o600
    store.save_device_token("node", "secret", [])
    assert IdentityStore(tmp_path).device_token("node") == "secret"
    store.forget_device_token("node")
    assert store.device_token("node") is None
