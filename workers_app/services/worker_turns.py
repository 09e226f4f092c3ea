"""A turn of a session placed on a node: claimed and recorded here, run by a worker child on the node.

The gateway stays the transcript's owner: it claims the run (the user message joins the
transcript), hands the node the history with a token for the inference proxy (the model key never
leaves the gateway), streams the node's progress out as the run's ``chat``/``agent`` events, and
records the reply with the run's outcome. While it waits it heartbeats the run and polls its abort
flag; an abort reaches the node as ``worker.cancel.v1``.

How the node is asked is its dialect's: the project's node host streams a launch's progress back on the node
connection (:class:`NodeTurn`, here); OpenClaw's node host keeps a receipt while the project's worker on it reports
over HTTP (:class:`workers_app.nodes.openclaw.turns.OpenClawNodeTurn`). What the progress becomes is shared
(:mod:`workers_app.nodes.turn_watch`).

Failures keep the placement ``active`` (workers.md §5.1, §5.4): a node that is not connected fails
the turn before anything is sent (``runner-offline``), a full node after its capacity wait
(``WORKER_CAPACITY_EXHAUSTED``); either way the next turn may succeed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from django.db.models import QuerySet, Subquery

from approvals_app.selectors import effective_exec_policy
from gateway import log_context, publisher
from gateway.background import executor_label
from gateway.invoke import InvokeTarget, invoke_private
from openclaw_client.agent.loop import Approval
from sessions_app import turns as gateway_turns
from sessions_app.events import TurnEmitter
from sessions_app.model_providers import default_model, get_model_provider
from sessions_app.services import runs

from ..inference import INFERENCE_PATH, inference_token
from ..models import Placement, PlacementState, WorkerEnvironment
from ..nodes.calls import PROTOCOL_VERSION, NodeCommandFailed, release_database_connections
from ..nodes.openclaw.turns import OpenClawNodeTurn, turn_speaks_openclaw
from ..nodes.turn_lookups import node_turn_place
from ..nodes.turn_watch import POLL_INTERVAL_S, WatchedNodeTurn, agent_settings, offline_outcome, turn_timeout_ms

logger = logging.getLogger(__name__)

CANCEL_TIMEOUT_MS = 10_000
APPROVAL_DELIVERY_TIMEOUT_MS = 10_000


def placed_node(session_pk: int) -> tuple[str, WorkerEnvironment] | None:
    """The node and environment a session's turns run on, if its placement is active on a node (one
    query: every turn of every session asks, at ``chat.send``)."""
    return _node_of(Placement.objects.filter(pk=session_pk, state=PlacementState.ACTIVE))


def _node_of(active_placement: QuerySet[Placement]) -> tuple[str, WorkerEnvironment] | None:
    environment_id = active_placement.values("environment_id")[:1]
    # Only what a turn uses: the environment's row is wide (its profile snapshot), read on every turn.
    environment = (
        WorkerEnvironment.objects.filter(pk=Subquery(environment_id))
        .only("environment_id", "node_device_id", "lease_id", "attached_session_ids", "bootstrap_bundle_hash")
        .first()
    )
    if environment is None or not environment.node_device_id:
        return None
    return environment.node_device_id, environment


def execute_worker_turn(run_id: str) -> str | None:
    """Run the turn on the session's node (or here, if the session came back meanwhile)."""
    # Every line of the turn names it, and its session once claimed; both are put back when it ends.
    with log_context.bound(run_id=run_id, session_key=None):
        return _execute_worker_turn(run_id)


