"""JSON API of devices and nodes: the node catalog, device and node pairing, device tokens (under
``/api/gateway/`` beside the core's health route, where they always were).

Each route calls the service or selector of its gateway method (named in its description) with that
method's parameter schema; the ids the RPC takes in ``params`` are in the path here. The gateway
token is a full operator (``operator.admin``): it sees pending nodes and may approve any request.
"""

from __future__ import annotations

from django.http import HttpRequest
from ninja import Path, Query, Router

from gateway import scopes as sc
from gateway.exceptions import NotFound
from gateway.http_auth import request_actor
from gateway.schemas import error_responses
from gateway.selectors import now_ms

from . import selectors
from .schemas import (
    DeviceIdParams,
    DevicePairApproveOut,
    DevicePairListOut,
    DevicePairRejectOut,
    DeviceRemovedOut,
    DeviceRoleParams,
    NodeDescribeOut,
    NodeIdParams,
    NodeListOut,
    NodePairApproveOut,
    NodePairListOut,
    NodePairRejectOut,
    NodeRemovedOut,
    NodeRename,
    NodeRenameOut,
    PairingRequestsOut,
    PairingRequestsQuery,
    RequestIdParams,
    TokenRevokeOut,
    TokenRotateOut,
    TokenScopes,
)
from .services import pairing, tokens

router = Router(tags=["devices"])


# --- nodes (the node.* methods) -------------------------------------------------------------------


@router.get("/nodes", response={200: NodeListOut, **error_responses()}, summary="List nodes", exclude_unset=True)
def node_list(request: HttpRequest):
    """``node.list``: paired nodes, nodes waiting for approval and connected ones, connected first."""
    return {"ts": now_ms(), "nodes": selectors.node_catalog(include_pending=True)}


@router.get(
    "/nodes/pairing",
    response={200: NodePairListOut, **error_responses()},
    summary="List node pairing",
    exclude_unset=True,
)
def node_pair_list(request: HttpRequest):
    """``node.pair.list``: open pairing requests of nodes, and the paired nodes."""
    return selectors.node_pair_list()


@router.post(
    "/nodes/pairing/{requestId}/approve",
    response={200: NodePairApproveOut, **error_responses(403, 404)},
    summary="Approve a node",
    exclude_unset=True,
)
def node_pair_approve(request: HttpRequest, params: Path[RequestIdParams]):
    """``node.pair.approve``: the node gets the commands and capabilities it declared. A request that is
    not open (unknown, expired, already decided, or not a node's) is a 404."""
    device = pairing.pairing_request_approve(
        request_id=params.requestId, actor=request_actor(request), role=sc.ROLE_NODE
    )
    return {"requestId": params.requestId, "node": selectors.paired_node_shape(device)}


@router.post(
    "/nodes/pairing/{requestId}/reject",
    response={200: NodePairRejectOut, **error_responses(404)},
    summary="Reject a node",
)
def node_pair_reject(request: HttpRequest, params: Path[RequestIdParams]):
    """``node.pair.reject``: the request is closed; the node may ask again."""
    rejected = pairing.pairing_request_reject(
        request_id=params.requestId, actor=request_actor(request), role=sc.ROLE_NODE
    )
    return {"requestId": params.requestId, "nodeId": rejected.device_id}


@router.get(
    "/nodes/{nodeId}",
    response={200: NodeDescribeOut, **error_responses(404)},
    summary="Describe a node",
    exclude_unset=True,
)
def node_describe(request: HttpRequest, params: Path[NodeIdParams]):
    """``node.describe``: one node of the catalog, as it is now."""
    node_id = params.nodeId.strip()
    node = next((n for n in selectors.node_catalog(include_pending=True) if n["nodeId"] == node_id), None)
    if node is None:
        raise NotFound("unknown nodeId")
    return {"ts": now_ms(), **node}


@router.patch(
    "/nodes/{nodeId}",
    response={200: NodeRenameOut, **error_responses(404)},
    summary="Rename a node",
)
def node_rename(request: HttpRequest, params: Path[NodeIdParams], payload: NodeRename):
    """``node.rename``: the operator's name for the node, which wins over the one it announces."""
    device = pairing.node_rename(node_id=params.nodeId, display_name=payload.displayName, actor=request_actor(request))
    return {"nodeId": device.device_id, "displayName": device.operator_label}


