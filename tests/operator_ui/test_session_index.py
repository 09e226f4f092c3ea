"""The sessions list as an index (``operator_ui/session_list_views.py``, ``sessions_app/session_index.py``): the
transcript search on both databases, the row's figures, the sort and page-size allow-lists, the bulk actions with
their scopes, stale revisions and audit rows, and a bounded number of queries per page."""

from __future__ import annotations

import html
import re
import uuid

import pytest
from django.contrib.postgres.search import SearchQuery
from django.db import connection
from django.db.models import F
from django.urls import reverse

from gateway import scopes as sc
from gateway.audit import Actor
from gateway.models import AuditLog
from sessions_app.models import Run, Session, TranscriptEvent
from sessions_app.services import runs, sessions
from sessions_app.services.transcripts import append_many
from sessions_app.session_index import PREVIEW_SHOWN, MessageTextVector, preview_line
from tests.operator_ui.test_session_actions import messages_of
from tests.operator_ui.test_session_fork import with_transcript
from tests.operator_ui.test_tool_transcript import running_turn
from tests.operator_ui.test_views import make, text_of
from tests.support.operators import operator_user

pytestmark = pytest.mark.django_db

LIST = reverse("ui:sessions")
ARCHIVE = reverse("ui:sessions-archive")
RESET = reverse("ui:sessions-reset")
ROW_KEY = re.compile(r'<a href="/ui/sessions/(agent:[^"/]+)/">')


def keys_listed(response) -> list[str]:
    assert response.status_code == 200
    return ROW_KEY.findall(text_of(response))


def finished_turn(session: Session, run_id: str, usage: dict | None, *, status: str = "ok", model: str = "") -> Run:
    runs.run_submit(session_key=session.key, message=f"message {run_id}", idempotency_key=run_id)
    runs.run_claim(run_id=run_id, executor="test")
    outcome = runs.TurnOutcome(status=status, text=f"reply {run_id}", usage=usage, model=model, model_provider="openai")
    return runs.run_finish(run_id=run_id, outcome=outcome)


def ticked(*session_list: Session) -> list[str]:
    """The checkbox values the list draws for these sessions as they are now."""
    return [f"{fresh(session).revision}:{session.key}" for session in session_list]


def fresh(session: Session) -> Session:
    return Session.objects.get(pk=session.pk)


@pytest.fixture
def writer_client(client):
    client.force_login(operator_user("writer", sc.WRITE))
    return client


@pytest.fixture
def admin_client(client):
    client.force_login(operator_user("boss", sc.ADMIN))
    return client


# --- search --------------------------------------------------------------------------------------


def test_the_search_finds_words_of_a_transcript_and_still_names_and_keys(writer_client):
    with_transcript("agent:main:deploys", ("user", "Please deploy the billing service"), ("assistant", "Done."))
    with_transcript("agent:main:other", ("user", "Write a haiku about rain"))
    make("agent:main:named", label="Billing review")

    by_words = keys_listed(writer_client.get(LIST, {"q": "billing"}))
    by_key = keys_listed(writer_client.get(LIST, {"q": "OTHER"}))
    nothing = writer_client.get(LIST, {"q": "nowhere-to-be-found"})

    assert sorted(by_words) == ["agent:main:deploys", "agent:main:named"]
    assert by_key == ["agent:main:other"]
    assert "No session matches these filters." in text_of(nothing)


def test_a_reset_transcript_is_searched_too(writer_client):
    session, _events = with_transcript("agent:main:earlier", ("user", "the zeppelin question"))
    sessions.session_reset(key=session.key)

    assert keys_listed(writer_client.get(LIST, {"q": "zeppelin"})) == ["agent:main:earlier"]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="full-text search is PostgreSQL's")
def test_on_postgresql_the_search_stems_words_and_takes_web_syntax(writer_client):
    with_transcript("agent:main:stem", ("user", "We were deploying all night"))
    with_transcript("agent:main:both", ("user", "rollback the deploy"), ("assistant", "deploy deploy rollback"))
    with_transcript("agent:main:only-rollback", ("user", "a rollback alone"))

    stemmed = keys_listed(writer_client.get(LIST, {"q": "deploys"}))
    excluded = keys_listed(writer_client.get(LIST, {"q": "rollback -deploy"}))
    phrase = keys_listed(writer_client.get(LIST, {"q": '"rollback the deploy"'}))

    assert sorted(stemmed) == ["agent:main:both", "agent:main:stem"]
    assert excluded == ["agent:main:only-rollback"]
    assert phrase == ["agent:main:both"]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the index is PostgreSQL's")
