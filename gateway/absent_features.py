"""OpenClaw methods for features this gateway does not have, answered as OpenClaw answers when the feature is empty
or turned off.

OpenClaw's Control UI and TUI call these at every page load (cron, background tasks, agent questions, plugin and
system-agent approvals, self-update, talk, session companions, transcript branches, the session observer, progress
cards, agent heartbeats); an ``unknown method`` would show as an error in each of them. Nothing here is stored or
invented: every answer says "none", in the exact shape OpenClaw's gateway gave for its empty state (captured from
OpenClaw 2026.9.6, ``tests/fixtures/openclaw_absent_features.json``), and each method takes OpenClaw's params and
requires OpenClaw's scope. docs/gateway-protocol.md lists them as "accepted, feature not present".
"""

from __future__ import annotations

import base64
import hashlib

from . import scopes as sc
from .context import RpcContext
from .registry import EmptyParams, registry
from .schemas import (
    CronListParams,
    ObserverVisibilityParams,
    SessionFeatureParams,
    TalkCatalogParams,
    TasksListParams,
    UpdateStatusParams,
)

method = registry.method

# OpenClaw's cron.list pages default to 50 jobs when the store is empty.
CRON_EMPTY_PAGE_LIMIT = 50


def _snapshot_revision(serialized_jobs: bytes) -> str:
    """OpenClaw's cron list revision: ``sha256:`` and the unpadded base64url digest of the jobs' stable JSON."""
    digest = hashlib.sha256(serialized_jobs).digest()
    return "sha256:" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


# No job ever exists here, so every page is the one of an empty list.
EMPTY_CRON_REVISION = _snapshot_revision(b"[]")


@method("cron.list", params=CronListParams, scope=sc.READ)
async def cron_list_rpc(ctx: RpcContext, params: CronListParams) -> dict:
    page = {
        "jobs": [],
        "snapshotRevision": EMPTY_CRON_REVISION,
        "total": 0,
        "offset": 0,
        "limit": params.limit or CRON_EMPTY_PAGE_LIMIT,
        "hasMore": False,
        "nextOffset": None,
    }
    # As OpenClaw: delivery previews (one per job listed: none) unless the caller asked for a compact page or
    # turned them off.
    if not params.compact and params.includeDeliveryPreviews is not False:
        page["deliveryPreviews"] = {}
    return page


@method("cron.status", scope=sc.READ)
async def cron_status_rpc(ctx: RpcContext, params: EmptyParams) -> dict:
    return {"enabled": False, "jobs": 0, "nextWakeAtMs": None}


@method("tasks.list", params=TasksListParams, scope=sc.READ)
async def tasks_list_rpc(ctx: RpcContext, params: TasksListParams) -> dict:
    return {"tasks": []}


@method("question.list", scope=sc.QUESTIONS)
async def question_list_rpc(ctx: RpcContext, params: EmptyParams) -> dict:
    return {"questions": []}


@method("plugin.approval.list", scope=sc.APPROVALS)
async def plugin_approval_list_rpc(ctx: RpcContext, params: EmptyParams) -> list:
    return []


@method("openclaw.approval.list", scope=sc.APPROVALS)
async def openclaw_approval_list_rpc(ctx: RpcContext, params: EmptyParams) -> list:
    return []


@method("update.status", params=UpdateStatusParams, scope=sc.ADMIN)
async def update_status_rpc(ctx: RpcContext, params: UpdateStatusParams) -> dict:
    # No restart sentinel and no update known: the gateway is updated by redeploying it, not by itself.
    return {"sentinel": None, "updateAvailable": None}


# The talk vocabulary OpenClaw's catalog always names; the providers that could serve any of it are none here.
TALK_MODES = ["realtime", "stt-tts", "transcription"]
TALK_TRANSPORTS = ["webrtc", "provider-websocket", "gateway-relay", "managed-room"]
TALK_BRAINS = ["agent-consult", "direct-tools", "none"]


@method("talk.catalog", params=TalkCatalogParams, scope=sc.READ)
async def talk_catalog_rpc(ctx: RpcContext, params: TalkCatalogParams) -> dict:
    return {
        "modes": list(TALK_MODES),
        "transports": list(TALK_TRANSPORTS),
        "brains": list(TALK_BRAINS),
        "speech": {"providers": []},
        "transcription": {"ready": False, "providers": []},
        "realtime": {"ready": False, "providers": []},
    }


@method("sessions.companion.state", params=SessionFeatureParams, scope=sc.READ)
async def sessions_companion_state_rpc(ctx: RpcContext, params: SessionFeatureParams) -> dict:
    return {"exchanges": []}


@method("sessions.branches.list", params=SessionFeatureParams, scope=sc.READ)
async def sessions_branches_list_rpc(ctx: RpcContext, params: SessionFeatureParams) -> dict:
    # A transcript here is one path (a fork makes a new session), so it has no other tips to switch to.
    return {"branches": []}


@method("sessions.observer.visibility", params=ObserverVisibilityParams, scope=sc.READ)
async def sessions_observer_visibility_rpc(ctx: RpcContext, params: ObserverVisibilityParams) -> dict:
    return {"ok": True}


@method("progressCard.get", params=SessionFeatureParams, scope=sc.READ)
async def progress_card_get_rpc(ctx: RpcContext, params: SessionFeatureParams) -> dict:
    return {"card": None}


@method("last-heartbeat", scope=sc.READ)
async def last_heartbeat_rpc(ctx: RpcContext, params: EmptyParams) -> None:
    # OpenClaw's agent heartbeats (periodic wake-up turns) do not exist here: no heartbeat has ever run.
    return None
