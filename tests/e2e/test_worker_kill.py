"""A Celery worker killed with SIGKILL under load (docs/sessions-and-turns.md "Failure"): on PostgreSQL with Redis as
the broker, with RabbitMQ as the broker, and with beat killed at the same moment.

The killed worker holds a turn that has called the model (started) and one whose task it had taken but whose claim
had not committed (not started: the claim waits on a row lock the test holds); the same session's next turns wait
behind the started one, and a second worker serves other clients' turns, one of them waiting on the model at the
kill. Afterwards every turn has ended exactly once: the started one failed with the lease's reason, before the
heartbeat silence could have ended it; every other one ran on the second worker and succeeded, its user message
and its reply once in its transcript and the model called once for it.

How long after the kill each turn ended is printed (``-s``), not asserted: the machines are shared and noisy.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import kombu
import pytest
from channels.db import database_sync_to_async
from django.db import connection, connections, transaction
from django.utils import timezone

from sessions_app.models import Run, Session
from sessions_app.tasks import STALE_RUN_AFTER
from tests.e2e.test_cluster import RABBITMQ_URL, _reachable, _require
from tests.support.clients import operator
from tests.support.processes import (
    STOP_TIMEOUT_S,
    GatewayLaunch,
    GatewayServer,
    free_port,
    gateway_settings_for_tests,
    start_celery_beat,
    start_celery_worker,
    stop_and_remove,
)

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

STARTED = "agent:main:kill-started"
UNSTARTED = "agent:main:kill-unstarted"
LOAD_CLIENTS = 6
LOAD_TURNS = 3
# The messages that are not their run id: the turns held at the model.
PROMPTS = {"a1": "HOLD-STARTED a1", "l0.0": "HOLD-SURVIVOR l0.0"}
# With the default lease (5 s) and watch interval (1 s).
WORKER_STOPPED = "run interrupted: its worker process stopped (no lease renewal for 5 s)"


def model_env(mock) -> dict[str, str]:
    return {
        "OPENCLAW_MODEL_BASE_URL": mock.base_url,
        "OPENCLAW_MODEL_API_KEY": "sk-test",
        "OPENCLAW_MODEL": "mock-model",
    }


def label_of(pid: int) -> str:
    """The executor a worker process (threads pool) writes on the turns it claims."""
    return f"celery:{socket.gethostname()}:{pid}"


class RowShareLock:
    """``FOR SHARE`` on a row, held by a thread of the test on its own connection until released: a turn's claim
    (which updates the session's window) waits on it, while a send (which only references the window) does not."""

    def __init__(self, table: str, pk) -> None:
        self.table, self.pk = table, pk
        self.held, self.release = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._hold, daemon=True)

    def _hold(self) -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(f'SELECT 1 FROM "{self.table}" WHERE "id" = %s FOR SHARE', [self.pk])
                self.held.set()
                self.release.wait(120)
        finally:
            connections.close_all()

    def __enter__(self) -> RowShareLock:
        self.thread.start()
        assert self.held.wait(30), "the row lock was not taken"
        return self

    def __exit__(self, *exc_info) -> None:
        self.release.set()
        self.thread.join(30)


def backends_waiting_on_a_lock() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]


async def until(predicate, timeout: float = 60.0) -> None:
    async with asyncio.timeout(timeout):
        while not await database_sync_to_async(predicate)():
            await asyncio.sleep(0.05)


@dataclass
class Topology:
    """A gateway without a worker of its own, beat, and two Celery workers on its queue: the first is killed, the
    second (started later) survives."""

    launch: GatewayLaunch
    gateway: GatewayServer | None = None
    first: subprocess.Popen | None = None
    second: subprocess.Popen | None = None
    beat: subprocess.Popen | None = None

    @classmethod
    def start(cls, settings: dict[str, str]) -> Topology:
        port = free_port()
        base = gateway_settings_for_tests(port)
        # Its own cache (the workers' leases) and channel layer: the other gateways of this test worker (the shared
        # ``gateway`` fixture's) serve the same database, and their executor watch, seeing this topology's killed
        # worker's lease lapse in a shared cache, would recover its turns into their own queues and workers (another
        # model) — as a real cluster's gateways should, but this is not one cluster.
        isolated = {"OPENCLAW_REDIS_PREFIX": f"{base['OPENCLAW_REDIS_PREFIX']}-kill-{port}"}
        topology = cls(GatewayLaunch.prepare(settings={**base, **isolated, **settings}, port=port))
        launch = topology.launch
        # Together: each takes seconds to boot.
        with ThreadPoolExecutor(3) as pool:
            gateway = pool.submit(launch.start, worker=False, timeout=90)
            first = pool.submit(start_celery_worker, launch.env, launch.state_dir, concurrency=2, name="first")
            beat = pool.submit(start_celery_beat, launch.env, launch.state_dir)
        failures = [future.exception() for future in (gateway, first, beat) if future.exception() is not None]
        topology.gateway = None if gateway.exception() else gateway.result()
        topology.first = None if first.exception() else first.result()[0]
        topology.beat = None if beat.exception() else beat.result()[0]
        if failures:
            topology.stop()
            raise failures[0]
        return topology

    def start_second(self) -> None:
        self.second, _log = start_celery_worker(self.launch.env, self.launch.state_dir, concurrency=2, name="second")

    def stop(self) -> None:
        celery = [process for process in (self.first, self.second, self.beat) if process is not None]
        for process in celery:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in celery:
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        if self.gateway is not None:
            stop_and_remove([self.gateway])
        else:
            self.launch.remove_state()


