"""Events of sessions_app, built server-side; everything that follows a write goes out after commit.

* ``sessions.changed`` — to connections that called ``sessions.subscribe``.
* ``chat`` / ``agent`` — the turn's stream, to the connection that sent the turn and to
  ``sessions.subscribe`` subscribers; each run numbers its own ``chat`` and ``agent`` payloads
  (``payload.seq``).
* ``session.tool`` — each ``agent`` event of stream ``tool`` again, with the session's fields, to the session's
  message subscribers (``message_subscriptions.py``).
* ``sessions.run_finished`` — wakes ``agent.wait`` callers with the run's terminal answer: a
  process-level notification for every gateway process, and a follow-up on the run's terminal
  ``chat`` event for each connection that receives it (so its answer never overtakes that event).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from django.db import transaction

from gateway import background, publisher, state
from gateway import scopes as sc
from gateway.events import (
    PublicationBatch,
    publish_on_commit,
    publish_rollback_unsafe,
    publish_to_subscription_rollback_unsafe,
    send_direct_rollback_unsafe,
)
from gateway.registry import registry

from .message_subscriptions import EVENT_SESSION_TOOL, messages_subscription, session_snapshot_fields
from .models import Run, Session
from .selectors import run_wait_payload

logger = logging.getLogger(__name__)

EVENT_SESSIONS_CHANGED = registry.event("sessions.changed", scope=sc.READ, subscription="sessions")
# The turn's stream goes to the connection that sent it and to sessions.subscribe subscribers.
EVENT_CHAT = registry.event("chat", scope=sc.READ, subscription="sessions")
EVENT_AGENT = registry.event("agent", scope=sc.READ, subscription="sessions")

RUN_FINISHED = "sessions.run_finished"


def _ms(value) -> int | None:
    return int(value.timestamp() * 1000) if value else None


def session_event_fields(session: Session) -> dict[str, Any]:
    return {
        "sessionKey": session.key,
        "agentId": session.agent_id,
        "sessionId": session.session_id,
        "lifecycleRevision": session.lifecycle_revision,
        "revision": session.revision,
        "updatedAt": _ms(session.updated_at),
        "label": session.label or None,
        "displayName": session.display_name or None,
        "archived": session.archived_at is not None,
        "pinned": session.pinned_at is not None,
        "status": session.status or None,
        "model": session.model or None,
        "initializationPending": session.initialization_pending,
    }


def publish_session_changed_on_commit(
    session: Session, *, reason: str, phase: str | None = None, run_id: str | None = None, deleted: bool = False
) -> None:
    payload = {**session_event_fields(session), "reason": reason, "ts": int(time.time() * 1000)}
    if phase is not None:
        payload["phase"] = phase
    if run_id is not None:
        payload["runId"] = run_id
    if deleted:
        payload["deleted"] = True
    publish_on_commit(EVENT_SESSIONS_CHANGED, payload, drop_if_slow=True)


def publish_session_changed_payload_on_commit(session: Session, *, reason: str, extra: dict[str, Any]) -> None:
    """``sessions.changed`` carrying fields an extension contributes (say, ``placement``)."""
    payload = {**session_event_fields(session), "reason": reason, "ts": int(time.time() * 1000), **extra}
    publish_on_commit(EVENT_SESSIONS_CHANGED, payload, drop_if_slow=True)


# --- the turn's stream and its end ----------------------------------------------------------


def run_finished_notification(run: Run) -> dict[str, Any]:
    """What wakes ``agent.wait``: its answer, built from the outcome that just committed (a terminal
    run never changes again), so a woken waiter answers without reading the run back."""
    return {"type": RUN_FINISHED, "runId": run.run_id, "result": run_wait_payload(run)}


def notify_run_finished(run: Run, batch: PublicationBatch) -> None:
    """Wake ``agent.wait`` callers in every gateway process, after the run's events (same batch).

    A waiter on a connection that receives the run's events answers only once that connection sent
    the terminal ``chat`` event (its follow-up, ``waiters.py``); this notification wakes the others.
    A lost wake-up only delays agent.wait (it re-reads on a slow timer)."""
    batch.group_send(state.PROCESS_GROUP, {**run_finished_notification(run), "originChannel": run.origin_channel})


# At most one delta event per run this often (OpenClaw throttles chat deltas to 150 ms): every
# operator connection receives every turn's stream, so per-token events would flood them.
DELTA_INTERVAL_S = 0.15


class TurnEmitter:
    """The ``chat``/``agent`` events of one run, each stream with its own ``seq``.

    Text chunks are coalesced: the first goes out at once, later ones at most every 150 ms, and
    whatever is buffered goes out before the terminal events.
    """

    def __init__(self, run: Run, session: Session):
        self.run_id = run.run_id
        self.session_key = session.key
        self.session_id = run.window_id
        self.agent_id = session.agent_id
        self.chat_seq = 0
        self.agent_seq = 0
        # The chunks not sent yet, joined when they go out: a reply may come as 100,000 one-word chunks, and
        # joining (or `+=` on an attribute) per chunk would copy the text so far each time.
        self.pending: list[str] = []
        self.text = ""
        self.emitted_at: float | None = None  # None: nothing emitted yet (the first chunk goes at once)
        self.origin_channel = run.origin_channel
        # session.tool: each tool event also goes to the session's message subscribers, with the session's fields.
        self.messages_subscription = messages_subscription(session.key)
        self.session_fields = session_snapshot_fields(session)
        # Set while the run's end is published: its events and notification go out as one batch.
        self.batch: PublicationBatch | None = None

    def _publish(
        self, event: str, payload: dict[str, Any], *, drop_if_slow: bool = False, follow_up: dict | None = None
    ) -> None:
        if self.batch is not None:
            self.batch.publish(event, payload, drop_if_slow=drop_if_slow, follow_up=follow_up)
            if self.origin_channel:
                self.batch.send_direct(
                    self.origin_channel, event, payload, drop_if_slow=drop_if_slow, follow_up=follow_up
                )
            return
        publish_rollback_unsafe(event, payload, drop_if_slow=drop_if_slow, follow_up=follow_up)
        if self.origin_channel:
            send_direct_rollback_unsafe(
                self.origin_channel, event, payload, drop_if_slow=drop_if_slow, follow_up=follow_up
            )

    def _chat(self, state: str, *, follow_up: dict | None = None, **fields: Any) -> None:
        self.chat_seq += 1
        payload = {
            "runId": self.run_id,
            "sessionKey": self.session_key,
            "agentId": self.agent_id,
            "seq": self.chat_seq,
            "state": state,
            **fields,
        }
        # As in OpenClaw, a slow connection may miss deltas (the final carries the whole text) but
        # not the terminal states.
        self._publish(EVENT_CHAT, payload, drop_if_slow=state == "delta", follow_up=follow_up)

    def _agent(self, stream: str, data: dict[str, Any]) -> None:
        self.agent_seq += 1
        payload = {
            "runId": self.run_id,
            "sessionKey": self.session_key,
            "sessionId": self.session_id,
            "agentId": self.agent_id,
            "stream": stream,
            "data": data,
            "seq": self.agent_seq,
            "ts": int(time.time() * 1000),
            "isHeartbeat": False,
        }
        self._publish(EVENT_AGENT, payload)
        if stream == "tool":
            self._publish_session_tool({**payload, **self.session_fields})

    def _publish_session_tool(self, payload: dict[str, Any]) -> None:
        if self.batch is not None:
            self.batch.publish_to_subscription(self.messages_subscription, EVENT_SESSION_TOOL, payload)
        else:
            publish_to_subscription_rollback_unsafe(self.messages_subscription, EVENT_SESSION_TOOL, payload)

    @staticmethod
    def _message(text: str) -> dict[str, Any]:
        return {"role": "assistant", "content": [{"type": "text", "text": text}], "timestamp": int(time.time() * 1000)}

    def start(self, started_at_ms: int) -> None:
        self._agent("lifecycle", {"phase": "start", "startedAt": started_at_ms})

    def delta(self, delta: str) -> None:
        """The next chunk of the current assistant message's text."""
        self.pending.append(delta)
        if self.emitted_at is None or time.monotonic() - self.emitted_at >= DELTA_INTERVAL_S:
            self.flush()

    def flush(self) -> None:
        pending = "".join(self.pending)
        if not pending:
            return
        self.text += pending
        self._agent("assistant", {"text": self.text, "delta": pending})
        self._chat("delta", deltaText=pending, message=self._message(self.text))
        self.pending = []
        self.emitted_at = time.monotonic()

    def new_message(self) -> None:
        """A new model step starts: what streams from now on is a new assistant message."""
        self.flush()
        self.text = ""

    def tool_started(self, call_id: str, name: str, arguments: dict[str, Any]) -> None:
        self.flush()
        self._agent("tool", {"phase": "start", "name": name, "toolCallId": call_id, "args": bounded(arguments)})

    def tool_finished(self, call_id: str, name: str, message: dict[str, Any]) -> None:
        """The ``result`` phase, with the stored tool result (bounded: the transcript has it whole)."""
        details = message.get("details") or {}
        self._agent(
            "tool",
            {
                "phase": "result",
                "name": name,
                "toolCallId": call_id,
                "isError": bool(message.get("isError")),
                "result": {"content": bounded(message.get("content", [])), "details": details},
                "meta": tool_meta(details),
            },
        )

    def command_reply(self, run: Run, message: dict[str, Any]) -> None:
        """A command's end (sessions_app/commands.py): no model turn, so no ``agent`` events; the reply is the
        message of the run's one ``chat`` event, as OpenClaw's gateway answers its commands."""
        self._chat("final", follow_up=run_finished_notification(run), stopReason="stop", message=message)

    def end(self, run: Run) -> None:
        """The terminal events; the ``chat`` one carries the run-finished notification as a follow-up."""
        self.flush()
        ended_at = _ms(run.ended_at)
        finished = run_finished_notification(run)
        if run.status == "ok":
            self._agent("lifecycle", {"phase": "end", "endedAt": ended_at, "stopReason": run.stop_reason or "stop"})
            fields: dict[str, Any] = {
                "stopReason": run.stop_reason or "stop",
                "message": self._message(run.output_text),
            }
            if run.usage:
                fields["usage"] = run.usage
            self._chat("final", follow_up=finished, **fields)
        elif run.status == "aborted":
            self._agent("lifecycle", {"phase": "end", "endedAt": ended_at, "aborted": True, "stopReason": "aborted"})
            fields = {"stopReason": "aborted"}
            if run.output_text:
                fields["message"] = self._message(run.output_text)
            self._chat("aborted", follow_up=finished, **fields)
        else:
            self._agent("lifecycle", {"phase": "error", "endedAt": ended_at, "error": run.error})
            self._chat("error", follow_up=finished, errorMessage=run.error, errorKind=_error_kind(run.error_kind))