def test_on_postgresql_the_transcript_search_can_use_its_gin_index():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'transcript_text_search_idx'",
        )
        (definition,) = cursor.fetchone()
        cursor.execute("SET enable_seqscan = off")
        search = TranscriptEvent.objects.filter(type="message").annotate(vector=MessageTextVector(F("body")))
        search = search.filter(vector=SearchQuery("deploy", config="english", search_type="websearch"))
        plan = search.explain()
        cursor.execute("RESET enable_seqscan")

    assert "USING gin" in definition and "60000" in definition
    assert "transcript_text_search_idx" in plan


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a tsvector's limit is PostgreSQL's")
def test_on_postgresql_a_message_too_big_for_one_tsvector_is_stored_and_its_beginning_found(writer_client):
    """A tsvector holds at most 1 MB: 16,000 distinct ids (about 600,000 characters) make 1.2 MB of it. The index
    reads the first 60,000 characters only, so the message is stored, and a word there is found."""
    ids = " ".join(str(uuid.uuid4()) for _ in range(16_000))
    _, events = with_transcript("agent:main:huge", ("user", f"zanzibar\nquokka {ids} platypus"))

    assert len(events[0].body["content"][0]["text"]) > 590_000
    assert keys_listed(writer_client.get(LIST, {"q": "quokka"})) == ["agent:main:huge"]
    assert keys_listed(writer_client.get(LIST, {"q": "zanzibar"})) == ["agent:main:huge"]
    # Past the searched characters: not found (the console draws no more of a message either).
    assert keys_listed(writer_client.get(LIST, {"q": "platypus"})) == []


@pytest.mark.skipif(connection.vendor != "postgresql", reason="full-text search is PostgreSQL's")
def test_on_postgresql_escaped_characters_of_the_text_separate_words(writer_client):
    with_transcript("agent:main:escapes", ("user", 'line one\nsecond\t"quoted" back\\slash \u0001bell'))

    for word in ("second", "quoted", "back", "slash", "bell"):
        assert keys_listed(writer_client.get(LIST, {"q": word})) == ["agent:main:escapes"], word
    assert keys_listed(writer_client.get(LIST, {"q": "nsecond"})) == []


@pytest.mark.skipif(connection.vendor == "postgresql", reason="the fallback is SQLite's")
def test_on_sqlite_the_search_is_a_case_insensitive_containment_and_wildcards_are_literal(writer_client):
    with_transcript("agent:main:percent", ("user", "grew by 50% this year"))
    with_transcript("agent:main:plain", ("user", "DEPLOYING the app"), ("assistant", "a_b"))

    assert keys_listed(writer_client.get(LIST, {"q": "deployi"})) == ["agent:main:plain"]
    assert keys_listed(writer_client.get(LIST, {"q": "50%"})) == ["agent:main:percent"]
    assert keys_listed(writer_client.get(LIST, {"q": "%"})) == ["agent:main:percent"]
    assert keys_listed(writer_client.get(LIST, {"q": "_"})) == ["agent:main:plain"]


def test_messages_of_other_shapes_do_not_break_the_search(writer_client):
    """Content a node recorded as bare strings, or as one string (an older shape): nothing to search in them, and
    the search still answers for every other session."""
    odd = make("agent:main:odd")
    bodies = [
        {"role": "user", "content": ["just a string part"]},
        {"role": "assistant", "content": "the whole content as a string"},
        {"role": "assistant", "content": [{"type": "image", "data": "AAAA"}, 7, None]},
    ]
    append_many(window_id=odd.session_id, session_key=odd.key, bodies=bodies)
    with_transcript("agent:main:plain", ("user", "a string to find"))

    assert keys_listed(writer_client.get(LIST, {"q": "find"})) == ["agent:main:plain"]
    assert keys_listed(writer_client.get(LIST, {"q": "odd"})) == ["agent:main:odd"]


@pytest.mark.parametrize("hostile", ["'); DROP TABLE x; --", '"unbalanced', "& | ! :* <->", "\\", "%_%", "-", "or"])
def test_hostile_search_text_is_answered_not_an_error_and_shown_escaped(writer_client, hostile):
    with_transcript("agent:main:calm", ("user", "nothing special"))

    response = writer_client.get(LIST, {"q": hostile})

    assert response.status_code == 200
    assert Session.objects.filter(key="agent:main:calm").exists()
    assert f'value="{html.escape(hostile)}"' in text_of(response)


# --- what a row shows ----------------------------------------------------------------------------


