"""The project's settings for a gateway under benchmark: the same in every respect but the ASGI application,
which also routes the framework floor (``bench/asgi.py``). ``manage.py serve`` takes the application from
``ASGI_APPLICATION``, so the benchmarks start it as the README does, with ``DJANGO_SETTINGS_MODULE=bench.settings``.
"""

from openclaw_site.settings import *  # noqa: F403  (every setting of the project, unchanged)

ASGI_APPLICATION = "bench.asgi.application"
