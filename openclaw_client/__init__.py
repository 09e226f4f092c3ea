"""Django-free client for the OpenClaw gateway protocol.

The node host, the ``gateway call`` CLI, the benchmarks and the end-to-end tests use this package.
It must never import Django: it runs on worker machines that have no project settings.
"""

PROTOCOL_VERSION = 4
MIN_PROTOCOL_VERSION = 3
CLIENT_VERSION = "openclaw-django/0.1"
