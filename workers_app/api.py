"""HTTP routes of workers_app: placements and worker environments for operators, and the worker bundle
for worker hosts.

* Placements (workers.md §4): the placement of one session or a page of all of them, and the
  ``sessions.dispatch`` / ``sessions.move`` / ``sessions.reclaim`` operations on a session named in the
  path (a bare key is placed under the default agent), through :mod:`workers_app.operations` as the
  RPC handlers call them. The gateway token is a full operator (``operator.admin``). Dispatch and
  moves to a worker answer once the placement settled, or when ``OPENCLAW_WORKER_DISPATCH_WAIT_MS``
  ran out (the dispatch goes on).
* Environments (workers.md §2.3): ``environments.list`` / ``status`` / ``destroy``.
* The worker bundle (workers.md §5.3): a node downloads the bundle its gateway names by sha256 with
  its own device token; operators may fetch it with the gateway token. Only this gateway's current
  build is served.

Inference for worker turns is served beside Django, not here (:mod:`workers_app.inference_http`).
"""

from __future__ import annotations

from channels.db import database_sync_to_async
from django.http import FileResponse, HttpRequest
from ninja import Path, Query, Router, Schema

from devices_app.http_auth import NODE_OR_OPERATOR_AUTH
from gateway.exceptions import NotFound
from gateway.http_auth import request_actor
from gateway.schemas import error_responses

from . import operations, selectors
from .bundle import current_bundle
from .operations import provider_bound
from .profiles import profiles_all
from .schemas import (
    DestroyOptions,
    DispatchTarget,
    EnvironmentDestroyOut,
    EnvironmentOut,
    EnvironmentRef,
    EnvironmentsListOut,
    EnvironmentsListParams,
    MoveRequest,
    PlacementResultOut,
    PlacementsListParams,
    PlacementsPageOut,
    PreparedDetails,
    ReclaimOptions,
    RecoverToGateway,
)
from .services import reclaim

router = Router(tags=["workers"])

# A dispatch that failed, or a teardown a provider could not finish, is a 503 with its reason.
PLACEMENT_ERRORS = error_responses(403, 404, 409, 503)


# --- placements -----------------------------------------------------------------------------------


@router.get(
    "/placements",
    response={200: PlacementsPageOut, **error_responses()},
    summary="List placements",
    tags=["placements"],
    exclude_unset=True,
)
def placement_list(request: HttpRequest, query: Query[PlacementsListParams]):
    """Sessions that have a placement record, most recently changed first, optionally of one ``state`` or
    ``environmentId``. Pass a page's ``nextCursor`` as ``cursor`` for the next page; it is null on the last."""
    return selectors.placements_list_payload(query)


@router.get(
    "/placements/{key}",
    response={200: PlacementResultOut, **error_responses(404)},
    summary="Get a session's placement",
    tags=["placements"],
    exclude_unset=True,
)
def placement_detail(request: HttpRequest, key: str):
    """Where the session runs now (``{"state": "local"}`` when it was never dispatched): the projection
    ``sessions.dispatch`` and the others answer, whose ``generation``, ``environmentId`` and
    ``activeOwnerEpoch`` a move or a recovery must name."""
    return selectors.placement_result(operations.session_for(key, None))


def _dispatch_started(request: HttpRequest, key: str, target: DispatchTarget) -> int:
    session = operations.session_for(key, None)
    operations.dispatch_requested(session=session, target=target, is_admin=True, actor=request_actor(request))
    return session.pk


@router.post(
    "/placements/{key}/dispatch",
    response={200: PlacementResultOut, **PLACEMENT_ERRORS},
    summary="Dispatch a session to a worker",
    tags=["placements"],
    exclude_unset=True,
)
async def placement_dispatch(request: HttpRequest, key: str, payload: DispatchTarget):
    """``sessions.dispatch`` to a paired node (``deviceId``) or a Cloud profile (``profileId``). Answers
    once the placement settled (active; a failed dispatch is a 503 with its reason), or with the
    placement as it stands when the wait ran out."""
    operations.dispatch_target_check(payload)
    session_pk = await database_sync_to_async(_dispatch_started)(request, key, payload)
    return await operations.settled_result(session_pk, failure_code="WORKER_DISPATCH_FAILED")


def _move_started(request: HttpRequest, key: str, move: MoveRequest) -> tuple[int, str, str | None]:
    session = operations.session_for(key, None)
    target, joined = operations.move_requested(
        session=session, request=move, is_admin=True, actor=request_actor(request)
    )
    return session.pk, target, joined


@router.post(
    "/placements/{key}/move",
    response={200: PlacementResultOut, **PLACEMENT_ERRORS},
    summary="Move a session",
    tags=["placements"],
    exclude_unset=True,
)
async def placement_move(request: HttpRequest, key: str, payload: MoveRequest):
    """``sessions.move`` of the placement named by ``expected`` (its generation, environment and owner
    epoch, as the placement showed them): back to the gateway (``target: {"kind": "gateway"}``), or on to
    a profile or node. A placement that moved on since is refused (409) and nothing changes; the same move
    already under way is joined (its outcome is the answer)."""
    return await operations.move_result(*await provider_bound(_move_started)(request, key, payload))


