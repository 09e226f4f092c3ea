"""Reads and wire projections of sessions, transcripts and runs."""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any

from django.conf import settings
from django.db.models import Count, Exists, Min, OuterRef, Q, QuerySet
from django.utils import timezone

from gateway import sql_reads, state
from gateway.cursors import cursor_decode, cursor_encode, cursor_int, cursor_str
from gateway.exceptions import InvalidRequest, NotFound
from gateway.protocol import SERVER_VERSION
from gateway.redaction import shown_path

from . import keys, titles
from .model_providers import default_model
from .models import Run, RunStatus, Session, SessionWindow, ToolArtifact, TranscriptEvent
from .ports import placements
from .schemas import RunsListParams, SessionRowOut, SessionsListParams, SessionsPageQuery


def _ms(value) -> int | None:
    return int(value.timestamp() * 1000) if value else None


def session_rows(sessions: Sequence[Session]) -> list[dict]:
    """The GatewaySessionRow projection of sessions.list / sessions.describe, with the fields the placement
    port contributes (:mod:`sessions_app.ports`), asked for once per page."""
    extra = placements().session_fields(sessions) if sessions else {}
    rows = []
    for session in sessions:
        row = _own_row(session)
        contributed = extra.get(session.key)
        if contributed:
            overridden = _OWN_FIELDS & contributed.keys()
            if overridden:
                raise RuntimeError(f"a session projection overrides session fields {sorted(overridden)}")
            row.update(contributed)
        rows.append(row)
    return rows


def session_row(session: Session) -> dict:
    return session_rows([session])[0]


# Every field of a row that sessions_app writes, set or not (the JSON API's schema of the row lists them): a
# projection may claim none of them.
_OWN_FIELDS = frozenset(SessionRowOut.model_fields)


def _own_row(session: Session) -> dict:
    """The session's own fields, unset ones left out (absent on the wire), in the protocol's order.

    Built field by field rather than as a full dict filtered afterwards: a page of rows is the bulk of
    sessions.list's own work."""
    row: dict = {
        "key": session.key,
        "kind": "direct",
        "agentId": session.agent_id,
        "sessionId": session.session_id,
        "lifecycleRevision": session.lifecycle_revision,
        "revision": session.revision,
    }
    if session.updated_at:
        row["updatedAt"] = int(session.updated_at.timestamp() * 1000)
    if session.created_at:
        row["createdAt"] = int(session.created_at.timestamp() * 1000)
    if session.last_interaction_at:
        row["lastInteractionAt"] = int(session.last_interaction_at.timestamp() * 1000)
    if session.label:
        row["label"] = session.label
    if session.display_name:
        row["displayName"] = session.display_name
    if session.category:
        row["category"] = session.category
    row["archived"] = session.archived_at is not None
    row["pinned"] = session.pinned_at is not None
    row["initializationPending"] = session.initialization_pending
    if session.created_via is not None:
        row["createdVia"] = session.created_via
    if session.parent_session_key:
        row["parentSessionKey"] = session.parent_session_key
    if session.status:
        row["status"] = session.status
    if session.model:
        row["model"] = session.model
    if session.model_provider:
        row["modelProvider"] = session.model_provider
    if session.input_tokens is not None:
        row["inputTokens"] = session.input_tokens
    if session.output_tokens is not None:
        row["outputTokens"] = session.output_tokens
    if session.last_run_id:
        row["lastRunId"] = session.last_run_id
    if session.fork_source_session_key:
        row["forkSource"] = {
            "sessionKey": session.fork_source_session_key,
            "sessionId": session.fork_source_session_id,
            "entryId": session.fork_source_entry_id or None,
        }
    if session.cwd:
        row["spawnedCwd"] = shown_path(session.cwd)
    if session.worktree:
        row["worktree"] = _shown_worktree(session.worktree)
    return row


def _shown_worktree(worktree: dict) -> dict:
    return {"id": worktree["id"], "branch": worktree["branch"], "path": shown_path(worktree["path"])}


def session_get(key: str) -> Session | None:
    return Session.objects.filter(key=key).first()  # the key is unique


def session_row_of(key: str) -> dict | None:
    """``sessions.describe``'s row of the session of ``key`` (None: no such session), read with only the columns a
    row shows, as a ``sessions.list`` page reads them."""
    return session_described(key)