def _execute_worker_turn(run_id: str) -> str | None:
    place = node_turn_place(run_id)  # with the node's connection: one query on the turn's path, not two
    if place is None:
        return gateway_turns.execute_turn(run_id)
    claim = runs.run_claim(run_id=run_id, executor=executor_label())
    if claim is None:
        return None
    run, session = claim.run, claim.session
    log_context.bind(session_key=session.key)
    emitter = TurnEmitter(run, session)
    model = session.model or default_model()
    provider_name = _provider_name()
    if place.route is None:
        emitter.start(int(run.started_at.timestamp() * 1000))
        outcome = offline_outcome(provider_name, model)
    else:
        target = InvokeTarget(place.route.channel_name, place.route.conn_id, place.route.commands)
        # The node's dialect: OpenClaw's node host keeps a receipt of the launch, and the worker reports over HTTP.
        dialect = OpenClawNodeTurn if turn_speaks_openclaw(place) else NodeTurn
        outcome = dialect(
            run,
            target,
            place,
            claim.history,
            model,
            provider_name,
            emitter,
            agent_id=session.agent_id,
            session_key=session.key,
        ).run()
        if outcome is None:
            return None  # swept as dead meanwhile; its outcome is already recorded
    finished = runs.run_finish(run_id=run_id, outcome=outcome, emitter=emitter)
    return finished.status if finished is not None else None


def _provider_name() -> str:
    try:
        return get_model_provider().name
    except Exception:
        return ""


class NodeTurn(WatchedNodeTurn):
    """A turn on the project's node host: ``worker.launch.v1`` streams its progress and ends with its result;
    exec questions are answered through ``worker.approval.v1``."""

    exec_policy: dict[str, Any] | None = None

    def _prepare(self) -> None:
        self.exec_policy = effective_exec_policy(self.agent_id, self.node_id).snapshot()

    def launch_params(self) -> dict[str, Any]:
        return {
            "version": PROTOCOL_VERSION,
            "environmentId": self.place.environment_id,
            "leaseId": self.place.lease_id,
            "sessionId": self.place.session_id,
            "runId": self.run_id,
            "bundleHash": self.place.bundle_hash,
            "model": self.model,
            "messages": self.history,
            "inference": {"path": INFERENCE_PATH, "token": inference_token(self.run_id, self.node_id)},
            "timeoutMs": turn_timeout_ms(),
            "agent": {
                **agent_settings(self.agent_id),
                # What the node may decide on its own: a command the policy allows or denies outright runs (or
                # is refused) there at once; one it asks about is put to the gateway (the exec gate).
                "execPolicy": self.exec_policy,
            },
        }

    async def _launch(self) -> Any:
        """On the channel layer's loop: the launch, and a cancel once this thread asks for one."""

        async def on_progress(data: dict[str, Any]) -> None:
            self.progress.put(data)

        launch = asyncio.ensure_future(
            invoke_private(
                self.node_id,
                "worker.launch.v1",
                self.launch_params(),
                timeout_ms=turn_timeout_ms(),
                on_progress=on_progress,
                target=self.target,
            )
        )
        cancel_sent = False
        while not launch.done():
            await asyncio.wait({launch}, timeout=POLL_INTERVAL_S)
            if self.cancel.is_set() and not cancel_sent and not launch.done():
                cancel_sent = True
                try:
                    await invoke_private(
                        self.node_id,
                        "worker.cancel.v1",
                        {"version": PROTOCOL_VERSION, "runId": self.run_id},
                        timeout_ms=CANCEL_TIMEOUT_MS,
                        target=self.target,
                    )
                except NodeCommandFailed as failure:
                    logger.warning("cancel of run %s on node %s failed: %s", self.run_id, self.node_id, failure)
        return launch.result()

    def _deliver_decision(self, call_id: str, decision: Approval, question: dict[str, Any]) -> None:
        params = {
            "version": PROTOCOL_VERSION,
            "runId": self.run_id,
            "toolCallId": call_id,
            "allowed": decision.allowed,
            "aborted": decision.aborted,
            "reason": decision.reason,
        }

        async def deliver() -> Any:
            return await invoke_private(
                self.node_id,
                "worker.approval.v1",
                params,
                timeout_ms=APPROVAL_DELIVERY_TIMEOUT_MS,
                target=self.target,
            )

        release_database_connections()  # the node is waited for without a database connection
        try:
            publisher.submit(deliver).result(APPROVAL_DELIVERY_TIMEOUT_MS / 1000 + 5)
        except NodeCommandFailed as failure:
            # The launch ends on its own (the node went away, or the run ended meanwhile).
            logger.warning("exec decision for run %s could not reach node %s: %s", self.run_id, self.node_id, failure)
