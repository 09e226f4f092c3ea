"""The benchmarks' ASGI application: the framework floor at ``/bench/floor``, everything else to the project's.

The floor's WebSocket goes through the same Daphne, ``ProtocolTypeRouter`` and ``URLRouter`` as the gateway's
socket, without middleware on either, so the two differ only by what their consumers do.
"""

import re

from channels.routing import ProtocolTypeRouter, URLRouter
from django.urls import re_path

from bench.floor import FLOOR_PATH, FloorConsumer
from openclaw_site.asgi import application as project_application

FLOOR_ROUTE = re.compile(rf"^/?{FLOOR_PATH}/?$")

floor_application = ProtocolTypeRouter(
    {"websocket": URLRouter([re_path(FLOOR_ROUTE.pattern, FloorConsumer.as_asgi())])}
)


async def application(scope, receive, send):
    if scope["type"] == "websocket" and FLOOR_ROUTE.match(scope["path"]):
        return await floor_application(scope, receive, send)
    return await project_application(scope, receive, send)
