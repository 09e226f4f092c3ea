"""Gateway methods of workers_app: sessions.dispatch / move / reclaim and environments.*."""

from __future__ import annotations

from channels.db import database_sync_to_async

from gateway import scopes as sc
from gateway.background import dispatch_on_commit
from gateway.context import RpcContext
from gateway.exceptions import InvalidRequest, NotFound
from gateway.registry import registry

from . import operations, selectors
from .nodes import hosts as node_hosts
from .nodes.inventory import InvalidInventory, parse_declaration, update_required_message
from .nodes.openclaw.dialect import node_speaks_openclaw
from .operations import provider_bound
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
from .services import reclaim
from .services.placements import Actor
from .tasks import node_retain

method = registry.method
RETAIN_COMMAND = "worker.workspace.retain.v1"


def _actor(ctx: RpcContext) -> Actor:
    return Actor(f"{ctx.role}:{ctx.conn_id}")


def _dispatch_started(ctx: RpcContext, params: SessionsDispatchParams) -> int:
    session = operations.session_for(params.key, params.agentId)
    operations.dispatch_requested(session=session, target=params, is_admin=ctx.is_admin, actor=_actor(ctx))
    return session.pk


@method("sessions.dispatch", params=SessionsDispatchParams, scope=sc.WRITE)
async def sessions_dispatch_rpc(ctx: RpcContext, params: SessionsDispatchParams) -> dict:
    """Answers once the placement settled (active, or failed with its reason), or when the wait ends
    (the dispatch goes on; its stages arrive as ``sessions.changed`` events)."""
    operations.dispatch_target_check(params)
    session_pk = await database_sync_to_async(_dispatch_started)(ctx, params)
    return await operations.settled_result(session_pk, failure_code="WORKER_DISPATCH_FAILED")


def _move_started(ctx: RpcContext, params: SessionsMoveParams) -> tuple[int, str, str | None]:
    session = operations.session_for(params.key, params.agentId)
    target, joined = operations.move_requested(
        session=session, request=params, is_admin=ctx.is_admin, actor=_actor(ctx)
    )
    return session.pk, target, joined


@method("sessions.move", params=SessionsMoveParams, scope=sc.WRITE)
async def sessions_move_rpc(ctx: RpcContext, params: SessionsMoveParams) -> dict:
    """Back to the gateway (answers once moved), or on to a profile or device (answers once the destination's
    dispatch settled, like ``sessions.dispatch``). An identical move under way is joined: its outcome is the answer."""
    return await operations.move_result(*await provider_bound(_move_started)(ctx, params))


@method("sessions.reclaim", params=SessionsReclaimParams, scope=sc.WRITE)
async def sessions_reclaim_rpc(ctx: RpcContext, params: SessionsReclaimParams) -> dict:
    return await provider_bound(_reclaim)(ctx, params)


def _reclaim(ctx: RpcContext, params: SessionsReclaimParams) -> dict:
    session = operations.session_for(params.key, params.agentId)
    operations.reclaim_requested(session=session, options=params, actor=_actor(ctx))
    return selectors.placement_result(session)


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
    if (
        declaration.hosting
        and not declaration.update_required
        and (RETAIN_COMMAND in (ctx.commands or []) or node_speaks_openclaw(ctx.node_id))
    ):
        # What the node must keep, and whether it still holds this gateway's bundle (after this answer).
        # OpenClaw's node host never lists its private commands: its declaration on this connection is the proof.
        dispatch_on_commit(node_retain, ctx.node_id, ctx.conn_id)
    if declaration.retired:
        raise InvalidRequest(update_required_message(ctx.node_id))
    return {"nodeId": ctx.node_id}
