"""JSON API of the gateway core: its liveness, for load balancers and probes."""

from __future__ import annotations

from django.http import HttpRequest
from ninja import Router

from .schemas import ErrorOut, HealthOut
from .selectors import now_ms

router = Router(tags=["gateway"])


@router.get("/health", auth=None, response={200: HealthOut, 500: ErrorOut}, summary="Liveness")
def health(request: HttpRequest):
    """Answers while the process serves requests; needs no token."""
    return {"ok": True, "ts": now_ms()}
