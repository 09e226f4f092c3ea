"""HTTP routes of workers_app for worker hosts.

* The worker bundle (workers.md §5.3): a node downloads the bundle its gateway names by sha256 with
  its own device token; operators may fetch it with the gateway token. Only this gateway's current
  build is served.

Inference for worker turns is served beside Django, not here (:mod:`workers_app.inference_http`).
"""

from __future__ import annotations

from django.http import FileResponse, HttpRequest
from ninja import Router, Schema

from openclaw_site.gateway.exceptions import NotFound
from openclaw_site.gateway.http_auth import NODE_OR_OPERATOR_AUTH
from openclaw_site.gateway.schemas import ErrorOut

from .bundle import current_bundle

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
