"""``logs.tail`` against a real gateway process writing its own log file: its JSON lines name the process, the
connection's device and each call's frame id, and the cursor pages through what the process logs next."""

from __future__ import annotations

import asyncio
import json

import pytest

from openclaw_client.client import GatewayError
from tests.support.clients import operator

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SECRET = "params-secret-never-logged"


def test_a_gateway_process_tails_its_own_json_log(gateway_factory, tmp_path):
    log_file = tmp_path / "logs" / "gateway.log"
    server = gateway_factory(
        extra_env={
            "OPENCLAW_LOG_FILE": str(log_file),
            "OPENCLAW_LOG_FORMAT": "plain",
            "OPENCLAW_PROCESS_NAME": "gateway-e2e",
        }
    )

    async def scenario():
        client = operator(server)
        hello = await client.connect()
        refused = None
        try:
            await client.request("logs.tail", {"limit": 10, "token": SECRET})
        except GatewayError as error:
            refused = error
        first = await client.request("logs.tail", {"limit": 5000})
        second = await client.request("logs.tail", {"cursor": first["cursor"]})
        await client.close()
        return hello, refused, first, second

    hello, refused, first, second = asyncio.run(scenario())

    assert "logs.tail" in hello["features"]["methods"]
    assert refused is not None and "invalid logs.tail params" in str(refused)
    assert first["file"] == str(log_file) and first["size"] >= first["cursor"] > 0
    lines = [json.loads(line) for line in first["lines"]]
    access = [line for line in lines if line["logger"] == "openclaw.access.rpc"]
    assert [(line["method"], line["outcome"]) for line in access][-1] == ("logs.tail", "INVALID_REQUEST")
    assert {line["process"] for line in lines} == {"gateway-e2e"}
    assert access[-1]["device_id"] and access[-1]["request_id"]
    # The line of the first tail was written after it answered: the next page starts with it.
    page = [json.loads(line) for line in second["lines"]]
    assert [(line["method"], line["outcome"]) for line in page if line["logger"] == "openclaw.access.rpc"][:1] == [
        ("logs.tail", "ok")
    ]
    assert second["reset"] is False
    assert SECRET not in log_file.read_text(encoding="utf-8")
