"""``/metrics`` of a running single-process gateway, scraped from loopback as Prometheus on the same host would."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from openclaw_client.client import ConnectError, GatewayError
from tests.support.clients import operator

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def scrape(gateway) -> dict:
    response = httpx.get(f"{gateway.http_url}/metrics", timeout=15)
    assert response.status_code == 200, response.text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(scraped: dict, name: str, **labels: str) -> float:
    return scraped.get((name, tuple(sorted(labels.items()))), 0.0)


def test_calls_connections_and_refused_handshakes_show_in_the_scrape(gateway):
    before = scrape(gateway)

    async def traffic():
        client = operator(gateway)
        await client.connect()
        for _ in range(3):
            await client.request("health", {})
        for name in ("made.up.one", "made.up.two"):
            with pytest.raises(GatewayError):
                await client.request(name, {})
        connected = await asyncio.to_thread(scrape, gateway)
        await client.close()
        with pytest.raises(ConnectError):
            await operator(gateway, token="not-the-token").connect()
        return connected

    connected = asyncio.run(traffic())
    after = scrape(gateway)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("openclaw_rpc_duration_seconds_count", method="health", outcome="ok") == 3
    assert moved("openclaw_rpc_duration_seconds_count", method="unknown", outcome="INVALID_REQUEST") == 2
    assert not any(labels and ("method", "made.up.one") in labels for _name, labels in after)
    assert moved("openclaw_rpc_duration_seconds_bucket", method="health", outcome="ok", le="+Inf") == 3
    assert value(connected, "openclaw_gateway_connections", role="operator") >= 1
    assert moved("openclaw_gateway_handshakes_total", result="ok") >= 1
    assert moved("openclaw_gateway_handshake_failures_total", reason="auth_token_mismatch") == 1
    assert moved("openclaw_auth_failures_total", reason="token_mismatch") == 1
    assert value(after, "openclaw_state_source_up", source="database") == 1
