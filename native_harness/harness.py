"""The bundled harness: sessions that continue native threads kept in the harness store.

* Fork (reference §3.5): fork the source's native thread before the chosen turn into a fresh
  thread F, then create the child session through the host's initialization; the initializer
  takes ownership of F, imports F's history, links child → F, binds child → F (supervision).
  Until the initializer has taken ownership, the fork cleans F up itself; afterwards only the
  host's guarded rollback may archive it.
* Adoption: a new locked session bound to an existing thread (no fresh thread, no link), with a
  pending supervision branch from it; the thread may already be bound to another session (the
  reference adopts a source's own thread). Adoption never archives anything.
* Deletion participant (§3.3, §3.4): removes the binding after the host's delete committed and,
  inside the owning initialization's rollback, undoes exactly what that initialization wrote.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from gateway.exceptions import GatewayError, InvalidRequest
from sessions_app import stages
from sessions_app.harnesses import DeletionTarget, ForkRequest, ForkResult, registry
from sessions_app.keys import dashboard_key
from sessions_app.services import links
from sessions_app.services.initialization import (
    CreatedEntry,
    InitializationError,
    InitializerContext,
    create_session_entry,
)
from sessions_app.services.transcripts import ImportedMessage, import_messages

from . import services

logger = logging.getLogger(__name__)

HARNESS_ID = "native"
UPSTREAM_KIND = "native-threads"
CATALOG_ID = "native"
HOST_ID = "gateway:local"


def _imported(turns) -> list[ImportedMessage]:
    now = int(time.time() * 1000)
    return [ImportedMessage(role=t.role, text=t.text, timestamp=now, extra={"nativeTurnId": t.turn_id}) for t in turns]


def supervision_binding(thread_id: str, *, pending_source: str, last_turn_id: str | None) -> dict[str, Any]:
    branch: dict[str, Any] = {"sourceThreadId": pending_source, "connectionFingerprint": services.current_fingerprint()}
    if last_turn_id:
        branch["lastTurnId"] = last_turn_id
    return {
        "threadId": thread_id,
        "connectionScope": "supervision",
        "supervisionSourceThreadId": pending_source,
        "preserveNativeModel": True,
        "conversationSourceTransferComplete": True,
        "pendingSupervisionBranch": branch,
        "historyCoveredThrough": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


class NativeDeletion:
    """One deletion of a native-harness session (see the module docstring)."""

    def __init__(self, harness: NativeThreadsHarness, target: DeletionTarget):
        self.harness = harness
        self.target = target
        self.binding = services.binding_read(target.agent_id, target.session_id)
        self.ownership = None
        rollback = target.initialization
        if rollback is not None:
            rollback.assert_rollback_current()
            ownership = services.ownership_get(target)
            if ownership is not None:
                if self.binding is not None and not _owns_binding(ownership, self.binding):
                    raise InitializationError("Native initialization binding owner changed before rollback")
                self.ownership = ownership
        if self.binding is not None and self.binding.get("connectionScope") == "supervision" and self.ownership is None:
            if rollback is not None or target.purpose == "rollback":
                raise InitializationError("Cannot delete a session while its native binding is owned by supervision")

    def abandon(self) -> None:
        return None

    def after_commit(self) -> None:
        if self.binding is not None:
            services.binding_delete(agent_id=self.target.agent_id, session_id=self.target.session_id)
        if self.ownership is not None:
            self._clean_up_initialization()

    def _clean_up_initialization(self) -> None:
        ownership, target = self.ownership, self.target
        guard = target.initialization.assert_rollback_current
        written_link = ownership.written_link or _fresh_thread_link(ownership)
        if written_link is not None:
            stages.reach("rollback.link.before_delete", link=written_link)
            outcome = links.link_delete(
                target.session_key, target.agent_id, expected=written_link, assert_commit_allowed=guard
            )
            if outcome == "changed":
                # A successor owns the link now (and maybe the thread): leave both alone.
                logger.warning("Native initialization link changed before cleanup: %s", target.session_key)
                services.ownership_release(target)
                return
        if ownership.fresh_thread_id:
            try:
                self.harness.archive_thread(ownership.fresh_thread_id, guard, released_session_id=target.session_id)
            except Exception as error:
                self.harness.retire_connection()
                raise InitializationError(
                    "Native fork cleanup could not be verified; inspect the retained native thread before retrying."
                ) from error
        services.ownership_release(target)


def _owns_binding(ownership, binding: dict[str, Any]) -> bool:
    if ownership.written_binding is not None:
        return ownership.written_binding == binding
    # Written but not yet recorded (the process stopped in between): ours if it is on our thread.
    return bool(ownership.fresh_thread_id) and binding.get("threadId") == ownership.fresh_thread_id


def _fresh_thread_link(ownership) -> dict[str, Any] | None:
    """A link written but not yet recorded is ours only if it points at the thread we created."""
    if not ownership.fresh_thread_id:
        return None
    link = links.link_read(ownership.session_key, ownership.agent_id)
    if link is not None and link["threadId"] == ownership.fresh_thread_id and link["upstreamKind"] == UPSTREAM_KIND:
        return link
    return None


class NativeThreadsHarness:
    id = HARNESS_ID
    upstream_kind = UPSTREAM_KIND

    # --- native runtime operations (the points a fault or an observer can attach to) --------

    def archive_thread(self, thread_id: str, guard=None, *, released_session_id: str | None = None) -> None:
        services.thread_archive(thread_id, guard=guard, released_session_id=released_session_id)

    def retire_connection(self) -> None:
        services.retire_connection()

    def prepare_deletion(self, target: DeletionTarget) -> NativeDeletion:
        return NativeDeletion(self, target)

    # --- link and binding of a new session --------------------------------------------------

    def _link(self, ctx: InitializerContext, thread_id: str, source_link: dict[str, Any] | None) -> dict[str, Any]:
        link = {
            "sessionKey": ctx.key,
            "agentId": ctx.agent_id,
            "catalogId": CATALOG_ID,
            "hostId": HOST_ID,
            "threadId": thread_id,
            "upstreamKind": UPSTREAM_KIND,
            "upstreamRef": {"connectionFingerprint": services.current_fingerprint(), "threadId": thread_id},
            "marker": None,
        }
        stages.reach("initialization.link.before_write", link=link)
        written = links.link_upsert(
            link, if_absent=True, assert_commit_allowed=ctx.initialization.assert_current, source=source_link
        )
        if not written:
            raise InitializationError("Native initialization link could not be persisted")
        services.ownership_record(ctx.initialization.target, link=link)
        return link

    def _bind(self, ctx: InitializerContext, binding: dict[str, Any]) -> None:
        identity = {"agent_id": ctx.agent_id, "session_id": ctx.session_id}
        stages.reach("initialization.binding.before_write", identity=identity, binding=binding)
        written = services.binding_set_if_absent(
            session_key=ctx.key, binding=binding, guard=ctx.initialization.assert_current, **identity
        )
        if not written:
            raise InitializationError("Native session binding changed during initialization")
        services.ownership_record(ctx.initialization.target, binding=binding)
        stages.reach("initialization.binding.after_write", identity=identity, binding=binding)

    # --- fork -------------------------------------------------------------------------------

    def fork_session(self, request: ForkRequest) -> ForkResult:
        ref = request.upstream.get("upstreamRef") or {}
        if ref.get("connectionFingerprint") != services.current_fingerprint():
            return ForkResult(
                status="failed",
                code="upstream-unavailable",
                message="This native thread is not available on the current connection. "
                "Reconnect to its host and try again.",
            )
        source_thread_id = request.upstream["threadId"]
        try:
            fresh = services.thread_fork(source_thread_id, request.source["nativeTurnId"], guard=request.assert_current)
        except GatewayError as error:
            return ForkResult(status="failed", code="upstream-unavailable", message=error.message, cause=error)
        owned: dict[str, bool] = {"taken": False}

        def initializer(ctx: InitializerContext) -> dict[str, Any]:
            services.ownership_prepare(ctx.initialization.target, fresh_thread_id=fresh.thread_id)
            owned["taken"] = True  # from here on only the host's rollback may archive the fresh thread
            history = services.thread_history(fresh.thread_id)
            import_messages(
                window_id=ctx.session_id,
                session_key=ctx.key,
                messages=_imported(history),
                guard=ctx.initialization.assert_current,
            )
            self._link(ctx, fresh.thread_id, request.upstream)
            self._bind(
                ctx,
                supervision_binding(
                    fresh.thread_id,
                    pending_source=fresh.thread_id,
                    last_turn_id=history[-1].turn_id if history else None,
                ),
            )
            return {"pluginExtensions": {HARNESS_ID: {"threadId": fresh.thread_id}}}

        try:
            created = create_session_entry(
                key=request.target_key,
                agent_id=request.agent_id,
                agent_harness_id=HARNESS_ID,
                after_create=initializer,
                fork_source={
                    "sessionKey": request.source["sessionKey"],
                    "sessionId": request.source["sessionId"],
                    "entryId": request.source["entryId"],
                },
                parent_session_key=request.source["sessionKey"],
            )
            stages.reach("fork.created", key=created.key)
        except Exception as error:
            if not owned["taken"]:
                try:
                    self.archive_thread(fresh.thread_id, None)
                except Exception:
                    logger.exception("could not archive the unused fork thread %s", fresh.thread_id)
            message = error.message if isinstance(error, GatewayError) else str(error)
            return ForkResult(status="failed", code="upstream-unavailable", message=message, cause=error)
        return ForkResult(status="created", key=created.key)

    # --- adoption ---------------------------------------------------------------------------

    def adopt_thread(self, *, thread_id: str, agent_id: str, key: str | None, label: str = "") -> CreatedEntry:
        """A new locked session continuing an existing native thread (nothing is created natively)."""
        history = services.thread_history(thread_id)
        if not services.thread_is_open(thread_id):
            raise InvalidRequest(f"native thread not found: {thread_id}")

        def initializer(ctx: InitializerContext) -> dict[str, Any]:
            services.ownership_prepare(ctx.initialization.target)
            import_messages(
                window_id=ctx.session_id,
                session_key=ctx.key,
                messages=_imported(history),
                guard=ctx.initialization.assert_current,
            )
            self._bind(
                ctx,
                supervision_binding(
                    thread_id, pending_source=thread_id, last_turn_id=history[-1].turn_id if history else None
                ),
            )
            return {"pluginExtensions": {HARNESS_ID: {"threadId": thread_id, "adopted": True}}}

        return create_session_entry(
            key=key or dashboard_key(agent_id),
            agent_id=agent_id,
            agent_harness_id=HARNESS_ID,
            after_create=initializer,
            label=label,
        )


harness = NativeThreadsHarness()
registry.register(harness)