def the_kill(variant: str, topology: Topology, mock) -> dict:
    """The scenario; returns what the test asserts on and prints."""

    async def scenario() -> dict:
        watcher, sender = operator(topology.gateway), operator(topology.gateway)
        await watcher.connect()
        await sender.connect()
        # A subscriber receives every run's chat events: each run's end is counted there.
        await watcher.request("sessions.subscribe", {})
        load_keys = [f"agent:main:kill-load-{i}" for i in range(LOAD_CLIENTS)]
        for key in (STARTED, UNSTARTED, *load_keys):
            await sender.request("sessions.create", {"key": key})
        mock.hold("HOLD-STARTED", "HOLD-SURVIVOR")

        async def send(key: str, run_id: str, text: str) -> None:
            await sender.request("chat.send", {"sessionKey": key, "message": text, "idempotencyKey": run_id})

        # On the first worker (alone so far): a turn that called the model and waits for its answer ...
        await send(STARTED, "a1", PROMPTS["a1"])
        await until(lambda: "HOLD-STARTED" in mock.held())
        window = await database_sync_to_async(lambda: Session.objects.get(key=UNSTARTED).session_id)()
        with RowShareLock("sessions_app_sessionwindow", window):
            # ... and one it took but has not started: its claim waits on the lock.
            await send(UNSTARTED, "b1", "b1")
            await until(lambda: backends_waiting_on_a_lock() >= 1)
            # Queued behind the started turn.
            await send(STARTED, "a2", "a2")
            await send(STARTED, "a3", "a3")
            await asyncio.to_thread(topology.start_second)

            async def client_load(index: int) -> list[str]:
                client = operator(topology.gateway)
                await client.connect()
                sent = []
                for turn in range(LOAD_TURNS):
                    run_id = f"l{index}.{turn}"
                    text = PROMPTS.get(run_id, run_id)
                    await client.request(
                        "chat.send", {"sessionKey": load_keys[index], "message": text, "idempotencyKey": run_id}
                    )
                    waited = await client.request("agent.wait", {"runId": run_id, "timeoutMs": 90_000}, timeout=95)
                    assert waited["status"] == "ok", waited
                    sent.append(run_id)
                await client.close()
                return sent

            load = [asyncio.create_task(client_load(i)) for i in range(LOAD_CLIENTS)]
            # Mid-load, the second worker has a turn waiting on the model too; then the kill.
            await until(lambda: "HOLD-SURVIVOR" in mock.held())
            if variant == "beat-killed":
                topology.beat.send_signal(signal.SIGKILL)
            killed_at = timezone.now()
            topology.first.send_signal(signal.SIGKILL)
        mock.release()
        load_runs = [run_id for sent in await asyncio.gather(*load) for run_id in sent]
        waited = {}
        for run_id in ("a1", "a2", "a3", "b1"):
            waited[run_id] = await watcher.request("agent.wait", {"runId": run_id, "timeoutMs": 90_000}, timeout=95)
        for run_id in load_runs:
            waited[run_id] = await watcher.request("agent.wait", {"runId": run_id, "timeoutMs": 30_000}, timeout=35)
        histories = {
            key: (await watcher.request("chat.history", {"sessionKey": key}))["messages"]
            for key in (STARTED, UNSTARTED, *load_keys)
        }
        ends = [
            frame["payload"]["runId"]
            for frame in watcher.drain_events()
            if frame["event"] == "chat" and frame["payload"]["state"] in ("final", "error", "aborted")
        ]
        await watcher.close()
        await sender.close()
        return {"killed_at": killed_at, "waited": waited, "histories": histories, "ends": ends, "load": load_runs}

    return asyncio.run(scenario())


def texts(messages: list[dict]) -> list[tuple[str, str]]:
    return [(m["role"], "".join(part.get("text", "") for part in m["content"])) for m in messages]


