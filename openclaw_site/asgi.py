import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "openclaw_site.settings")
# Populate the app registry before anything imports models.
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import re_path  # noqa: E402

from openclaw_site.gateway.consumers import GatewayConsumer  # noqa: E402

websocket_urlpatterns = [
    re_path(r"^/?$", GatewayConsumer.as_asgi()),
    re_path(r"^/?ws/?$", GatewayConsumer.as_asgi()),
]

# No origin validator or session auth on the socket: the gateway protocol authenticates inside
# the `connect` request (shared secret, device token, device signature), as OpenClaw does.
application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": URLRouter(websocket_urlpatterns),
    }
)