def session_require(key: str) -> Session:
    session = session_get(key)
    if session is None:
        raise NotFound(f"session not found: {key}")
    return session


def session_defaults() -> dict:
    provider = settings.OPENCLAW_MODEL["PROVIDER"]
    return {
        "defaultAgentId": keys.DEFAULT_AGENT_ID,
        "mainKey": keys.MAIN_KEY,
        "mainSessionKey": keys.main_key(),
        "modelProvider": provider,
        "model": default_model(),
    }


def resolved_model(session: Session) -> dict:
    return {
        "modelProvider": session.model_provider or settings.OPENCLAW_MODEL["PROVIDER"],
        "model": session.model or default_model(),
    }


# --- payloads shared by the gateway methods and the JSON API --------------------------------


@dataclass(frozen=True)
class RowFilters:
    """The filters of OpenClaw's ``sessions.list`` beyond the JSON API's (``None``: any value)."""

    updated_since: datetime | None = None
    parent_key: str | None = None
    pinned: bool | None = None
    category: str | None = None
    # The working directory as clients see it (``spawnedCwd``).
    shown_cwd: str | None = None
    with_interaction: bool = False

    def __bool__(self) -> bool:
        return self != RowFilters()


def _row_filters(query: SessionsListParams) -> RowFilters:
    return RowFilters(
        updated_since=timezone.now() - timedelta(minutes=query.activeMinutes) if query.activeMinutes else None,
        parent_key=keys.canonical_key(query.spawnedBy, query.agentId) if query.spawnedBy else None,
        pinned=query.pinned,
        category=query.group,
        shown_cwd=query.workspaceDir,
        with_interaction=bool(query.requireLastInteraction),
    )


def sessions_list_payload(query: SessionsPageQuery) -> dict:
    """The sessions.list result (the JSON API's ``GET /api/sessions/`` too, without OpenClaw's filters and row
    fields). A limit above a page's most is clamped (``limitApplied``)."""
    if query.cursor is not None and query.offset:
        raise InvalidRequest("sessions.list takes offset or cursor, not both")
    openclaw = query if isinstance(query, SessionsListParams) else None
    limit = query.page_limit
    if openclaw is not None and openclaw.selects_nothing:
        sessions, has_more = [], False
    else:
        sessions, has_more = sessions_page(
            limit=limit,
            offset=query.offset,
            after=cursor_decode(query.cursor, _cursor_time, cursor_int) if query.cursor is not None else None,
            agent_id=keys.normalize_agent_id(query.agentId) if query.agentId else None,
            label=query.label,
            search=query.search,
            archived=query.archived,
            filters=_row_filters(openclaw) if openclaw is not None else RowFilters(),
        )
    rows = session_rows(sessions)
    if openclaw is not None and (openclaw.includeDerivedTitles or openclaw.includeLastMessage):
        extras = titles.row_extras(
            sessions, titles=bool(openclaw.includeDerivedTitles), last_message=bool(openclaw.includeLastMessage)
        )
        for row in rows:
            row.update(extras.get(row["key"], {}))
    return {
        "ts": int(time.time() * 1000),
        "count": len(sessions),
        "limitApplied": limit,
        "offset": query.offset,
        "nextOffset": query.offset + len(sessions) if has_more and query.cursor is None else None,
        "nextCursor": cursor_encode(sessions[-1].updated_at.isoformat(), sessions[-1].pk) if has_more else None,
        "hasMore": has_more,
        "defaults": session_defaults(),
        "sessions": rows,
    }


def session_described(key: str, *, derived_title: bool = False, last_message: bool = False) -> dict | None:
    """``sessions.describe``'s row, with OpenClaw's ``derivedTitle`` / ``lastMessagePreview`` when asked."""
    found = sql_reads.instances(Session, _PAGE_FIELDS, _BY_KEY_SQL, [key])
    if not found:
        return None
    row = session_row(found[0])
    if derived_title or last_message:
        row.update(titles.row_extras(found, titles=derived_title, last_message=last_message).get(key, {}))
    return row


def session_created_payload(session: Session, *, worktree: dict | None = None, run: Run | None = None) -> dict:
    """The sessions.create result."""
    result: dict = {
        "ok": True,
        "key": session.key,
        "sessionId": session.session_id,
        "entry": session_row(session),
        "runStarted": False,
        "resolved": resolved_model(session),
    }
    if worktree is not None:
        result["worktree"] = {"id": worktree["id"], "path": shown_path(worktree["path"]), "branch": worktree["branch"]}
    if run is not None:
        result.update(runStarted=True, runId=run.run_id)
    return result


