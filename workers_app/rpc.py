"""Gateway methods of workers_app: sessions.dispatch / move / reclaim and environments.*."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from channels.db import DatabaseSyncToAsync, database_sync_to_async
from django.conf import settings

from openclaw_site.gateway import scopes as sc
from openclaw_site.gateway.background import dispatch_on_commit
from openclaw_site.gateway.context import RpcContext
from openclaw_site.gateway.exceptions import InvalidRequest, NotFound, PermissionDenied, Unavailable
from openclaw_site.gateway.registry import registry
from sessions_app import keys
from sessions_app import selectors as session_selectors
from sessions_app.models import Session

from . import operations, selectors
from .inventory import InvalidInventory, parse_declaration, update_required_message
from .models import PlacementState
from .profiles import profiles_all
from .schemas import (
    EnvironmentsDestroyParams,
    EnvironmentsListParams,
    EnvironmentsStatusParams,
    RunnerInventoryParams,
    SessionsDispatchParams,
    SessionsMoveParams,
    SessionsReclaimParams,
)
from .services import dispatch, node_hosts, reclaim
from .services.placements import Actor
from .tasks import node_retain

method = registry.method
S = PlacementState
RETAIN_COMMAND = "worker.workspace.retain.v1"
SETTLED = (S.ACTIVE, S.FAILED, S.LOCAL, S.RECLAIMED)


def provider_bound[T](fn: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """Work that may wait on a worker provider (a teardown, up to its deadline) runs in a pool thread:
    it must not hold the one thread every other request's database work goes through."""
    return DatabaseSyncToAsync(fn, thread_sensitive=False)


def _session(key: str, agent_id: str | None) -> Session:
    canonical = keys.canonical_key(key, agent_id)
    session = session_selectors.session_get(canonical)
    if session is None:
        raise NotFound(f"session not found: {key}")
    return session


def _actor(ctx: RpcContext) -> Actor:
    return Actor(f"{ctx.role}:{ctx.conn_id}")


def _result(session: Session) -> dict:
    placement = selectors.placement_for(session)
    environment = selectors.environment_for(placement)
    return {
        "ok": True,
        "key": session.key,
        "sessionId": session.session_id,
        "placement": selectors.placement_projection(placement, environment) if placement else {"state": "local"},
    }


def _dispatch_started(ctx: RpcContext, params: SessionsDispatchParams) -> tuple[int, int]:
    session = _session(params.key, params.agentId)
    if params.autoDevice:
        raise InvalidRequest(
            "automatic device placement failed after 0 attempts; no eligible host remains; "
            "reconnect a paired session-host node and retry"
        )
    if params.profileId is not None and not ctx.is_admin:
        raise PermissionDenied("Your operator role cannot dispatch to this Cloud profile.", code="FORBIDDEN")
    if params.profileId is None and params.deviceId is None and not ctx.is_admin:
        raise PermissionDenied("Your operator role cannot dispatch to this Cloud profile.", code="FORBIDDEN")
    placement = operations.start_dispatch(
        session=session, profile_id=params.profileId, device_id=params.deviceId, actor=_actor(ctx)
    )
    return session.pk, placement.generation


@method("sessions.dispatch", params=SessionsDispatchParams, scope=sc.WRITE)
async def sessions_dispatch_rpc(ctx: RpcContext, params: SessionsDispatchParams) -> dict:
    """Answers once the placement settled (active, or failed with its reason), or when the wait ends
    (the dispatch goes on; its stages arrive as ``sessions.changed`` events)."""
    if params.autoDevice and (params.profileId is not None or params.deviceId is not None):
        raise InvalidRequest("choose exactly one dispatch target: autoDevice, deviceId, or profileId")
    session_pk, _generation = await database_sync_to_async(_dispatch_started)(ctx, params)
    return await _settled_result(session_pk, failure_code="WORKER_DISPATCH_FAILED")


