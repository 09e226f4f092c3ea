"""A gateway with ``REDIS_URL`` and no Celery worker yet (the README's production variables): it says so at start, in
``health``, in ``/readyz`` (a warning, still 200), and a queued turn no worker takes fails after
``OPENCLAW_TURN_PICKUP_TIMEOUT_S`` with the reason that names the missing worker, through the usual end of a turn.
Once a worker starts, ``health`` says so and turns run."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import pytest

from gateway.task_consumers import worker_missing_message
from sessions_app.models import Run, TranscriptEvent
from sessions_app.services.runs import WORKER_MISSING
from tests.support.clients import operator
from tests.support.processes import start_celery_worker, start_gateway, stop_and_remove

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.django_db(transaction=True, databases="__all__")]

# Short, so that the test does not wait the default 90 s; the checks then refresh every second.
PICKUP_TIMEOUT_S = 2
NOTICE_WITHIN_S = 60.0


def readyz(server) -> tuple[int, dict]:
    with urllib.request.urlopen(f"{server.http_url}/readyz", timeout=15) as answer:
        return answer.status, json.loads(answer.read())


async def health_until(client, state: str) -> dict:
    deadline = time.monotonic() + NOTICE_WITHIN_S
    while True:
        health = await client.request("health", {})
        if health["taskQueue"]["state"] == state or time.monotonic() > deadline:
            return health
        await asyncio.sleep(0.5)


def logged_within(server, line: str) -> bool:
    deadline = time.monotonic() + NOTICE_WITHIN_S
    while line not in server.log():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_without_a_worker_the_gateway_says_so_and_a_queued_turn_fails_naming_the_missing_worker():
    server = start_gateway(extra_env={"OPENCLAW_TURN_PICKUP_TIMEOUT_S": str(PICKUP_TIMEOUT_S)}, worker=False)
    queue = server.env["OPENCLAW_CELERY_QUEUE"]
    try:

        async def without_a_worker():
            client = operator(server)
            await client.connect()
            await client.request("sessions.create", {"key": "agent:main:no-worker"})
            await client.request(
                "chat.send", {"sessionKey": "agent:main:no-worker", "message": "anyone there?", "idempotencyKey": "q1"}
            )
            waited = await client.request("agent.wait", {"runId": "q1", "timeoutMs": 60_000}, timeout=70)
            error_event = await client.next_event("chat", predicate=lambda f: f["payload"]["state"] == "error")
            health = await health_until(client, "no-consumer")
            history = await client.request("chat.history", {"sessionKey": "agent:main:no-worker"})
            await client.close()
            return waited, error_event, health, history

        waited, error_event, health, history = asyncio.run(without_a_worker())
        reason = worker_missing_message(queue)
        assert (waited["status"], waited["error"]) == ("error", reason), server.log()
        assert error_event["payload"]["runId"] == "q1"
        assert error_event["payload"]["errorMessage"] == reason
        run = Run.objects.get(run_id="q1")
        assert (run.status, run.error_kind, run.started_at) == ("error", WORKER_MISSING, None)
        assert run.session.status == "failed"
        # As with an aborted queued turn, only a turn that started wrote to the transcript.
        assert history["messages"] == [] and not TranscriptEvent.objects.filter(window_id=run.window_id).exists()
        assert health["ok"] is True
        assert health["taskQueue"] | {"checkedAtMs": None, "unconsumedSinceMs": None} == {
            "mode": "celery",
            "state": "no-consumer",
            "queue": queue,
            "consumers": 0,
            "checkedAtMs": None,
            "unconsumedSinceMs": None,
            "message": reason,
        }
        status, ready = readyz(server)
        assert status == 200 and ready["status"] == "ready"
        assert ready["checks"]["taskWorkers"]["state"] == "warning"
        assert ready["checks"]["taskWorkers"]["reason"] == reason
        assert f"turn q1 failed ({WORKER_MISSING}): {reason}" in server.log()
        # Logged by the first check that finds the queue unconsumed for the grace (here the 2 s pickup timeout).
        assert logged_within(server, f"WARNING gateway.task_consumers: {reason}")

        server.worker, server.worker_log_path = start_celery_worker(server.env, server.state_dir, concurrency=1)

        async def with_a_worker():
            client = operator(server)
            await client.connect()
            health = await health_until(client, "consumed")
            await client.request(
                "chat.send", {"sessionKey": "agent:main:no-worker", "message": "now?", "idempotencyKey": "q2"}
            )
            waited = await client.request("agent.wait", {"runId": "q2", "timeoutMs": 60_000}, timeout=70)
            await client.close()
            return health, waited

        health, waited = asyncio.run(with_a_worker())
        assert (health["taskQueue"]["state"], health["taskQueue"]["consumers"]) == ("consumed", 1), server.log()
        assert waited["status"] == "ok", server.worker_log()
        # The worker took the failed turn's task too, and its claim found the turn ended: it ran nothing.
        assert Run.objects.get(run_id="q1").status == "error"
        assert readyz(server)[1]["checks"]["taskWorkers"]["state"] == "ok"
    finally:
        stop_and_remove([server])
