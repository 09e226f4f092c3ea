"""JSON API of the gateway core: health, nodes and pairing, over the same services as the RPC."""

from __future__ import annotations

from django.http import HttpRequest
from ninja import Router

from . import selectors
from .audit import Actor
from .schemas import ErrorOut
from .services import pairing

router = Router(tags=["gateway"])


def _actor(request: HttpRequest) -> Actor:
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return Actor.for_user(user)
    return Actor.system("api:token")


@router.get("/health", auth=None)
def health(request: HttpRequest) -> dict:
    return {"ok": True, "ts": selectors.now_ms()}


@router.get("/nodes")
def node_list(request: HttpRequest) -> dict:
    return {"ts": selectors.now_ms(), "nodes": selectors.node_catalog(include_pending=True)}


@router.get("/devices")
def device_list(request: HttpRequest) -> dict:
    return selectors.device_pair_list()


@router.post("/pairing/{request_id}/approve", response={200: dict, 400: ErrorOut, 403: ErrorOut, 404: ErrorOut})
def pairing_approve(request: HttpRequest, request_id: str):
    device = pairing.pairing_request_approve(request_id=request_id, actor=_actor(request))
    return {"requestId": request_id, "device": selectors.paired_device_shape(device, connected=False)}


@router.post("/pairing/{request_id}/reject", response={200: dict, 400: ErrorOut, 404: ErrorOut})
def pairing_reject(request: HttpRequest, request_id: str):
    rejected = pairing.pairing_request_reject(request_id=request_id, actor=_actor(request))
    return {"requestId": request_id, "deviceId": rejected.device_id}
