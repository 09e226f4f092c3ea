"""The console's session index: a page of sessions with what a list of them shows — the newest message's text,
the message count, the tokens used, whether a turn runs or waits — in one query however long the page, plus a
search over the sessions' names and the text of their transcripts.

The transcript search is PostgreSQL full-text search on PostgreSQL: ``websearch_to_tsquery`` (quoted phrases,
``or``, ``-word``) against the text parts of every message of every transcript of the session (those before a
reset too; the first 60,000 characters of each message), English stemming, served by the expression index
``transcript_text_search_idx`` (migration 0010).
On SQLite it is a case-insensitive containment of the words as typed in a message's text parts (``LIKE``: case
is folded for ASCII letters only), with no index: the embedded profile is for one operator's machine.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.postgres.search import SearchQuery, SearchVectorField
from django.db import connection
from django.db.models import (
    Exists,
    F,
    FloatField,
    Func,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    TextField,
    Value,
)
from django.db.models.expressions import RawSQL
from django.db.models.fields.json import KT
from django.db.models.functions import Coalesce, Substr

from .models import Run, RunStatus, Session, SessionWindow, TranscriptEvent
from .run_usage import recorded_total_tokens

PAGE_SIZES = (25, 50, 100, 200)
DEFAULT_PAGE_SIZE = 50
# ``?sort=``: a column, descending with a leading "-"; each ends on the id so that pages never overlap.
SORT_COLUMNS = {
    "updated": "updated_at",
    "created": "created_at",
    "label": "label",
    "messages": "message_count",
    "tokens": "tokens_used",
}
DEFAULT_SORT = "-updated"
SEARCH_CONFIG = "english"
# The preview is cut in Python to one line; the database sends no more than this of a message.
PREVIEW_READ = 400
PREVIEW_SHOWN = 140
# A message's first text parts hold its words (a reply may open with its thinking or a tool call).
PREVIEW_PARTS = 3


# The characters of a message's text parts that are searched: a tsvector holds at most 1 MB, and an index whose
# expression went past it would refuse the message's insert. The console draws no more of a message either.
SEARCHED_CHARACTERS = 60_000


class MessageTextVector(Func):
    """The ``tsvector`` of the first :data:`SEARCHED_CHARACTERS` of a message body's text parts (their JSON array's
    text, each escape a space). Exactly the expression of ``transcript_text_search_idx`` (migration 0010): the
    planner uses the index only for the same expression."""

    template = (
        f"to_tsvector('{SEARCH_CONFIG}'::regconfig, regexp_replace("
        f"left((jsonb_path_query_array(%(expressions)s, '$.content[*].text'))::text, {SEARCHED_CHARACTERS}), "
        "'\\\\(u[0-9a-fA-F]{4}|.)', ' ', 'g'))"
    )
    output_field = SearchVectorField()


@dataclass(frozen=True)
class IndexRow:
    session: Session
    preview: str
    messages: int
    tokens: int
    status: str  # running | queued | failed | aborted | idle


def sort_choice(raw: str | None) -> str:
    """The ``?sort=`` asked for when it is on the allow-list, else the default (no error: it is a link's choice)."""
    if raw and raw.removeprefix("-") in SORT_COLUMNS:
        return raw
    return DEFAULT_SORT


def page_size_choice(raw: str | None) -> int:
    """The ``?size=`` asked for when it is one of :data:`PAGE_SIZES`, else the default."""
    try:
        size = int(raw or "")
    except ValueError:
        return DEFAULT_PAGE_SIZE
    return size if size in PAGE_SIZES else DEFAULT_PAGE_SIZE


def sessions_index_page(
    *, search: str | None, archived: bool | str, sort: str, limit: int, offset: int
) -> tuple[list[IndexRow], bool]:
    """One page of the index and whether more follow: one query (every figure is a subquery of the page's rows)."""
    queryset = _annotated(Session.objects.defer("plugin_extensions", "worktree"))
    if search:
        queryset = queryset.filter(
            Q(key__icontains=search)
            | Q(label__icontains=search)
            | Q(display_name__icontains=search)
            | Q(pk__in=_transcript_matches(search))
        )
    if archived is True:
        queryset = queryset.filter(archived_at__isnull=False)
    elif archived is False:
        queryset = queryset.filter(archived_at__isnull=True)
    descending = sort.startswith("-")
    column = SORT_COLUMNS[sort.removeprefix("-")]
    order = [f"-{column}" if descending else column]
    if column != "updated_at":
        order.append("-updated_at")
    order.append("-id" if descending else "id")
    rows = list(queryset.order_by(*order)[offset : offset + limit + 1])
    return [_row(session) for session in rows[:limit]], len(rows) > limit


def _annotated(queryset: QuerySet[Session]) -> QuerySet[Session]:
    runs = Run.objects.filter(session=OuterRef("pk"))
    newest_text = Coalesce(*(KT(f"body__content__{index}__text") for index in range(PREVIEW_PARTS)))
    newest_message = (
        TranscriptEvent.objects.filter(window_id=OuterRef("session_id"), type="message")
        .filter(Q(body__role="user") | Q(body__role="assistant"))
        .order_by("-seq")
        .annotate(preview=Substr(newest_text, 1, PREVIEW_READ))
        .values("preview")[:1]
    )
    tokens = runs.order_by().values("session").annotate(total=Sum(recorded_total_tokens())).values("total")
    return queryset.annotate(
        message_count=Coalesce(
            Subquery(SessionWindow.objects.filter(pk=OuterRef("session_id")).values("message_count")[:1]),
            Value(0),
            output_field=IntegerField(),
        ),
        tokens_used=Coalesce(Subquery(tokens, output_field=FloatField()), Value(0.0), output_field=FloatField()),
        preview=Subquery(newest_message, output_field=TextField()),
        turn_running=Exists(runs.filter(status=RunStatus.RUNNING)),
        turn_queued=Exists(runs.filter(status=RunStatus.QUEUED)),
    )


def _transcript_matches(search: str):
    """The ids of the sessions one of whose messages matches the search (on PostgreSQL found through
    ``transcript_text_search_idx``)."""
    if connection.vendor == "postgresql":
        query = SearchQuery(search, config=SEARCH_CONFIG, search_type="websearch")
        vectors = TranscriptEvent.objects.filter(type="message").annotate(vector=MessageTextVector(F("body")))
        return vectors.filter(vector=query).values("window__session_id")
    windows, events = SessionWindow._meta.db_table, TranscriptEvent._meta.db_table
    pattern = "%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    return RawSQL(
        f'SELECT "window"."session_id" FROM "{windows}" AS "window" '
        f'JOIN "{events}" AS "event" ON "event"."window_id" = "window"."id", '
        """json_each("event"."body", '$.content') AS "part" """
        """WHERE "event"."type" = 'message' """
        # A part that is not an object (a bare string of an older shape) has no text to search, and json_extract
        # would refuse it as malformed JSON.
        """AND CASE WHEN "part"."type" = 'object' THEN json_extract("part"."value", '$.text') END """
        """LIKE %s ESCAPE '\\'""",
        [pattern],
    )


def _row(session: Session) -> IndexRow:
    if session.turn_running:
        status = "running"
    elif session.turn_queued:
        status = "queued"
    elif session.status == "failed":
        status = "failed"
    elif session.status == "killed":
        status = "aborted"
    else:
        status = "idle"
    return IndexRow(
        session=session,
        preview=preview_line(session.preview or ""),
        messages=session.message_count,
        tokens=round(session.tokens_used),
        status=status,
    )


def preview_line(text: str) -> str:
    """One line of at most :data:`PREVIEW_SHOWN` characters: whitespace runs (newlines too) become one space."""
    line = " ".join(text.split())
    return line if len(line) <= PREVIEW_SHOWN else line[: PREVIEW_SHOWN - 1].rstrip() + "…"