def test_a_row_shows_the_newest_message_on_one_escaped_line_its_count_model_and_tokens(writer_client):
    long_reply = "line one\nline two <script>alert(1)</script> " + "x" * 300
    session, _events = with_transcript("agent:main:busy", ("user", "hello"), ("assistant", long_reply))
    finished_turn(session, "t1", {"input": 100, "output": 20, "cacheRead": 5}, model="gpt-test")
    finished_turn(session, "t2", {"input": "12", "output": -5, "cacheWrite": 7})  # bad values count as 0

    page = text_of(writer_client.get(LIST))

    row = page[page.index('href="/ui/sessions/agent:main:busy/"') :]
    row = row[: row.index("</tr>")]
    preview = re.search(r'<div class="preview">(.*?)</div>', row, re.S).group(1)
    assert preview == html.escape(preview_line("reply t2"))  # the newest message: t2's reply
    assert '<td data-label="Messages" class="figure">6</td>' in row  # 2 + a user message and a reply per turn
    assert '<td data-label="Tokens" class="figure">132</td>' in row  # 100 + 20 + 5 + 7
    assert '<td data-label="Model">gpt-test</td>' in row


def test_the_preview_is_one_line_cut_and_escaped(writer_client):
    with_transcript("agent:main:long", ("user", "a\n\tb  <b>bold</b> " + "word " * 100))

    page = text_of(writer_client.get(LIST))

    preview = html.unescape(re.search(r'<div class="preview">(.*?)</div>', page, re.S).group(1))
    assert preview.startswith("a b <b>bold</b> word") and preview.endswith("…")
    assert len(preview) <= PREVIEW_SHOWN and "\n" not in preview
    assert "&lt;b&gt;bold&lt;/b&gt;" in page


def test_status_pills_say_running_queued_failed_and_archived(writer_client):
    running = make("agent:main:running")
    running_turn(running, "r-running")
    queued = make("agent:main:queued")
    runs.run_submit(session_key=queued.key, message="wait", idempotency_key="r-queued")
    failed = make("agent:main:failed")
    finished_turn(failed, "r-failed", None, status="error")
    make("agent:main:idle")
    archived = make("agent:main:shelved")
    Session.objects.filter(pk=archived.pk).update(archived_at="2026-01-01T00:00:00Z")

    page = text_of(writer_client.get(LIST, {"archived": "all"}))

    def pills(key: str) -> list[str]:
        row = page[page.index(f'href="/ui/sessions/{key}/"') :]
        return re.findall(r'<span class="pill pill-[a-z]+">([a-z]+)</span>', row[: row.index("</tr>")])

    assert pills("agent:main:running") == ["running"]
    assert pills("agent:main:queued") == ["queued"]
    assert pills("agent:main:failed") == ["failed"]
    assert pills("agent:main:idle") == ["idle"]
    assert pills("agent:main:shelved") == ["idle", "archived"]


# --- sort and page size ----------------------------------------------------------------------------


@pytest.fixture
def three_sessions():
    """b: most messages and tokens, created first; c: updated last; a: label first."""
    b, _ = with_transcript("agent:main:b", ("user", "1"), ("assistant", "2"), ("user", "3"))
    finished_turn(b, "b1", {"input": 900, "output": 100})
    a, _ = with_transcript("agent:main:a", ("user", "1"))
    finished_turn(a, "a1", {"input": 10, "output": 1})
    c = make("agent:main:c")
    sessions.session_patch(key=a.key, changes={"label": "Alpha"})
    sessions.session_patch(key=b.key, changes={"label": "Beta"})
    sessions.session_patch(key=c.key, changes={"label": "Gamma"})
    return a, b, c


@pytest.mark.parametrize(
    ("sort", "expected"),
    [
        ("-updated", ["c", "b", "a"]),
        ("updated", ["a", "b", "c"]),
        ("-created", ["c", "a", "b"]),
        ("created", ["b", "a", "c"]),
        ("label", ["a", "b", "c"]),
        ("-label", ["c", "b", "a"]),
        ("-messages", ["b", "a", "c"]),
        ("messages", ["c", "a", "b"]),
        ("-tokens", ["b", "a", "c"]),
        ("tokens", ["c", "a", "b"]),
    ],
)
def test_each_column_sorts_both_ways(writer_client, three_sessions, sort, expected):
    assert keys_listed(writer_client.get(LIST, {"sort": sort})) == [f"agent:main:{name}" for name in expected]


