"""OpenClaw's own CLI reads this gateway's usage: ``openclaw gateway usage-cost`` (which calls ``usage.cost`` and
renders OpenClaw's summary of it) after a turn sent with ``openclaw gateway call chat.send``."""

from __future__ import annotations

import os
import subprocess
import tempfile

import pytest

from sessions_app.models import Run
from tests.e2e.test_openclaw_compat import NODE_BIN, OPENCLAW, openclaw_call

pytestmark = [pytest.mark.e2e, pytest.mark.openclaw_cli, pytest.mark.django_db(transaction=True)]


def openclaw_usage_cost(server, *args: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="openclaw-home-") as home:
        env = {
            **os.environ,
            "HOME": home,
            "PATH": f"{NODE_BIN}:{os.environ['PATH']}",
            "OPENCLAW_DISABLE_BONJOUR": "1",
            "OPENCLAW_NO_AUTO_UPDATE": "1",
            "DO_NOT_TRACK": "1",
        }
        return subprocess.run(
            ["node", str(OPENCLAW), "gateway", "usage-cost", "--url", server.url, "--token", server.token, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )


def test_openclaw_cli_renders_the_usage_cost_of_a_turn(gateway):
    code, ack, _ = openclaw_call(
        gateway,
        "chat.send",
        {"sessionKey": "main", "message": "Reply exactly: four words of usage", "idempotencyKey": "oc-usage-1"},
    )
    assert code == 0 and ack["status"] == "started"
    code, waited, _ = openclaw_call(gateway, "agent.wait", {"runId": "oc-usage-1", "timeoutMs": 20000})
    assert code == 0 and waited["status"] == "ok"
    usage = Run.objects.get(run_id="oc-usage-1").usage

    rendered = openclaw_usage_cost(gateway, "--all-agents", "--days", "1")

    assert rendered.returncode == 0, rendered.stderr
    lines = [line.strip() for line in rendered.stdout.splitlines() if line.strip()]
    tokens = usage["input"] + usage["output"]
    # The built-in echo model has no price here: no cost, and OpenClaw's own line counting the unpriced turn.
    assert lines == [
        "Usage cost (1 days)",
        f"Total: $0.0000 · {tokens} tokens",
        "Missing cost: 1",
        f"Latest day: {Run.objects.get(run_id='oc-usage-1').created_at:%Y-%m-%d} · $0.0000 · {tokens} tokens",
    ]