def _reclaimed(request: HttpRequest, key: str, options: ReclaimOptions) -> dict:
    session = operations.session_for(key, None)
    operations.reclaim_requested(session=session, options=options, actor=request_actor(request))
    return selectors.placement_result(session)


@router.post(
    "/placements/{key}/reclaim",
    response={200: PlacementResultOut, **PLACEMENT_ERRORS},
    summary="Stop a session's worker",
    tags=["placements"],
    exclude_unset=True,
)
async def placement_reclaim(request: HttpRequest, key: str, payload: ReclaimOptions | None = None):
    """``sessions.reclaim`` ("Stop cloud worker"): an active worker is reclaimed (final reconcile, then
    teardown); a dispatch still provisioning is canceled; a failed placement returns to the gateway once
    its environment is torn down (a teardown that fails is a 503, and nothing moves)."""
    return await provider_bound(_reclaimed)(request, key, payload or ReclaimOptions())


@router.post(
    "/placements/{key}/recover",
    response={200: PlacementResultOut, **PLACEMENT_ERRORS},
    summary="Continue a failed session on the gateway",
    tags=["placements"],
    exclude_unset=True,
)
async def placement_recover(request: HttpRequest, key: str, payload: RecoverToGateway):
    """``sessions.reclaim`` with ``recoverToGateway`` ("Continue on Gateway"): the failed placement of
    exactly ``expectedGeneration`` returns to the gateway even when its worker cannot confirm its stop
    (the teardown stays pending). Any other state or generation is refused with the placement found."""
    options = ReclaimOptions(recoverToGateway=payload)
    return await provider_bound(_reclaimed)(request, key, options)


# --- environments ---------------------------------------------------------------------------------


@router.get(
    "/environments",
    response={200: EnvironmentsListOut, **error_responses()},
    summary="List environments",
    tags=["environments"],
    exclude_unset=True,
)
def environment_list(request: HttpRequest, query: Query[EnvironmentsListParams]):
    """``environments.list``: paired nodes (``node:<id>`` rows), then worker environments newest first;
    with ``projection=profiles``, the configured worker profiles too."""
    payload: dict = {"environments": selectors.environments_list(include_prepared=bool(query.includePreparedDetails))}
    if query.projection == "profiles":
        payload["profiles"] = [{"id": p.id, "providerId": p.provider_id} for p in profiles_all()]
    return payload


@router.get(
    "/environments/{environmentId}",
    response={200: EnvironmentOut, **error_responses(404)},
    summary="Get an environment",
    tags=["environments"],
    exclude_unset=True,
)
def environment_detail(request: HttpRequest, params: Path[EnvironmentRef], query: Query[PreparedDetails]):
    """``environments.status`` of a worker environment."""
    summary = selectors.environment_status(params.environmentId, include_prepared=bool(query.includePreparedDetails))
    if summary is None:
        raise NotFound(f"worker environment not found: {params.environmentId}")
    return summary


def _destroyed(request: HttpRequest, environment_id: str, force: bool) -> dict:
    environment = reclaim.environment_destroy(environment_id=environment_id, force=force, actor=request_actor(request))
    return {"ok": True, "environment": selectors.environment_status(environment.pk, include_prepared=True)}


@router.delete(
    "/environments/{environmentId}",
    response={200: EnvironmentDestroyOut, **error_responses(404, 503)},
    summary="Destroy an environment",
    tags=["environments"],
    exclude_unset=True,
)
async def environment_destroy(request: HttpRequest, params: Path[EnvironmentRef], options: Query[DestroyOptions]):
    """``environments.destroy``: the environment is torn down (a destroyed one answers as it is). One a
    session is attached to is refused unless ``force``, which fails that session's placement first."""
    return await provider_bound(_destroyed)(request, params.environmentId, bool(options.force))


# --- the worker bundle ----------------------------------------------------------------------------


class BundleOut(Schema):
    sha256: str
    version: str
    size: int


@router.get(
    "/bundle",
    response={200: BundleOut, **error_responses(404)},
    auth=NODE_OR_OPERATOR_AUTH,
    summary="Describe the worker bundle",
)
def bundle_current(request: HttpRequest):
    """The worker bundle this gateway ships: its sha256 (the name to download), version and size."""
    bundle = current_bundle()
    return {"sha256": bundle.sha256, "version": bundle.version, "size": bundle.size}


@router.get(
    "/bundle/{sha256}",
    response={200: None, **error_responses(404)},
    auth=NODE_OR_OPERATOR_AUTH,
    summary="Download the worker bundle",
)
def bundle_download(request: HttpRequest, sha256: str):
    """The bundle's bytes (``application/gzip``); its sha256 is its ETag."""
    bundle = current_bundle()
    if sha256 != bundle.sha256:
        raise NotFound(f"worker bundle not found: {sha256}")
    response = FileResponse(bundle.path.open("rb"), content_type="application/gzip")
    response["ETag"] = f'"{bundle.sha256}"'
    response["Content-Disposition"] = f'attachment; filename="openclaw-worker-{bundle.sha256[:12]}.tar.gz"'
    return response
