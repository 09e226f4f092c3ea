"""The brute-force limiter: 10 failures in 60 s lock a client address out for 5 minutes."""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest

from openclaw_client.client import ConnectError
from tests.support.clients import operator

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_ten_failures_lock_the_address_out_even_for_the_right_token(gateway_factory):
    server = gateway_factory(
        extra_env={
            "OPENCLAW_AUTH_RATE_LIMIT_EXEMPT_LOOPBACK": "0",
            # Its own limiter keys (other tests on this Redis never see them), under the run's prefix
            # so that the run's cleanup removes them too.
            "OPENCLAW_REDIS_PREFIX": f"{os.environ.get('OPENCLAW_REDIS_PREFIX', 'openclaw')}-rl-{uuid.uuid4().hex}",
        }
    )

    async def attempt(token):
        try:
            await operator(server, token=token).connect()
        except ConnectError as error:
            return error
        raise AssertionError("connect unexpectedly succeeded")

    async def scenario():
        failures = [await attempt("wrong") for _ in range(9)]
        tenth = await attempt("wrong")
        locked_out = await attempt(server.token)
        return failures, tenth, locked_out

    failures, tenth, locked_out = asyncio.run(scenario())
    assert {f.details["code"] for f in failures} == {"AUTH_TOKEN_MISMATCH"}
    for error in (tenth, locked_out):
        assert error.code == "INVALID_REQUEST"
        assert error.message == "unauthorized: too many failed authentication attempts (retry later)"
        assert error.details["code"] == "AUTH_RATE_LIMITED"
        assert error.details["recommendedNextStep"] == "wait_then_retry"
        assert error.retryable is True
        assert 0 < error.retry_after_ms <= 300_000
        assert error.close_code == 1008
    assert locked_out.retry_after_ms > 290_000


def test_loopback_is_exempt_by_default(gateway):
    async def scenario():
        for _ in range(12):
            with pytest.raises(ConnectError):
                await operator(gateway, token="wrong").connect()
        client = operator(gateway)
        hello = await client.connect()
        await client.close()
        return hello

    assert asyncio.run(scenario())["type"] == "hello-ok"