def session_adopted_payload(session: Session) -> dict:
    return {"ok": True, "key": session.key, "sessionId": session.session_id, "entry": session_row(session)}


def session_entry_payload(session: Session, *, resolved: bool = False) -> dict:
    """The sessions.patch (``resolved=True``) and sessions.reset result."""
    result = {"ok": True, "key": session.key, "entry": session_row(session)}
    if resolved:
        result["resolved"] = resolved_model(session)
    return result


def chat_send_payload(run: Run, *, created: bool) -> dict:
    """The chat.send acknowledgement: a new run has started; a repeated key reports that run."""
    if created:
        return {"runId": run.run_id, "status": "started"}
    if not run.is_terminal:
        return {"runId": run.run_id, "status": "in_flight"}
    if run.status == "ok":
        return {"runId": run.run_id, "status": "ok"}
    return {"runId": run.run_id, "status": "error", "summary": run.error or run.status}


def chat_abort_payload(run_ids: list[str]) -> dict:
    return {"ok": True, "aborted": bool(run_ids), "runIds": run_ids}


def sessions_page(
    *,
    limit: int,
    offset: int,
    after: tuple[datetime, int] | None = None,
    agent_id: str | None = None,
    label: str | None = None,
    search: str | None = None,
    archived: bool | str = False,
    filters: RowFilters | None = None,
) -> tuple[list[Session], bool]:
    """One page, newest first, plus whether more follow. One query; from a keyset cursor (``after``: the
    previous page's last ``(updated_at, id)``) its cost does not grow with the depth, from an offset it does.

    Without a search or OpenClaw's filters (the ORM words them per database) the page is SQL written once per
    filter shape (``gateway.sql_reads``: Django's compile of this queryset cost ten times its execution)."""
    if search or filters:
        queryset = _sessions_filtered(agent_id, label, search, archived, filters or RowFilters())
        if after is not None:
            queryset = _after(queryset, *after)
        rows = list(queryset[offset : offset + limit + 1])
        return rows[:limit], len(rows) > limit
    params: list = [value for value in (agent_id, label) if value is not None]
    if after is not None:
        updated_at = sql_reads.prepared(_UPDATED_AT, after[0], Session)
        params += [updated_at, updated_at, updated_at, after[1]]
    sql = _page_sql(agent_id is not None, label is not None, archived, after is not None)
    rows = sql_reads.instances(Session, _PAGE_FIELDS, sql, [*params, limit + 1, offset])
    return rows[:limit], len(rows) > limit


def _after(qs: QuerySet[Session], updated_at: datetime, pk: int) -> QuerySet[Session]:
    """The rows after a keyset cursor, newest first. The `updated_at <= …` term is implied by the other two; it
    lets the planners seek session_recent_idx to a range bound instead of walking it from the start (see
    runs_list_payload)."""
    return qs.filter(Q(updated_at__lte=updated_at), Q(updated_at__lt=updated_at) | Q(updated_at=updated_at, pk__lt=pk))


# Session columns that neither a row nor a projection reads, left out of a page's query: on SQLite each
# column of a result costs its execute about 0.5 µs even when no row comes back, and the plugin extensions
# are a JSON document to decode per row. Anything that reads them from a page's sessions loads them then.
_UNSHOWN_COLUMNS = ("plugin_extensions", "agent_harness_id", "model_selection_locked")


_PAGE_FIELDS = tuple(field for field in Session._meta.concrete_fields if field.attname not in _UNSHOWN_COLUMNS)
_UPDATED_AT = Session._meta.get_field("updated_at")
# sessions.describe's read (the key is unique).
_BY_KEY_SQL = f'SELECT {sql_reads.columns(_PAGE_FIELDS)} FROM "{Session._meta.db_table}" WHERE "key" = %s'


