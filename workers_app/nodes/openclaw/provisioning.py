"""Bringing an environment up on OpenClaw's own node host and stopping it (node-worker-dialect.md §1.3, §1.5,
§1.10): the OpenClaw-dialect half of :class:`~workers_app.nodes.runtime.NodeWorkerRuntime`.

* bootstrap — ``worker.bundle.install.v1``: the node downloads this gateway's bundle with a single-use token
  (:mod:`.bundle_http`), checks and unpacks it, prewarms it when it declared prewarm, and echoes the build;
* start — nothing: OpenClaw's node starts a worker per turn, so activation needs no node command;
* stop — ``worker.environment.stop.v1``: the node stops the environment's workers; the files stay until a
  retain snapshot no longer lists the environment (:mod:`.retention`).
"""

from __future__ import annotations

from typing import Any

from gateway.invoke import NodeCommandFailed

from ...models import WorkerEnvironment
from ...providers import WorkerProviderError
from ...runtimes import BootstrapReceipt
from ..calls import COMMAND_TIMEOUT_MS
from ..hosts import node_bundle_record, node_offers
from .bundle import OpenClawBundle, openclaw_bundle
from .bundle_http import BUNDLE_TOKEN_PURPOSE
from .calls import call_openclaw, openclaw_failure
from .dialect import gateway_namespace, node_session_id
from .tokens import transfer_token_mint, transfer_token_revoke

INSTALL_COMMAND = "worker.bundle.install.v1"
STOP_COMMAND = "worker.environment.stop.v1"
INSTALL_TIMEOUT_MS = 600_000
# The token outlives the install's own deadline by a little; it is revoked as soon as the install ends.
INSTALL_TOKEN_TTL_S = INSTALL_TIMEOUT_MS // 1000 + 60
INSTALL_KIND = "bundle"
BUNDLE_PREWARM_VERSION = 1
MISMATCHED_RECEIPT = "Device worker bundle installer returned a mismatched build receipt"
RECEIPT_KEYS = frozenset({"bundleHash", "openclawVersion", "protocolFeatures", "bundlePrewarm"})


def install_params(node_id: str, bundle: OpenClawBundle, token: str) -> dict[str, Any]:
    """``worker.bundle.install.v1``'s strict input (no ``version`` key); ``bundlePrewarm`` only if declared."""
    params: dict[str, Any] = {"gatewayNamespace": gateway_namespace()}
    if node_offers(node_id, "bundlePrewarm"):
        # A worker child started with the install: the session's first turn finds it warm.
        params["bundlePrewarm"] = BUNDLE_PREWARM_VERSION
    params["build"] = bundle.build()
    params["archive"] = {"token": token, "sha256": bundle.tarball_sha256, "bytes": bundle.tarball_bytes}
    return params


def receipt_matches(receipt: Any, bundle: OpenClawBundle) -> bool:
    """The node's receipt is a well-formed build identity and the very build sent (features as a set, as
    OpenClaw's ``sameWorkerBuild`` compares them)."""
    if not isinstance(receipt, dict) or not {"bundleHash", "openclawVersion", "protocolFeatures"} <= set(receipt):
        return False
    if not set(receipt) <= RECEIPT_KEYS:
        return False
    features = receipt["protocolFeatures"]
    if not isinstance(features, list) or not all(isinstance(feature, str) for feature in features):
        return False
    if len(set(features)) != len(features):
        return False
    prewarm = receipt.get("bundlePrewarm", 1)
    if type(prewarm) is not int or prewarm < 1:
        return False
    return (
        receipt["bundleHash"] == bundle.bundle_hash
        and receipt["openclawVersion"] == bundle.openclaw_version
        and sorted(features) == sorted(bundle.protocol_features)
    )


def openclaw_bootstrap(node_id: str) -> BootstrapReceipt:
    """Install this gateway's bundle on the node (the node skips the download when it holds the build)."""
    bundle = openclaw_bundle()
    token = transfer_token_mint(BUNDLE_TOKEN_PURPOSE, bundle.bundle_hash, ttl_s=INSTALL_TOKEN_TTL_S, single_use=True)
    try:
        receipt = call_openclaw(
            node_id,
            INSTALL_COMMAND,
            install_params(node_id, bundle, token),
            timeout_ms=INSTALL_TIMEOUT_MS,
            idempotency_key=f"{gateway_namespace()}:{bundle.bundle_hash}",
        )
    except NodeCommandFailed as failure:
        raise openclaw_failure(node_id, failure, "Device worker bundle installation failed") from None
    finally:
        transfer_token_revoke(token)
    if not receipt_matches(receipt, bundle):
        raise WorkerProviderError(MISMATCHED_RECEIPT)
    node_bundle_record(node_id=node_id, bundle_hash=bundle.bundle_hash, status="installed")
    return BootstrapReceipt(
        bundle.bundle_hash,
        bundle.openclaw_version,
        list(bundle.protocol_features),
        INSTALL_KIND,
        node_device_id=node_id,
    )


def stop_params(environment: WorkerEnvironment) -> dict[str, Any] | None:
    """``worker.environment.stop.v1``'s input, or None when no session is attached (the node runs nothing
    for the environment then, as OpenClaw's gateway sends no stop for it). The session is named by the id the
    node synced it under, which a reset does not change."""
    attached = environment.attached_session_ids or []
    if not attached:
        return None
    if len(attached) > 1:
        raise WorkerProviderError("node worker environment teardown has an ambiguous session owner")
    return {
        "gatewayNamespace": gateway_namespace(),
        "environmentId": environment.pk,
        "sessionId": node_session_id(environment),
        "ownerEpoch": environment.owner_epoch,
    }


def openclaw_stop(node_id: str, environment: WorkerEnvironment, *, timeout_ms: int = COMMAND_TIMEOUT_MS) -> None:
    """Stop the environment's workers on the node (raises NodeCommandFailed when it cannot be proven)."""
    params = stop_params(environment)
    if params is None:
        return
    answer = call_openclaw(node_id, STOP_COMMAND, params, timeout_ms=timeout_ms)
    if answer is not None:
        raise NodeCommandFailed("INVALID_RESPONSE", "node answered the environment stop with an unexpected payload")