async def _settled_result(session_pk: int, *, failure_code: str) -> dict:
    """The placement once its dispatch settled (UNAVAILABLE with its reason if it failed), or as it stands
    when ``OPENCLAW_WORKER_DISPATCH_WAIT_MS`` ran out."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.OPENCLAW_WORKERS["DISPATCH_WAIT_MS"] / 1000
    pause = 0.02
    while True:
        session, state, error = await database_sync_to_async(_settled)(session_pk)
        if state == S.FAILED:
            raise Unavailable(error, details={"code": failure_code})
        if state in SETTLED or loop.time() >= deadline:
            return await database_sync_to_async(_result)(session)
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.5)


def _settled(session_pk: int) -> tuple[Session, str, str]:
    session = Session.objects.get(pk=session_pk)
    placement = selectors.placement_for(session)
    if placement is None:
        return session, S.LOCAL, ""
    return session, placement.state, placement.recovery_error or ""


def _move_target(ctx: RpcContext, params: SessionsMoveParams) -> str:
    if params.target.kind == "gateway":
        return "gateway"
    if params.target.kind == "profile":
        if not ctx.is_admin:
            raise PermissionDenied("Your operator role cannot dispatch to this Cloud profile.", code="FORBIDDEN")
        return dispatch.resolve_target(profile_id=params.target.profileId, device_id=None)
    return dispatch.resolve_target(profile_id=None, device_id=params.target.deviceId)


def _move_started(ctx: RpcContext, params: SessionsMoveParams) -> tuple[int, str]:
    session = _session(params.key, params.agentId)
    if session.archived_at is not None:
        raise InvalidRequest("cannot move an archived session")
    target = _move_target(ctx, params)
    operations.start_move(
        session=session,
        target=target,
        expected_generation=params.expected.generation,
        expected_environment_id=params.expected.environmentId,
        expected_owner_epoch=params.expected.ownerEpoch,
        abandon_source=bool(params.abandonSource),
        actor=_actor(ctx),
    )
    return session.pk, target


@method("sessions.move", params=SessionsMoveParams, scope=sc.WRITE)
async def sessions_move_rpc(ctx: RpcContext, params: SessionsMoveParams) -> dict:
    """Back to the gateway (answers at once), or on to a profile or device (answers once the destination's
    dispatch settled, like ``sessions.dispatch``)."""
    session_pk, target = await provider_bound(_move_started)(ctx, params)
    if target == "gateway":
        return await database_sync_to_async(_result)(await database_sync_to_async(Session.objects.get)(pk=session_pk))
    return await _settled_result(session_pk, failure_code="WORKER_DISPATCH_FAILED")


@method("sessions.reclaim", params=SessionsReclaimParams, scope=sc.WRITE)
async def sessions_reclaim_rpc(ctx: RpcContext, params: SessionsReclaimParams) -> dict:
    return await provider_bound(_reclaim)(ctx, params)


def _reclaim(ctx: RpcContext, params: SessionsReclaimParams) -> dict:
    session = _session(params.key, params.agentId)
    generation = params.recoverToGateway.expectedGeneration if params.recoverToGateway else None
    reclaim.reclaim(session=session, recover_to_gateway_generation=generation, actor=_actor(ctx))
    return _result(session)


@method("environments.list", params=EnvironmentsListParams, scope=sc.READ)
def environments_list_rpc(ctx: RpcContext, params: EnvironmentsListParams) -> dict:
    payload: dict = {"environments": selectors.environments_list(include_prepared=bool(params.includePreparedDetails))}
    if params.projection == "profiles":
        payload["profiles"] = [{"id": p.id, "providerId": p.provider_id} for p in profiles_all()]
    return payload


@method("environments.status", params=EnvironmentsStatusParams, scope=sc.READ)
def environments_status_rpc(ctx: RpcContext, params: EnvironmentsStatusParams) -> dict:
    summary = selectors.environment_status(params.environmentId, include_prepared=bool(params.includePreparedDetails))
    if summary is None:
        raise NotFound(f"worker environment not found: {params.environmentId}")
    return summary


@method("environments.destroy", params=EnvironmentsDestroyParams, scope=sc.ADMIN)
async def environments_destroy_rpc(ctx: RpcContext, params: EnvironmentsDestroyParams) -> dict:
    return await provider_bound(_environment_destroy)(ctx, params)


def _environment_destroy(ctx: RpcContext, params: EnvironmentsDestroyParams) -> dict:
    environment = reclaim.environment_destroy(
        environment_id=params.environmentId, force=bool(params.force), actor=_actor(ctx)
    )
    return {"ok": True, "environment": selectors.environment_status(environment.pk, include_prepared=True)}


@method("node.runnerInventory.update", params=RunnerInventoryParams, role="node", advertise=False)
def node_runner_inventory_update_rpc(ctx: RpcContext, params: RunnerInventoryParams) -> dict:
    """A node declares (after hello, and again after every reconnect) whether it hosts workers."""
    try:
        declaration = parse_declaration(params.model_dump())
    except InvalidInventory:
        raise InvalidRequest("invalid node runner inventory") from None
    if not ctx.node_id:
        raise InvalidRequest("unknown nodeId")
    node_hosts.node_host_declare(node_id=ctx.node_id, conn_id=ctx.conn_id, declaration=declaration)
    if declaration.hosting and not declaration.update_required and RETAIN_COMMAND in (ctx.commands or []):
        # What the node must keep, and whether it still holds this gateway's bundle (after this answer).
        dispatch_on_commit(node_retain, ctx.node_id, ctx.conn_id)
    if declaration.retired:
        raise InvalidRequest(update_required_message(ctx.node_id))
    return {"nodeId": ctx.node_id}