@pytest.mark.parametrize("bad", ["password", "-", "--updated", "updated_at", "key); DROP", ""])
def test_a_sort_off_the_allow_list_is_the_default_without_an_error(writer_client, three_sessions, bad):
    response = writer_client.get(LIST, {"sort": bad})

    assert keys_listed(response) == ["agent:main:c", "agent:main:b", "agent:main:a"]
    assert 'aria-sort="descending"><a href="?sort=updated">Updated' in text_of(response)


def test_a_sort_header_turns_its_direction_and_keeps_the_search(writer_client, three_sessions):
    page = text_of(writer_client.get(LIST, {"sort": "label", "q": "agent"}))

    assert 'aria-sort="ascending"><a href="?q=agent&amp;sort=-label">Session' in page
    assert '<a href="?q=agent&amp;sort=-tokens">Tokens' in page


@pytest.mark.parametrize(("size", "shown"), [("25", 25), ("100", 60), ("7", 50), ("x", 50), ("-25", 50), ("", 50)])
def test_the_page_size_is_one_of_the_allowed_else_the_default(writer_client, size, shown):
    for index in range(60):
        make(f"agent:main:s{index:03d}")

    listed = keys_listed(writer_client.get(LIST, {"size": size}))

    assert len(listed) == shown


def test_the_next_page_keeps_the_sort_and_size(writer_client):
    for index in range(30):
        make(f"agent:main:s{index:03d}")

    first = writer_client.get(LIST, {"size": "25", "sort": "created"})
    second = writer_client.get(LIST, {"size": "25", "sort": "created", "page": "2"})

    assert 'rel="next" href="?sort=created&amp;size=25&amp;page=2"' in text_of(first)
    assert keys_listed(first)[0] == "agent:main:s000" and keys_listed(second) == [
        f"agent:main:s{index:03d}" for index in range(25, 30)
    ]


def test_a_page_costs_a_bounded_number_of_queries_however_many_rows(writer_client, django_assert_max_num_queries):
    for index in range(3):
        session, _ = with_transcript(f"agent:main:few{index}", ("user", "hello"))
        finished_turn(session, f"few{index}", {"input": 1, "output": 1})
    with django_assert_max_num_queries(8) as few:
        writer_client.get(LIST, {"q": "hello", "sort": "-tokens"})
    for index in range(60):
        session, _ = with_transcript(f"agent:main:many{index}", ("user", "hello"))
        finished_turn(session, f"many{index}", {"input": 1, "output": 1})
    running_turn(make("agent:main:running"), "still-running")
    with django_assert_max_num_queries(len(few.captured_queries)):
        response = writer_client.get(LIST, {"q": "hello", "sort": "-tokens", "size": "200"})

    assert len(keys_listed(response)) == 63


# --- bulk actions ----------------------------------------------------------------------------------


def test_archiving_ticked_sessions_goes_through_the_service_and_is_audited_per_session(writer_client):
    first, second, untouched = make("agent:main:one"), make("agent:main:two"), make("agent:main:three")

    response = writer_client.post(ARCHIVE, {"session": ticked(first, second), "archive": "true", "sort": "label"})

    assert response.status_code == 302 and response["Location"] == f"{LIST}?sort=label"
    assert messages_of(response) == ["Archive: 2 done, 0 skipped."]
    assert fresh(first).archived_at and fresh(second).archived_at and not fresh(untouched).archived_at
    entries = AuditLog.objects.filter(action="session.patch").order_by("target_id")
    assert [(entry.target_id, entry.actor) for entry in entries] == [
        ("agent:main:one", "user:writer"),
        ("agent:main:two", "user:writer"),
    ]
    assert all(entry.data["changes"] == {"archived": True} for entry in entries)


def test_unarchiving_skips_what_is_not_archived_with_the_reason(writer_client):
    shelved, active = make("agent:main:shelved"), make("agent:main:active")
    sessions.session_patch(key=shelved.key, changes={"archived": True})

    response = writer_client.post(ARCHIVE, {"session": ticked(shelved, active), "archive": "false"})

    assert messages_of(response) == ["Unarchive: 1 done, 1 skipped: agent:main:active: not archived."]
    assert fresh(shelved).archived_at is None


def test_a_session_written_since_the_list_showed_it_is_skipped_and_the_others_done(writer_client):
    stale, current = make("agent:main:stale"), make("agent:main:current")
    shown = ticked(stale, current)
    sessions.session_patch(key=stale.key, changes={"label": "theirs"}, actor=Actor.system("user:other"))

    response = writer_client.post(ARCHIVE, {"session": shown, "archive": "true"})

    assert messages_of(response) == [
        "Archive: 1 done, 1 skipped: agent:main:stale: changed after the list showed it (revision 1, now 2)."
    ]
    assert fresh(stale).archived_at is None and fresh(stale).revision == 2
    assert fresh(current).archived_at is not None
    assert not AuditLog.objects.filter(action="session.patch", target_id=stale.key, actor="user:writer").exists()