@router.delete(
    "/nodes/{nodeId}",
    response={200: NodeRemovedOut, **error_responses(404)},
    summary="Remove a node",
)
def node_remove(request: HttpRequest, params: Path[NodeIdParams]):
    """``node.pair.remove``: the node role is withdrawn and its connections closed; sessions placed on
    the node fail (their workers are given up) before this answers."""
    pairing.node_pair_remove(node_id=params.nodeId, actor=request_actor(request))
    return {"nodeId": params.nodeId}


# --- devices and their tokens (device.pair.*, device.token.*) ---------------------------------------


@router.get(
    "/devices", response={200: DevicePairListOut, **error_responses()}, summary="List devices", exclude_unset=True
)
def device_list(request: HttpRequest):
    """``device.pair.list``: open pairing requests (every role) and paired devices with their tokens."""
    return selectors.device_pair_list()


@router.delete(
    "/devices/{deviceId}",
    response={200: DeviceRemovedOut, **error_responses(404)},
    summary="Remove a device",
)
def device_remove(request: HttpRequest, params: Path[DeviceIdParams]):
    """``device.pair.remove``: the device is forgotten, its tokens die with it and its connections close."""
    pairing.paired_device_remove(device_id=params.deviceId, actor=request_actor(request))
    return {"deviceId": params.deviceId}


@router.post(
    "/devices/{deviceId}/tokens/{role}/rotate",
    response={200: TokenRotateOut, **error_responses(404)},
    summary="Rotate a device token",
    exclude_unset=True,
)
def device_token_rotate(request: HttpRequest, params: Path[DeviceRoleParams], payload: TokenScopes | None = None):
    """``device.token.rotate``: a new token for the device's role (its other connections on the old one
    are closed). The secret goes only to the device itself, so here it is withheld
    (``tokenDelivery: "withheld-cross-device"``). A role the device does not hold, or scopes beyond its
    approval, is refused with ``device token rotation denied``."""
    return tokens.device_token_rotate(
        device_id=params.deviceId,
        role=params.role,
        scopes=payload.scopes if payload is not None else None,
        actor=request_actor(request),
    )


@router.post(
    "/devices/{deviceId}/tokens/{role}/revoke",
    response={200: TokenRevokeOut, **error_responses(404)},
    summary="Revoke a device token",
)
def device_token_revoke(request: HttpRequest, params: Path[DeviceRoleParams]):
    """``device.token.revoke``: idempotent; revoking a revoked token answers its first revocation time."""
    return tokens.device_token_revoke(device_id=params.deviceId, role=params.role, actor=request_actor(request))


# --- pairing requests of every role ---------------------------------------------------------------


@router.get(
    "/pairing/requests",
    response={200: PairingRequestsOut, **error_responses()},
    summary="List pairing requests",
    exclude_unset=True,
)
def pairing_request_list(request: HttpRequest, query: Query[PairingRequestsQuery]):
    """Open pairing requests, newest first (``device.pair.list``'s ``pending``), of one role or all."""
    return {"pending": [selectors.pairing_request_shape(r) for r in selectors.open_pairing_requests(role=query.role)]}


@router.post(
    "/pairing/{requestId}/approve",
    response={200: DevicePairApproveOut, **error_responses(403, 404)},
    summary="Approve a pairing request",
    exclude_unset=True,
)
def pairing_approve(request: HttpRequest, params: Path[RequestIdParams]):
    """``device.pair.approve``: any open request, of a device or a node. A request that is not open
    (unknown, expired or already decided) is a 404."""
    device = pairing.pairing_request_approve(request_id=params.requestId, actor=request_actor(request))
    return {"requestId": params.requestId, "device": selectors.paired_device_shape(device, connected=False)}


@router.post(
    "/pairing/{requestId}/reject",
    response={200: DevicePairRejectOut, **error_responses(404)},
    summary="Reject a pairing request",
)
def pairing_reject(request: HttpRequest, params: Path[RequestIdParams]):
    """``device.pair.reject``: any open request, of a device or a node."""
    rejected = pairing.pairing_request_reject(request_id=params.requestId, actor=request_actor(request))
    return {"requestId": params.requestId, "deviceId": rejected.device_id}