@functools.cache
def _page_sql(by_agent: bool, by_label: bool, archived: bool | str, keyset: bool) -> str:
    """:func:`_sessions_filtered` and :func:`_after` (without a search) as SQL, ``LIMIT``/``OFFSET`` last."""
    where = []
    if by_agent:
        where.append('"agent_id" = %s')
    if by_label:
        where.append('"label" = %s')
    if archived is True:
        where.append('"archived_at" IS NOT NULL')
    elif archived is False:
        where.append('"archived_at" IS NULL')
    if keyset:
        where.append('"updated_at" <= %s AND ("updated_at" < %s OR ("updated_at" = %s AND "id" < %s))')
    condition = f" WHERE {' AND '.join(where)}" if where else ""
    return (
        f'SELECT {sql_reads.columns(_PAGE_FIELDS)} FROM "{Session._meta.db_table}"{condition} '
        'ORDER BY "updated_at" DESC, "id" DESC LIMIT %s OFFSET %s'
    )


def _shown_cwd_is(shown: str) -> Q:
    """Sessions whose working directory clients see as ``shown`` (``gateway.redaction.shown_path``): under the
    state directory by its relative path, elsewhere by its last part. A host path itself matches nothing: where a
    session works on this host is not a reader's to find out by trying paths."""
    relative = PurePosixPath(shown)
    if relative.is_absolute() or ".." in relative.parts:
        return Q(pk__in=[])
    state_dir = Path(settings.STATE_DIR).resolve()
    under_state_dir = Q(cwd=str(state_dir / relative))
    if len(relative.parts) != 1:
        return under_state_dir
    return under_state_dir | (Q(cwd__endswith=f"/{shown}") & ~Q(cwd__startswith=f"{state_dir}/"))


def _sessions_filtered(
    agent_id: str | None, label: str | None, search: str | None, archived: bool | str, filters: RowFilters
) -> QuerySet[Session]:
    qs: QuerySet[Session] = Session.objects.defer(*_UNSHOWN_COLUMNS)
    if filters.updated_since is not None:
        qs = qs.filter(updated_at__gte=filters.updated_since)
    if filters.parent_key is not None:
        qs = qs.filter(parent_session_key=filters.parent_key)
    if filters.pinned is not None:
        qs = qs.filter(pinned_at__isnull=not filters.pinned)
    if filters.category is not None:
        qs = qs.filter(category=filters.category)
    if filters.shown_cwd is not None:
        qs = qs.filter(_shown_cwd_is(filters.shown_cwd))
    if filters.with_interaction:
        qs = qs.filter(last_interaction_at__isnull=False)
    if agent_id is not None:
        qs = qs.filter(agent_id=agent_id)
    if label is not None:
        qs = qs.filter(label=label)
    if search:
        qs = qs.filter(Q(key__icontains=search) | Q(label__icontains=search) | Q(display_name__icontains=search))
    if archived is True:
        qs = qs.filter(archived_at__isnull=False)
    elif archived is False:
        qs = qs.filter(archived_at__isnull=True)
    return qs.order_by("-updated_at", "-id")


def newest_message_bodies(window: SessionWindow, *, limit: int) -> list[dict]:
    """The bodies of the newest ``limit`` messages of the active path, oldest first (every turn's model context:
    bodies only, no instances to build for each of up to a few hundred rows)."""
    bodies = list(
        TranscriptEvent.objects.filter(window=window, type="message")
        .order_by("-seq")
        .values_list("body", flat=True)[:limit]
    )
    bodies.reverse()
    return bodies


def active_path(window: SessionWindow, *, limit: int | None = None) -> list[TranscriptEvent]:
    """Message events of the active path, oldest first (the newest ``limit`` when given).

    A window's transcript is linear: every append follows the current leaf (``parent_id``), and
    forks copy the active path into a new window. So the active path is the message events in
    ``seq`` order, and a page of it costs one indexed query whatever the transcript's length.
    """
    if limit is None:
        return list(TranscriptEvent.objects.filter(window=window, type="message").order_by("seq"))
    newest = list(TranscriptEvent.objects.filter(window=window, type="message").order_by("-seq")[:limit])
    newest.reverse()
    return newest


HISTORY_TEXT_LIMIT = 12_000


def history_text(text: str, limit: int = HISTORY_TEXT_LIMIT) -> str:
    return text if len(text) <= limit else text[:limit] + "\n...(truncated)..."


