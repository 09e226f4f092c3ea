"""The token a node turn's worker holds: the inference of one run by one node (signed; nothing stored), good
while that run is running there. The project's worker presents it to the inference route; the worker on
OpenClaw's node host presents it, as its launch's admission credential, to every route it calls."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.core import signing

INFERENCE_PATH = "/api/workers/inference/chat/completions"
TOKEN_SALT = "openclaw.workers.inference"


@dataclass(frozen=True)
class InferenceGrant:
    run_id: str
    node_id: str


def inference_token(run_id: str, node_id: str) -> str:
    """A token for the inference of run ``run_id`` by node ``node_id`` (signed; nothing stored)."""
    return signing.dumps({"r": run_id, "n": node_id}, salt=TOKEN_SALT, compress=True)


def token_lifetime_s() -> int:
    """The turn's time limit (its task's soft limit, ``OPENCLAW_TURN_TIMEOUT_S``) and a minute: a worker asks with
    it until its turn ends, however long that takes (the grant holds only while its run is running anyway)."""
    return int(settings.OPENCLAW_AGENT["TURN_TIMEOUT_S"]) + 60


def grant_for(token: str) -> InferenceGrant | None:
    """The grant a token carries, if its signature holds and it has not expired."""
    try:
        value = signing.loads(token, salt=TOKEN_SALT, max_age=token_lifetime_s())
    except signing.BadSignature:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("r"), str) or not isinstance(value.get("n"), str):
        return None
    return InferenceGrant(run_id=value["r"], node_id=value["n"])
