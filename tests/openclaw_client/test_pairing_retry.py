"""Which refusals the client retries on its short pairing schedule (1 s growing to 5 s) rather than its 30 s
backoff: only the gateway's "pairing required" that did not ask it to pause."""

from __future__ import annotations

import pytest

from openclaw_client.client import ConnectError, awaits_pairing


def refusal(error_code: str, **details) -> ConnectError:
    return ConnectError({"code": error_code, "message": "refused", "details": details or None}, close_code=1008)


def test_a_pending_pairing_is_waited_for_on_the_short_schedule():
    assert awaits_pairing(refusal("NOT_PAIRED", code="PAIRING_REQUIRED", reason="not-paired", pauseReconnect=False))
    assert awaits_pairing(refusal("NOT_PAIRED", code="PAIRING_REQUIRED", reason="role-upgrade"))


@pytest.mark.parametrize(
    "error",
    [
        refusal("NOT_PAIRED", code="PAIRING_REQUIRED", pauseReconnect=True),  # the gateway asked it to stop
        refusal("NOT_PAIRED", code="DEVICE_IDENTITY_REQUIRED"),
        refusal("NOT_PAIRED"),
        refusal("INVALID_REQUEST", code="PAIRING_REQUIRED"),  # not the pairing refusal's error code
        refusal("INVALID_REQUEST", code="AUTH_RATE_LIMITED"),
        refusal("UNAVAILABLE"),
    ],
)
def test_other_refusals_keep_the_long_backoff(error):
    assert not awaits_pairing(error)