# A tool event carries at most this much of a tool's arguments or output: every operator connection receives
# every turn's events, and the transcript (chat.history) has the whole of both.
EVENT_TEXT_LIMIT = 8 * 1024


def bounded(value: Any) -> Any:
    """``value`` with every string cut to :data:`EVENT_TEXT_LIMIT` characters (marked), for an event."""
    if isinstance(value, str):
        return value if len(value) <= EVENT_TEXT_LIMIT else value[:EVENT_TEXT_LIMIT] + "…(truncated)"
    if isinstance(value, dict):
        return {key: bounded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [bounded(item) for item in value]
    return value


def tool_meta(details: dict[str, Any]) -> str | None:
    """A one-line summary of a tool's outcome for compact displays (``exit 0 · 12 ms``)."""
    parts = []
    if "exitCode" in details:
        parts.append(f"exit {details['exitCode']}")
    if details.get("timedOut"):
        parts.append("timed out")
    if isinstance(details.get("durationMs"), int):
        parts.append(f"{details['durationMs']} ms")
    return " · ".join(parts) or None


def _error_kind(kind: str) -> str:
    return kind if kind in ("refusal", "timeout", "rate_limit", "context_length") else "unknown"


def publish_turn_end_on_commit(run: Run, session: Session, emitter: TurnEmitter | None = None) -> None:
    """Terminal chat/agent events and the wake-up of agent.wait, once the outcome is durable."""
    emitter = emitter or TurnEmitter(run, session)
    _publish_end_on_commit(run, emitter, lambda: emitter.end(run))


def publish_command_reply_on_commit(run: Run, session: Session, message: dict[str, Any]) -> None:
    """A command's reply (its run's ``chat`` final) and the wake-up of agent.wait, once both are durable."""
    emitter = TurnEmitter(run, session)
    _publish_end_on_commit(run, emitter, lambda: emitter.command_reply(run, message))


def _publish_end_on_commit(run: Run, emitter: TurnEmitter, emit_end: Callable[[], None]) -> None:
    def publish() -> None:
        # The buffered text, the terminal events and the notification: one batch, in that order.
        emitter.batch = batch = PublicationBatch()
        try:
            emit_end()
            notify_run_finished(run, batch)
        finally:
            emitter.batch = None
        sent = batch.post(what=f"end of run {run.run_id}")
        # Waits until it went out, so that a task's end (a Celery worker may stop after it) does not
        # outrun the turn's events; without a database connection (the run's outcome is committed).
        background.release_database_connections()
        with contextlib.suppress(Exception):  # logged by the publisher
            sent.result(publisher.PUBLISH_TIMEOUT_S)

    transaction.on_commit(publish)