def _history_value(value, limit: int = HISTORY_TEXT_LIMIT):
    """A tool call's arguments as history shows them: every string cut like message text (a ``write`` may
    carry megabytes; the transcript keeps them whole)."""
    if isinstance(value, str):
        return history_text(value, limit)
    if isinstance(value, dict):
        return {key: _history_value(item, limit) for key, item in value.items()}
    if isinstance(value, list):
        return [_history_value(item, limit) for item in value]
    return value


def history_message(event: TranscriptEvent, *, text_limit: int = HISTORY_TEXT_LIMIT) -> dict:
    """A transcript message as history shows it, each text cut at ``text_limit`` characters."""
    body = dict(event.body)
    content = body.get("content", [])
    if isinstance(content, str):  # an older shape, or a node's: the text itself
        body["content"] = history_text(content, text_limit)
    elif isinstance(content, list):
        body["content"] = [_history_part(part, text_limit) for part in content]
    body["__openclaw"] = {"id": event.event_id, "seq": event.seq}
    return body


def _history_part(part: Any, text_limit: int) -> Any:
    if not isinstance(part, dict):
        return part  # not a part this gateway writes (a node may record one): shown as it is
    text = part.get("text")
    if part.get("type") == "text" and isinstance(text, str) and len(text) > text_limit:
        return {**part, "text": history_text(text, text_limit)}
    if part.get("type") == "toolCall":
        return {**part, "arguments": _history_value(part.get("arguments"), text_limit)}
    return part


def chat_history(session: Session, *, limit: int = 200) -> dict:
    window = SessionWindow.objects.get(pk=session.session_id)
    messages = [history_message(event) for event in active_path(window, limit=limit)]
    return {
        "sessionKey": session.key,
        "sessionId": session.session_id,
        "messages": messages,
        "totalMessages": window.message_count,
        "hasMore": window.message_count > limit,
    }


@dataclass(frozen=True)
class SessionStatus:
    """What ``/status`` typed in chat reports of a session and the gateway serving it."""

    gateway_version: str
    gateway_uptime_ms: int
    session_key: str
    session_id: str
    model_provider: str
    model: str
    default_model: str
    input_tokens: int
    output_tokens: int
    messages: int
    updated_at: datetime | None
    # The session row's ``placement`` (workers_app's projection), None for a session never placed.
    placement: dict | None
    running: bool
    queued: int
    last_turn: str


def session_status(session: Session) -> SessionStatus:
    """The facts of ``/status``: the row's own fields, its placement, the transcript's size, its turns now."""
    turns = dict(
        Run.objects.filter(session=session, status__in=(RunStatus.QUEUED, RunStatus.RUNNING))
        .values_list("status")
        .annotate(count=Count("run_id"))
        .order_by("status")
    )
    model = resolved_model(session)
    return SessionStatus(
        gateway_version=SERVER_VERSION,
        gateway_uptime_ms=state.uptime_ms(),
        session_key=session.key,
        session_id=session.session_id,
        model_provider=model["modelProvider"],
        model=model["model"],
        default_model=default_model(),
        input_tokens=session.input_tokens,
        output_tokens=session.output_tokens,
        messages=SessionWindow.objects.filter(pk=session.session_id).values_list("message_count", flat=True).get(),
        updated_at=session.updated_at,
        placement=session_row(session).get("placement"),
        running=turns.get(RunStatus.RUNNING.value, 0) > 0,
        queued=turns.get(RunStatus.QUEUED.value, 0),
        last_turn=session.status,
    )


def recent_runs(session: Session, *, limit: int = 20) -> list[Run]:
    """The session's newest turns, newest first (one indexed query; the long text columns left out)."""
    return list(Run.objects.filter(session=session).defer("message", "output_text").order_by("-created_at")[:limit])


def runs_page(*, limit: int, offset: int, status: str | None = None) -> tuple[list[Run], bool]:
    """Turns of every session, newest first, plus whether more follow (one query; long texts left out)."""
    qs = Run.objects.defer("message", "output_text").order_by("-created_at", "-run_id")
    if status is not None:
        qs = qs.filter(status=status)
    rows = list(qs[offset : offset + limit + 1])
    return rows[:limit], len(rows) > limit


def _cursor_time(value) -> datetime:
    moment = datetime.fromisoformat(cursor_str(value))
    if moment.tzinfo is None:
        raise ValueError("naive time")
    return moment