def test_reset_is_an_admin_s_each_session_starts_a_new_transcript_and_is_audited(admin_client):
    first, _ = with_transcript("agent:main:r1", ("user", "old words"))
    busy = make("agent:main:r2")
    running_turn(busy, "busy-run")

    response = admin_client.post(RESET, {"session": ticked(first, busy)})

    assert messages_of(response) == [
        "Reset: 1 done, 1 skipped: agent:main:r2: Reset is unavailable while the agent is working."
    ]
    assert fresh(first).session_id != first.session_id
    assert fresh(busy).session_id == busy.session_id
    assert AuditLog.objects.filter(action="session.reset", target_id=first.key, actor="user:boss").count() == 1
    assert not AuditLog.objects.filter(action="session.reset", target_id=busy.key).exists()


@pytest.mark.parametrize(
    ("scopes", "url", "data"),
    [
        ((sc.READ,), ARCHIVE, {"archive": "true"}),
        ((sc.WRITE,), RESET, {}),
        ((sc.PAIRING, sc.APPROVALS), ARCHIVE, {"archive": "true"}),
    ],
)
def test_a_login_without_the_scope_gets_403_and_nothing_changes(client, scopes, url, data):
    session = make("agent:main:guarded")
    client.force_login(operator_user("limited", *scopes))

    response = client.post(url, {"session": ticked(session), **data})

    assert response.status_code == 403
    stored = fresh(session)
    assert (stored.archived_at, stored.revision, stored.session_id) == (None, 1, session.session_id)
    assert not AuditLog.objects.exists()


def test_the_list_draws_no_checkbox_or_bulk_button_a_login_could_not_use(client):
    make("agent:main:seen")
    client.force_login(operator_user("reader", sc.READ))
    read_only = text_of(client.get(LIST))
    client.force_login(operator_user("writer", sc.WRITE))
    writer = text_of(client.get(LIST))

    assert 'type="checkbox"' not in read_only and "formaction" not in read_only
    assert 'value="1:agent:main:seen"' in writer
    assert ARCHIVE in writer and RESET not in writer


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"archive": "true"}, "Archive: no session was ticked. Nothing was changed."),
        ({"session": ["1:agent:main:x"]}, "Choose Archive or Unarchive. Nothing was changed."),
        ({"session": ["1:agent:main:x"], "archive": "maybe"}, "Choose Archive or Unarchive. Nothing was changed."),
        (
            {"session": [f"1:agent:main:s{index}" for index in range(201)], "archive": "true"},
            "Archive: at most 200 sessions at once. Nothing was changed.",
        ),
    ],
)
def test_a_bulk_form_without_a_choice_or_with_too_many_changes_nothing(writer_client, data, message):
    session = make("agent:main:x")

    response = writer_client.post(ARCHIVE, data)

    assert messages_of(response) == [message]
    assert fresh(session).archived_at is None and not AuditLog.objects.exists()


def test_unknown_and_malformed_ticks_are_skipped_with_their_reason(writer_client):
    real = make("agent:main:real")

    odd_numbers = ["²:agent:main:real", f"{'9' * 40}:agent:main:real"]
    response = writer_client.post(
        ARCHIVE,
        {
            "session": [*ticked(real), "1:agent:main:gone", "agent:main:real", "<b>x</b>", *odd_numbers],
            "archive": "true",
        },
    )

    assert messages_of(response) == [
        "Archive: 1 done, 5 skipped: agent:main:gone: no such session; "
        "agent:main:real: the list did not show its revision; reload it; "
        "<b>x</b>: the list did not show its revision; reload it; "
        "²:agent:main:real: the list did not show its revision; reload it; "
        f"{'9' * 40}:agent:main:real: the list did not show its revision; reload it."
    ]
    assert fresh(real).archived_at is not None
    page = text_of(writer_client.get(LIST))
    assert "<b>x</b>" not in page


def test_appended_messages_change_the_preview_and_count(writer_client):
    session, _ = with_transcript("agent:main:grow", ("user", "first"))
    append_many(
        window_id=session.session_id,
        session_key=session.key,
        bodies=[
            {
                "role": "assistant",
                "content": [{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "second"}],
            }
        ],
    )

    page = text_of(writer_client.get(LIST))

    assert '<div class="preview">second</div>' in page
    assert '<td data-label="Messages" class="figure">2</td>' in page
