"""The method and event registry that every app fills from its own ``rpc.py``.

The gateway core never imports an app: apps call :meth:`MethodRegistry.method` at import time and
register the events they publish with the scope a receiver needs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from . import scopes as sc
from .protocol import DEFAULT_MAX_FRAME_BYTES, ClosedModel

Role = Literal["operator", "node"]


class EmptyParams(ClosedModel):
    pass


@dataclass(frozen=True)
class MethodSpec:
    name: str
    handler: Callable[..., Any]
    params: type[BaseModel]
    role: Role
    # None only for `health`, which every authenticated connection may call.
    scope: str | None
    is_async: bool
    # Hidden methods (a node's private protocol) work but are not listed in hello-ok's features.
    advertise: bool = True
    # The largest request frame of this method, in bytes of UTF-8; None: up to the connection's maxPayload.
    max_frame_bytes: int | None = DEFAULT_MAX_FRAME_BYTES
    # OpenClaw's params-dependent scopes (sessions.patch's admin-only fields, …): valid params -> the scope
    # they need. ``scope`` stays the least privilege (the method called with ``{}``), checked before the
    # params are read; this one after they are valid.
    params_scope: Callable[[Any], str] | None = None

    def required_scope(self, params: BaseModel | None = None) -> str | None:
        """The scope a call with ``params`` needs (None: the method called with ``{}``)."""
        if params is None or self.params_scope is None:
            return self.scope
        return self.params_scope(params)


@dataclass(frozen=True)
class EventSpec:
    name: str
    # None: every authenticated connection receives it (tick, presence, shutdown, health).
    scope: str | None
    operators_only: bool
    # Only connections that subscribed (e.g. "sessions" via sessions.subscribe) receive it.
    subscription: str | None = None


@dataclass
class MethodRegistry:
    methods: dict[str, MethodSpec] = field(default_factory=dict)
    events: dict[str, EventSpec] = field(default_factory=dict)
    # Callables (ctx) -> dict merged into hello-ok.snapshot, e.g. sessionDefaults from sessions_app.
    snapshot_providers: list[Callable[[Any], dict]] = field(default_factory=list)
    # Callables (ctx) -> dict merged into the `status` payload, e.g. the stored sessions from sessions_app; run
    # in the handler's database hop. ctx may be None (a caller outside a connection).
    status_providers: list[Callable[[Any], dict]] = field(default_factory=list)
    # node.event name -> handler(ctx, payload) -> {"handled": bool, "reason"?: str}; filled by apps.
    node_event_handlers: dict[str, Callable[[Any, Any], dict]] = field(default_factory=dict)

    def method(
        self,
        name: str,
        *,
        params: type[BaseModel] = EmptyParams,
        scope: str | None = sc.ADMIN,
        role: Role = "operator",
        advertise: bool = True,
        max_frame_bytes: int | None = DEFAULT_MAX_FRAME_BYTES,
        params_scope: Callable[[Any], str] | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register ``handler(ctx, params)``. Unclassified methods default to ``operator.admin``.

        ``max_frame_bytes`` bounds the method's request frames (refused before they are parsed, where the
        frame's head names the method): a method whose params carry bulk declares more, or None for
        ``maxPayload``. ``params_scope`` (valid params -> scope) raises ``scope`` for the params that need more,
        as OpenClaw's method-scope table does for a few methods.
        """

        def decorator(handler: Callable[..., Any]) -> Callable[..., Any]:
            if name in self.methods:
                raise RuntimeError(f"gateway method registered twice: {name}")
            self.methods[name] = MethodSpec(
                name=name,
                handler=handler,
                params=params,
                role=role,
                scope=scope,
                is_async=inspect.iscoroutinefunction(handler),
                advertise=advertise,
                max_frame_bytes=max_frame_bytes,
                params_scope=params_scope,
            )
            return handler

        return decorator

    def event(
        self, name: str, *, scope: str | None, operators_only: bool | None = None, subscription: str | None = None
    ) -> str:
        if name not in self.events:
            self.events[name] = EventSpec(
                name=name,
                scope=scope,
                operators_only=scope is not None if operators_only is None else operators_only,
                subscription=subscription,
            )
        return name

    def snapshot_provider(self, provider: Callable[[Any], dict]) -> Callable[[Any], dict]:
        self.snapshot_providers.append(provider)
        return provider

    def status_provider(self, provider: Callable[[Any], dict]) -> Callable[[Any], dict]:
        self.status_providers.append(provider)
        return provider

    def frame_limit(self, method: str | None) -> int | None:
        """The largest request frame of ``method`` (None: ``maxPayload``); an unknown method has the default."""
        spec = self.methods.get(method) if method is not None else None
        return spec.max_frame_bytes if spec is not None else DEFAULT_MAX_FRAME_BYTES

    def method_names(self) -> list[str]:
        """The methods hello-ok advertises (hidden ones are left out)."""
        return [name for name, spec in self.methods.items() if spec.advertise]

    def event_names(self) -> list[str]:
        return list(self.events)


registry = MethodRegistry()

# Transport-level events every connection may receive.
EVENT_CONNECT_CHALLENGE = registry.event("connect.challenge", scope=None)
EVENT_TICK = registry.event("tick", scope=None)
EVENT_SHUTDOWN = registry.event("shutdown", scope=None)
EVENT_PRESENCE = registry.event("presence", scope=None)
