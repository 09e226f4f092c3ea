"""Per-session message streams: ``sessions.messages.subscribe`` / ``unsubscribe`` and the events they bring.

A connection may hold the subscription of several sessions; each is a keyed subscription of the gateway core
(``gateway.events.keyed_subscription``: a channel-layer group per session key that the connection's channel
joins, left when it unsubscribes or closes). The events go out after commit like every other
(``gateway.events``), to that group only:

* ``session.message`` — each message appended to the session's transcript (the user's, the assistant's, tool
  results, command replies), in OpenClaw's shape: ``{sessionKey, agentId, message, messageId, messageSeq,
  runId?}`` and the session's event fields (``sessionId``, ``updatedAt``, ``status`` …). ``message`` is the
  message as ``chat.history`` shows it (with ``__openclaw {id, seq}``).
* ``session.tool`` — a tool call's start and result, the ``agent`` event of stream ``tool`` with the session's
  event fields, as OpenClaw sends it.
* ``session.approval`` — (``includeApprovals``) an exec approval of the session requested or settled
  (approvals_app/session_events.py publishes it to the session's approvals subscription).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from approvals_app.session_events import session_approvals_subscription
from gateway import scopes as sc
from gateway.context import RpcContext
from gateway.events import keyed_subscription, publish_to_subscription_rollback_unsafe
from gateway.exceptions import InvalidRequest
from gateway.registry import registry

from .models import Session, TranscriptEvent

# Who holds which keyed subscription is decided by the subscribe call; the spec names the family for hello-ok
# and the scope a receiver needs.
MESSAGES_FAMILY = "session.messages"
EVENT_SESSION_MESSAGE = registry.event("session.message", scope=sc.READ, subscription=MESSAGES_FAMILY)
EVENT_SESSION_TOOL = registry.event("session.tool", scope=sc.READ, subscription=MESSAGES_FAMILY)


# Each followed session is a channel-layer group membership held in Redis until the connection ends: bounded, so
# one connection cannot make the gateway hold an unbounded number of them (OpenClaw's UI follows one or two).
MAX_FOLLOWED_SESSIONS = 200


def messages_subscription(session_key: str) -> str:
    return keyed_subscription(MESSAGES_FAMILY, session_key)


async def subscribe(ctx: RpcContext, session_key: str, *, include_approvals: bool) -> None:
    subscription = messages_subscription(session_key)
    followed = sum(1 for held in ctx.subscriptions if held.startswith(f"{MESSAGES_FAMILY}."))
    if subscription not in ctx.subscriptions and followed >= MAX_FOLLOWED_SESSIONS:
        raise InvalidRequest(
            f"this connection already follows {MAX_FOLLOWED_SESSIONS} sessions: unsubscribe from one first"
        )
    await ctx.subscribe(subscription)
    if include_approvals:
        await ctx.subscribe(session_approvals_subscription(session_key))


async def unsubscribe(ctx: RpcContext, session_key: str) -> None:
    await ctx.unsubscribe(messages_subscription(session_key))
    await ctx.unsubscribe(session_approvals_subscription(session_key))


def session_snapshot_fields(session: Session) -> dict[str, Any]:
    """The session's fields a per-session event carries (OpenClaw merges its session snapshot in)."""
    return {
        "sessionId": session.session_id,
        "updatedAt": int(session.updated_at.timestamp() * 1000) if session.updated_at else None,
        "kind": "direct",
        "label": session.label or None,
        "displayName": session.display_name or None,
        "category": session.category or None,
        "archived": session.archived_at is not None,
        "pinned": session.pinned_at is not None,
        "createdVia": session.created_via,
        "parentSessionKey": session.parent_session_key or None,
        "status": session.status or None,
        "model": session.model or None,
        "modelProvider": session.model_provider or None,
        "inputTokens": session.input_tokens,
        "outputTokens": session.output_tokens,
        "lastRunId": session.last_run_id or None,
    }


def session_message_payload(session: Session, event: TranscriptEvent, message: dict[str, Any]) -> dict[str, Any]:
    run_id = message.get("runId")
    return {
        "sessionKey": session.key,
        "agentId": session.agent_id,
        "message": message,
        "messageId": event.event_id,
        "messageSeq": event.seq,
        **session_snapshot_fields(session),
        **({"runId": run_id} if isinstance(run_id, str) and run_id else {}),
    }


def publish_message_on_commit(session: Session, event: TranscriptEvent, message: dict[str, Any]) -> None:
    """``session.message`` for one appended transcript message, to the session's subscribers, once it is durable.

    Built now (the row and the message as this transaction wrote them), sent after commit; nothing when the
    transaction rolls back."""
    payload = session_message_payload(session, event, message)
    subscription = messages_subscription(session.key)
    transaction.on_commit(lambda: publish_to_subscription_rollback_unsafe(subscription, EVENT_SESSION_MESSAGE, payload))
