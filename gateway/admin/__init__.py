"""Admin for inspecting the gateway core and for audited recovery.

Everything the protocol creates is read-only here. State changes only through the actions below,
each of which calls a service once per selected object with ``Actor.for_user(request.user)``: the
service validates the transition and writes our ``AuditLog`` row; the admin adds Django's history
entry and reports "N done, M skipped: <reasons>".
"""

from . import live  # noqa: F401  (registration happens on import)
