"""Upstream links: upsert (if absent), compare-and-delete, commit guard, fork-source check."""

from __future__ import annotations

import pytest

from sessions_app import stages
from sessions_app.models import SessionUpstreamLink
from sessions_app.services import links

pytestmark = pytest.mark.django_db(transaction=True)


def link(key: str = "agent:main:a", **changes) -> dict:
    return {
        "sessionKey": key,
        "agentId": "main",
        "catalogId": "native",
        "hostId": "gateway:local",
        "threadId": "thread-1",
        "upstreamKind": "native-threads",
        "upstreamRef": {"threadId": "thread-1"},
        "marker": None,
        **changes,
    }


def test_upsert_if_absent_keeps_the_existing_row():
    assert links.link_upsert(link())
    assert not links.link_upsert(link(threadId="other"), if_absent=True)
    assert links.link_read("agent:main:a", "main")["threadId"] == "thread-1"
    assert links.link_read("agent:main:a", "other-agent") is None


def test_upsert_resets_the_marker_only_when_the_source_identity_changes():
    assert links.link_upsert(link(marker={"turnId": "t1"}))
    assert links.link_upsert(link(marker=None))  # same identity: the stored marker stays
    assert links.link_read("agent:main:a", "main")["marker"] == {"turnId": "t1"}
    assert links.link_upsert(link(threadId="thread-2", marker=None))
    assert links.link_read("agent:main:a", "main")["marker"] is None


def test_delete_with_expected_compares_exactly():
    assert links.link_delete("agent:main:a", "main") == "absent"
    links.link_upsert(link())
    assert links.link_delete("agent:main:a", "main", expected=link(threadId="other")) == "changed"
    assert links.link_delete("agent:main:a", "main", expected=link()) == "deleted"
    assert not SessionUpstreamLink.objects.exists()


def test_a_guard_failing_at_commit_undoes_the_write():
    calls = []

    def guard():
        calls.append(1)
        if len(calls) == 2:  # fine before the write, refused just before COMMIT
            raise RuntimeError("initialization closed")

    with pytest.raises(RuntimeError, match="initialization closed"):
        links.link_upsert(link(), assert_commit_allowed=guard)
    assert not SessionUpstreamLink.objects.exists()


def test_the_fork_source_is_checked_before_the_write_and_at_commit():
    source = link("agent:main:source")
    links.link_upsert(source)
    with pytest.raises(links.UpstreamSourceChanged, match="Session upstream source changed during initialization"):
        links.link_upsert(link("agent:main:child"), source={**source, "threadId": "moved"})

    def move_source(link, **_):
        if link["sessionKey"] == "agent:main:child":
            SessionUpstreamLink.objects.filter(session_key="agent:main:source").update(thread_id="moved")

    with (
        stages.listening("link.write.before_commit", move_source),
        pytest.raises(links.UpstreamSourceChanged),
    ):
        links.link_upsert(link("agent:main:child"), source=source)
    assert links.link_read("agent:main:child", "main") is None