def model_calls_by_prompt(mock) -> dict[str, int]:
    """How many times the model was asked to answer each user message."""
    calls: dict[str, int] = {}
    for body in mock.snapshot()["requests"]:
        users = [m for m in body["messages"] if m["role"] == "user"]
        prompt = users[-1]["content"] if users else ""
        prompt = prompt if isinstance(prompt, str) else "".join(p.get("text", "") for p in prompt)
        calls[prompt] = calls.get(prompt, 0) + 1
    return calls


@pytest.mark.parametrize("variant", ["redis", "rabbitmq", "beat-killed"])
def test_a_killed_workers_started_turn_ends_at_once_and_the_others_run_on_another_worker(variant, mock_openai):
    settings = model_env(mock_openai)
    if variant == "rabbitmq":
        _require(_reachable("127.0.0.1", 5672), "RabbitMQ (127.0.0.1:5672)")
        settings["CELERY_BROKER_URL"] = RABBITMQ_URL
    topology = Topology.start(settings)
    try:
        outcome = the_kill(variant, topology, mock_openai)
        first_pid, second_pid = topology.first.pid, topology.second.pid
    finally:
        mock_openai.release()
        topology.stop()
        if variant == "rabbitmq":
            # The run's queue is durable on the broker: it would outlive the run.
            with kombu.Connection(RABBITMQ_URL) as broker:
                broker.default_channel.queue_delete(topology.launch.env["OPENCLAW_CELERY_QUEUE"])

    waited, histories, load_runs = outcome["waited"], outcome["histories"], outcome["load"]
    runs = {run.run_id: run for run in Run.objects.all()}
    every = ["a1", "a2", "a3", "b1", *load_runs]
    # Nothing lost, nothing run twice: every turn sent is a run that ended, and each ended once.
    assert sorted(runs) == sorted(every) and len(load_runs) == LOAD_CLIENTS * LOAD_TURNS
    assert sorted(outcome["ends"]) == sorted(every), outcome["ends"]

    # The turn that had called the model on the killed worker failed with the lease's reason, before the heartbeat
    # silence could have ended it.
    started = runs["a1"]
    assert (started.status, started.error, started.error_kind) == ("error", WORKER_STOPPED, "interrupted")
    assert waited["a1"]["status"] == "error" and waited["a1"]["error"] == WORKER_STOPPED
    assert started.executor == label_of(first_pid)
    assert started.ended_at - started.heartbeat_at < STALE_RUN_AFTER
    # Every other turn succeeded on the second worker: the one the killed worker had taken without starting it, the
    # ones queued behind the failed turn (in order, after it), and the load.
    for run_id in every[1:]:
        assert (runs[run_id].status, runs[run_id].executor) == ("ok", label_of(second_pid)), runs[run_id].__dict__
        assert waited[run_id]["status"] == "ok"
    assert started.ended_at <= runs["a2"].started_at <= runs["a2"].ended_at <= runs["a3"].started_at

    # One user message per turn, one reply per successful turn, none for the failed one; one model call per turn.
    assert texts(histories[STARTED]) == [
        ("user", "HOLD-STARTED a1"),
        ("user", "a2"),
        ("assistant", "a2"),
        ("user", "a3"),
        ("assistant", "a3"),
    ]
    assert texts(histories[UNSTARTED]) == [("user", "b1"), ("assistant", "b1")]
    for index in range(LOAD_CLIENTS):
        expected = []
        for turn in range(LOAD_TURNS):
            text = PROMPTS.get(f"l{index}.{turn}", f"l{index}.{turn}")
            expected += [("user", text), ("assistant", text)]
        assert texts(histories[f"agent:main:kill-load-{index}"]) == expected
    calls = model_calls_by_prompt(mock_openai)
    prompts = [PROMPTS.get(run_id, run_id) for run_id in every]
    assert {prompt: calls.get(prompt, 0) for prompt in prompts} == dict.fromkeys(prompts, 1)
    if variant == "beat-killed":
        assert topology.beat.returncode == -signal.SIGKILL

    killed_at = outcome["killed_at"]
    figures = ", ".join(
        f"{run_id} ended +{(runs[run_id].ended_at - killed_at).total_seconds():.1f} s" for run_id in ("a1", "b1")
    )
    print(
        f"\n[{variant}] kill → a1 (started, failed) and b1 (not started, re-run): {figures}; "
        f"b1 started +{(runs['b1'].started_at - killed_at).total_seconds():.1f} s; "
        f"a1 ended {(started.ended_at - started.heartbeat_at).total_seconds():.1f} s after its last heartbeat"
    )
