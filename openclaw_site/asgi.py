import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "openclaw_site.settings")
# Populate the app registry before anything imports models.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import re_path  # noqa: E402

from gateway.consumers import GatewayConsumer  # noqa: E402
from gateway.daphne_server import allow_large_bodies  # noqa: E402
from gateway.startup_gate import StartupGate  # noqa: E402
from operator_ui.consumers import ConsoleConsumer  # noqa: E402
from operator_ui.origins import SameOriginOnly  # noqa: E402
from workers_app.inference import INFERENCE_PATH  # noqa: E402
from workers_app.inference_http import inference_app  # noqa: E402
from workers_app.nodes.openclaw.bundle_http import BUNDLE_TRANSFER_PREFIX, bundle_transfer_app  # noqa: E402
from workers_app.nodes.openclaw.transfer_http import TRANSFER_PATH, transfer_app  # noqa: E402
from workers_app.nodes.openclaw.upload import MAX_UPLOAD_BYTES  # noqa: E402
from workers_app.nodes.openclaw.worker_routes import TURNS_PREFIX, worker_turn_app  # noqa: E402

# A workspace coming back from OpenClaw's node host is one upload of up to about 900 MiB; every other body is capped
# at OPENCLAW_MAX_PAYLOAD_BYTES before it is taken (gateway.daphne_server).
allow_large_bodies(TRANSFER_PATH + "/", MAX_UPLOAD_BYTES)

# Right after a start, HTTP reads wait for startup recovery (bounded); probes do not.
gated_django_app = StartupGate(django_asgi_app, exempt_paths=("/healthz", "/readyz", "/metrics"))


async def http_application(scope, receive, send):
    """Django, but for the workers' inference route and the routes of the worker on OpenClaw's node host: the hot
    path of every node turn (and a worker's turn is what recovery may be waiting for); and for OpenClaw's node host
    downloading the worker bundle (its own token, no session; a node never waits behind the startup gate)."""
    if scope["path"] == INFERENCE_PATH:
        return await inference_app(scope, receive, send)
    if scope["path"].startswith(TURNS_PREFIX):
        return await worker_turn_app(scope, receive, send)
    if scope["path"].startswith(BUNDLE_TRANSFER_PREFIX):
        return await bundle_transfer_app(scope, receive, send)
    if scope["path"].startswith(TRANSFER_PATH + "/"):
        # OpenClaw's node host moving a workspace: its own bearer tokens, not behind the startup read gate.
        return await transfer_app(scope, receive, send)
    return await gated_django_app(scope, receive, send)


websocket_urlpatterns = [
    re_path(r"^/?$", GatewayConsumer.as_asgi()),
    re_path(r"^/?ws/?$", GatewayConsumer.as_asgi()),
    # The console's live updates: a logged-in Django user (session cookie) of the console's own origin.
    re_path(r"^/?ui/live/?$", SameOriginOnly(AuthMiddlewareStack(ConsoleConsumer.as_asgi()))),
]

# No origin validator or session auth on the gateway's socket: the gateway protocol authenticates inside
# the `connect` request (shared secret, device token, device signature), as OpenClaw does.
application = ProtocolTypeRouter(
    {
        "http": http_application,
        "websocket": URLRouter(websocket_urlpatterns),
    }
)
