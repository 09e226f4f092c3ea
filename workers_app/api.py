"""HTTP routes of workers_app for worker hosts.

* The worker bundle (workers.md §5.3): a node downloads the bundle its gateway names by sha256 with
  its own device token; operators may fetch it with the gateway token. Only this gateway's current
  build is served.
* Inference for worker turns (docs/node-worker-protocol.md): a worker child streams its model call
  through the gateway with the token of its run.
"""

from __future__ import annotations

from typing import Literal

from asgiref.sync import sync_to_async
from django.http import FileResponse, HttpRequest, StreamingHttpResponse
from ninja import Field, Router, Schema
from ninja.security import HttpBearer

from openclaw_site.gateway.exceptions import Conflict, NotFound
from openclaw_site.gateway.http_auth import NODE_OR_OPERATOR_AUTH
from openclaw_site.gateway.schemas import ErrorOut
from sessions_app.model_providers import ChatMessage, default_model

from .bundle import current_bundle
from .inference import InferenceGrant, completion_stream, grant_for, running_run

router = Router(tags=["workers"])

ERRORS = {401: ErrorOut, 404: ErrorOut}


class BundleOut(Schema):
    sha256: str
    version: str
    size: int


@router.get("/bundle", response={200: BundleOut, **ERRORS}, auth=NODE_OR_OPERATOR_AUTH)
def bundle_current(request: HttpRequest):
    """The worker bundle this gateway ships: its sha256 (the name to download), version and size."""
    bundle = current_bundle()
    return {"sha256": bundle.sha256, "version": bundle.version, "size": bundle.size}


@router.get("/bundle/{sha256}", response={200: None, **ERRORS}, auth=NODE_OR_OPERATOR_AUTH)
def bundle_download(request: HttpRequest, sha256: str):
    """The bundle's bytes (``application/gzip``); its sha256 is its ETag."""
    bundle = current_bundle()
    if sha256 != bundle.sha256:
        raise NotFound(f"worker bundle not found: {sha256}")
    response = FileResponse(bundle.path.open("rb"), content_type="application/gzip")
    response["ETag"] = f'"{bundle.sha256}"'
    response["Content-Disposition"] = f'attachment; filename="openclaw-worker-{bundle.sha256[:12]}.tar.gz"'
    return response


class InferenceBearer(HttpBearer):
    """``Authorization: Bearer <inference token>`` of one running turn on one node."""

    def authenticate(self, request: HttpRequest, token: str) -> InferenceGrant | None:
        return grant_for(token) if token else None


class InferenceMessage(Schema):
    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=1_000_000)


class InferenceRequest(Schema):
    model: str = Field(default="", max_length=200)
    messages: list[InferenceMessage] = Field(min_length=1, max_length=10_000)
    stream: bool = True


@router.post(
    "/inference/chat/completions",
    response={200: None, 401: ErrorOut, 409: ErrorOut, 422: ErrorOut},
    auth=InferenceBearer(),
    include_in_schema=False,
)
async def inference_completions(request: HttpRequest, body: InferenceRequest):
    """The model's streamed reply for a worker turn (server-sent OpenAI chat-completion chunks)."""
    grant: InferenceGrant = request.auth
    run = await sync_to_async(running_run)(grant)
    if run is None:
        raise Conflict("inference token is not valid for a running turn on this node")
    model = run.session.model if run.session.model else default_model()
    messages = [ChatMessage(role=message.role, content=message.content) for message in body.messages]
    response = StreamingHttpResponse(completion_stream(run, messages, model), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    return response
