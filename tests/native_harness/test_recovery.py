"""A process killed in the middle of a fork, the admin's "clear stuck initialization", and
concurrent forks of one source: never a half state."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading

import pytest
from django.db import connections

from gateway.models import AuditLog
from native_harness import services
from native_harness.models import NativeThread
from sessions_app.models import Session
from sessions_app.services import forks, links
from tests.support.processes import ROOT, current_database_url

from .conftest import SOURCE_KEY

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "harness"])

KILL_SCRIPT = """
import os
from sessions_app import stages
from sessions_app.services import forks
kill_at = stages.listening({stage!r}, lambda **_: os._exit(137))  # kept: collecting it would unregister
kill_at.__enter__()
forks.session_fork(session_key={source!r}, entry_id={entry!r})
print("fork finished without being killed")
"""


def fork_in_a_process_killed_at(stage: str, seeded) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "DATABASE_URL": current_database_url(),
        "HARNESS_DATABASE_URL": current_database_url("harness"),
        "OPENCLAW_STATE_DIR": tempfile.mkdtemp(prefix="killed-fork-"),
        "DB_CONN_MAX_AGE": "0",
    }
    script = KILL_SCRIPT.format(stage=stage, source=SOURCE_KEY, entry=seeded.entry_id)
    return subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def children() -> list[Session]:
    return list(Session.objects.exclude(key=SOURCE_KEY))


def test_a_fork_killed_mid_initialization_leaves_a_pending_child_the_admin_clears(seeded, admin_client):
    killed = fork_in_a_process_killed_at("initialization.binding.after_write", seeded)
    assert killed.returncode == 137, killed.stdout + killed.stderr
    (child,) = children()
    assert child.initialization_pending
    binding = services.binding_read("main", child.session_id)
    fresh = binding["threadId"]
    assert links.link_read(child.key, "main")["threadId"] == fresh
    # No turn and no fork is admitted while it is pending.
    with pytest.raises(Exception, match=f"Session {child.key} is initializing; retry fork later"):
        forks.session_fork(session_key=child.key, entry_id="any")

    response = admin_client.post(
        "/admin/sessions_app/session/",
        {"action": "clear_stuck_initializations", "_selected_action": [child.pk, seeded.source.pk]},
        follow=True,
    )
    messages = [str(m) for m in response.context["messages"]]
    assert messages == [f"1 done, 1 skipped: {SOURCE_KEY}: not initializing"]
    assert children() == []
    assert services.binding_read("main", child.session_id) is None
    assert links.link_read(child.key, "main") is None
    assert NativeThread.objects.get(thread_id=fresh).archived_at is not None
    assert NativeThread.objects.get(thread_id=seeded.source_thread_id).archived_at is None
    audit = AuditLog.objects.get(action="session.initialization.clear")
    assert (audit.target_id, audit.actor) == (child.key, "user:admin")


def test_a_fork_killed_after_readiness_leaves_a_complete_ready_child(seeded, admin_client):
    killed = fork_in_a_process_killed_at("initialization.readiness.published", seeded)
    assert killed.returncode == 137, killed.stdout + killed.stderr
    (child,) = children()
    assert not child.initialization_pending
    binding = services.binding_read("main", child.session_id)
    assert links.link_read(child.key, "main")["threadId"] == binding["threadId"]
    response = admin_client.post(
        "/admin/sessions_app/session/",
        {"action": "clear_stuck_initializations", "_selected_action": [child.pk]},
        follow=True,
    )
    assert [str(m) for m in response.context["messages"]] == [f"0 done, 1 skipped: {child.key}: not initializing"]
    assert Session.objects.filter(pk=child.pk).exists()


@pytest.mark.parametrize("linked", [True, False])
def test_concurrent_forks_of_one_source_never_leave_a_half_state(seeded, linked):
    if not linked:
        links.link_delete(SOURCE_KEY, "main")
    outcomes: list[str] = []
    barrier = threading.Barrier(3)

    def fork() -> None:
        barrier.wait()
        try:
            forks.session_fork(session_key=SOURCE_KEY, entry_id=seeded.entry_id)
            outcomes.append("created")
        except Exception as error:
            outcomes.append(getattr(error, "message", str(error)))
        finally:
            connections.close_all()  # both stores: an open session would keep the test databases from being dropped

    workers = [threading.Thread(target=fork) for _ in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert len(outcomes) == 3
    assert set(outcomes) <= {"created", f"Session {SOURCE_KEY} changed; retry fork."}
    for child in children():
        assert not child.initialization_pending
        if linked:
            binding = services.binding_read("main", child.session_id)
            assert binding is not None
            assert links.link_read(child.key, "main")["threadId"] == binding["threadId"]
    assert len(children()) == outcomes.count("created")