def runs_list_payload(query: RunsListParams) -> dict:
    """The JSON API's runs list: one page, newest first, and the cursor of the next (None on the last).

    Keyset on ``(created_at, run_id)``; one query (the long text columns left out)."""
    qs = Run.objects.only("run_id", "session_key", "status", "created_at", "started_at", "ended_at", "error")
    if query.status is not None:
        qs = qs.filter(status=query.status)
    if query.sessionKey is not None:
        qs = qs.filter(session__key=keys.canonical_key(query.sessionKey))
    if query.cursor is not None:
        created_at, run_id = cursor_decode(query.cursor, _cursor_time, cursor_str)
        # The `created_at <= …` term is implied by the other two; it is there for the planners (SQLite and
        # PostgreSQL), which seek run_recent_idx to a range bound but walk the index from its start under an OR
        # alone: without it a page's cost grows with its depth in the cursor chain.
        qs = qs.filter(
            Q(created_at__lte=created_at),
            Q(created_at__lt=created_at) | Q(created_at=created_at, run_id__lt=run_id),
        )
    rows = list(qs.order_by("-created_at", "-run_id")[: query.limit + 1])
    page, more = rows[: query.limit], len(rows) > query.limit
    return {
        "runs": [
            {
                "runId": run.run_id,
                "sessionKey": run.session_key,
                "status": run.status,
                "createdAt": _ms(run.created_at),
                "startedAt": _ms(run.started_at),
                "endedAt": _ms(run.ended_at),
                "error": run.error or None,
            }
            for run in page
        ],
        "nextCursor": cursor_encode(page[-1].created_at.isoformat(), page[-1].run_id) if more else None,
    }


def run_get(run_id: str) -> Run | None:
    return Run.objects.filter(run_id=run_id).first()


def run_row(run: Run) -> dict:
    """A run as the JSON API shows it (its stored status, unlike agent.wait's ok/error)."""
    return {
        "runId": run.run_id,
        "sessionKey": run.session_key,
        "status": run.status,
        "startedAt": _ms(run.started_at),
        "endedAt": _ms(run.ended_at),
        "error": run.error or None,
        "outputText": run.output_text if run.is_terminal else None,
    }


def run_wait_payload(run: Run) -> dict:
    status = {"ok": "ok", "error": "error", "aborted": "error"}.get(run.status)
    payload: dict = {"runId": run.run_id, "status": status}
    if run.started_at:
        payload["startedAt"] = _ms(run.started_at)
    if run.ended_at:
        payload["endedAt"] = _ms(run.ended_at)
    if run.status == "ok":
        payload["outputText"] = run.output_text
        payload["terminalReply"] = {"disposition": "visible", "text": run.output_text}
    elif run.status == "aborted":
        payload["error"] = "aborted"
        payload["aborted"] = True
        payload["outputText"] = run.output_text
    else:
        payload["error"] = run.error
    return payload


def transcript_part(session: Session, entry_id: str, index: int) -> Any:
    """Part ``index`` of the content of a message of any of the session's transcripts (``None`` when there is none)."""
    body = (
        TranscriptEvent.objects.filter(window__session=session, event_id=entry_id, type="message")
        .values_list("body", flat=True)
        .first()
    )
    content = body.get("content") if isinstance(body, dict) else None
    if not isinstance(content, list) or not 0 <= index < len(content):
        return None
    return content[index]


def tool_artifact_get(artifact_id: str) -> ToolArtifact | None:
    """A tool's whole output, while the session it was recorded in exists (one query)."""
    return (
        ToolArtifact.objects.filter(pk=artifact_id)
        .filter(Exists(Session.objects.filter(key=OuterRef("session_key"))))
        .first()
    )


# --- for /metrics (operations_app.metrics): cheap, indexed (run_status_heartbeat_idx leads with status) ---------


def active_run_counts() -> dict[str, int]:
    """Runs queued and running now (both keys always present)."""
    counts = {RunStatus.QUEUED.value: 0, RunStatus.RUNNING.value: 0}
    rows = (
        Run.objects.filter(status__in=tuple(counts))
        .values_list("status")
        .annotate(count=Count("run_id"))
        .order_by("status")
    )
    for status, count in rows:
        counts[status] = count
    return counts


def oldest_running_run_started_at() -> datetime | None:
    return Run.objects.filter(status=RunStatus.RUNNING).aggregate(oldest=Min("started_at"))["oldest"]
