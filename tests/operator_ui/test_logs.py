"""The console's Logs page: staff only, the newest lines of the gateway's log file, a level filter that works
without JavaScript, and the follow endpoint the page's script polls."""

from __future__ import annotations

import json

import pytest

from gateway import scopes as sc
from operator_ui import log_views
from tests.support.operators import operator_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(client, django_user_model):
    client.force_login(operator_user("boss", sc.ADMIN, is_staff=True))
    return client


@pytest.fixture
def log_path(tmp_path, settings):
    path = tmp_path / "gateway.log"
    settings.OPENCLAW_LOG_FILE = path
    return path


def line(level: str, message: str, **fields) -> str:
    return json.dumps(
        {"time": "2026-12-04T10:00:00+00:00", "level": level, "logger": "gateway.x", "process": "gateway-1"}
        | {"message": message}
        | fields
    )


def write(path, *lines: str) -> None:
    with open(path, "a", encoding="utf-8") as stream:
        stream.writelines(f"{text}\n" for text in lines)


def shown_messages(response) -> list[str]:
    return [entry.message for entry in response.context["entries"]]


def test_the_page_shows_the_newest_lines_oldest_first_with_their_context(staff_client, log_path):
    write(
        log_path,
        line("INFO", "first"),
        line("WARNING", "turn run-1 failed (model): <b>bad</b>", run_id="run-1", session_key="main"),
        "not json at all",
    )

    response = staff_client.get("/ui/logs/")

    assert response.status_code == 200
    assert shown_messages(response) == ["first", "turn run-1 failed (model): <b>bad</b>", "not json at all"]
    html = response.content.decode()
    assert "run_id=run-1 session_key=main" in html
    assert "&lt;b&gt;bad&lt;/b&gt;" in html and "<b>bad</b>" not in html
    assert 'aria-current="page">Logs</a>' in html
    assert f'data-cursor="{log_path.stat().st_size}"' in html


def test_the_level_filter_shows_that_level_and_above(staff_client, log_path):
    write(
        log_path,
        line("DEBUG", "d"),
        line("INFO", "i"),
        line("WARNING", "w"),
        line("ERROR", "e"),
        line("CRITICAL", "c"),
        "plain text",
    )

    assert shown_messages(staff_client.get("/ui/logs/?level=warning")) == ["w", "e", "c"]
    assert shown_messages(staff_client.get("/ui/logs/?level=ERROR")) == ["e", "c"]
    # An unknown level is no filter.
    assert len(shown_messages(staff_client.get("/ui/logs/?level=LOUD"))) == 6
    page = staff_client.get("/ui/logs/?level=WARNING").content.decode()
    assert '<option value="WARNING" selected>' in page


def test_the_line_count_is_one_of_the_offered_ones(staff_client, log_path):
    write(log_path, *(line("INFO", f"m{n}") for n in range(700)))

    assert shown_messages(staff_client.get("/ui/logs/?lines=100")) == [f"m{n}" for n in range(600, 700)]
    assert len(shown_messages(staff_client.get("/ui/logs/?lines=100000"))) == log_views.DEFAULT_LINE_COUNT
    assert len(shown_messages(staff_client.get("/ui/logs/?lines=x"))) == log_views.DEFAULT_LINE_COUNT


def test_a_rare_level_fills_the_page_from_the_whole_window(staff_client, log_path):
    write(log_path, line("ERROR", "old error"), *(line("INFO", f"m{n}") for n in range(3000)))

    assert shown_messages(staff_client.get("/ui/logs/?level=ERROR&lines=100")) == ["old error"]


def test_follow_returns_the_lines_after_the_cursor_filtered_like_the_page(staff_client, log_path):
    write(log_path, line("INFO", "before"))
    cursor = staff_client.get("/ui/logs/").context["cursor"]
    write(log_path, line("INFO", "new info"), line("ERROR", "new error", request_id="req-9"))

    everything = staff_client.get(f"/ui/logs/tail?cursor={cursor}").json()
    errors = staff_client.get(f"/ui/logs/tail?cursor={cursor}&level=ERROR").json()

    assert [entry["message"] for entry in everything["entries"]] == ["new info", "new error"]
    assert everything["cursor"] == log_path.stat().st_size and everything["reset"] is False
    assert errors["entries"] == [
        {
            "time": "2026-12-04T10:00:00+00:00",
            "level": "ERROR",
            "logger": "gateway.x",
            "process": "gateway-1",
            "message": "new error",
            "context": "request_id=req-9",
        }
    ]
    assert staff_client.get(f"/ui/logs/tail?cursor={everything['cursor']}").json()["entries"] == []


def test_follow_after_a_rotation_resets(staff_client, log_path):
    write(log_path, *(line("INFO", f"m{n}") for n in range(50)))
    cursor = staff_client.get("/ui/logs/").context["cursor"]
    log_path.unlink()
    write(log_path, line("INFO", "fresh file"))

    answer = staff_client.get(f"/ui/logs/tail?cursor={cursor}").json()
    assert answer["reset"] is True and [entry["message"] for entry in answer["entries"]] == ["fresh file"]


@pytest.mark.parametrize("query", ["", "?cursor=", "?cursor=abc", "?cursor=-1"])
def test_follow_refuses_a_bad_cursor(staff_client, log_path, query):
    response = staff_client.get(f"/ui/logs/tail{query}")
    assert response.status_code == 400
    assert response.json() == {"error": "cursor must be a whole number"}


def test_without_a_log_file_the_page_says_so(staff_client, settings):
    settings.OPENCLAW_LOG_FILE = None

    page = staff_client.get("/ui/logs/")
    follow = staff_client.get("/ui/logs/tail?cursor=0")

    assert page.status_code == 200
    assert "no log file: OPENCLAW_LOG_FILE is set empty" in page.content.decode()
    assert follow.status_code == 503 and follow.json() == {"error": "no log file: OPENCLAW_LOG_FILE is set empty"}


def test_a_login_without_operator_read_is_refused_and_logged_out_users_go_to_the_login(client, log_path):
    """``logs.tail`` asks ``operator.read`` on the wire: so does the page (a login holding only another scope
    gets 403 and no line)."""
    write(log_path, line("INFO", "secret-ish line"))
    client.force_login(operator_user("approver", sc.APPROVALS))

    for url in ("/ui/logs/", "/ui/logs/tail?cursor=0"):
        refused = client.get(url)
        assert refused.status_code == 403 and b"secret-ish line" not in refused.content
    assert b'href="/ui/logs/"' not in client.get("/ui/approvals/").content
    client.logout()
    assert client.get("/ui/logs/")["Location"].startswith("/ui/login/")


def test_a_reader_reads_the_log(client, log_path):
    write(log_path, line("INFO", "an ordinary line"))
    client.force_login(operator_user("reader", sc.READ))

    assert "an ordinary line" in client.get("/ui/logs/").content.decode()
    assert b'href="/ui/logs/"' in client.get("/ui/sessions/").content


def test_only_get_is_allowed(staff_client, log_path):
    assert staff_client.post("/ui/logs/").status_code == 405
