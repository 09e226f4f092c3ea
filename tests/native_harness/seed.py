"""The seed's fixture: a source session continuing a native thread, with a supervision binding and
an upstream link to it; the fork point is its second user message. Used by the in-process tests
(``conftest.seeded``) and by the end-to-end ones against a real gateway (``tests/e2e/test_fork.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from native_harness import services
from native_harness.harness import CATALOG_ID, HOST_ID, UPSTREAM_KIND, harness
from sessions_app.models import Session, TranscriptEvent
from sessions_app.services import links

SOURCE_KEY = "agent:main:source"
TURNS = [
    ("user", "first question"),
    ("assistant", "first answer"),
    ("user", "second question"),
    ("assistant", "second answer"),
]


@dataclass
class Fixture:
    source_thread_id: str
    source: Session
    entry_id: str
    source_link: dict

    @property
    def source_identity(self) -> tuple[str, str]:
        return self.source.agent_id, self.source.session_id


def source_link(thread_id: str) -> dict:
    return {
        "sessionKey": SOURCE_KEY,
        "agentId": "main",
        "catalogId": CATALOG_ID,
        "hostId": HOST_ID,
        "threadId": thread_id,
        "upstreamKind": UPSTREAM_KIND,
        "upstreamRef": {"connectionFingerprint": services.current_fingerprint(), "threadId": thread_id},
        "marker": None,
    }


def seed_source() -> Fixture:
    """The source session (adopted from a fresh native thread, so bound to it under supervision) and its link."""
    thread = services.thread_create(TURNS)
    created = harness.adopt_thread(thread_id=thread.thread_id, agent_id="main", key=SOURCE_KEY)
    link = source_link(thread.thread_id)
    assert links.link_upsert(link)
    second_user = TranscriptEvent.objects.filter(window_id=created.session_id, body__role="user").order_by("seq")[1]
    return Fixture(
        source_thread_id=thread.thread_id,
        source=Session.objects.get(key=SOURCE_KEY),
        entry_id=second_user.event_id,
        source_link=link,
    )
