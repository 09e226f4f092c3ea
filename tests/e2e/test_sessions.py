"""sessions.* over real sockets against a real gateway (and a real Celery worker when Redis is there)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

from openclaw_client.client import GatewayError
from sessions_app.models import Run, Session, SessionWindow, TranscriptEvent
from tests.support.clients import operator

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_create_list_describe_patch_reset_delete(gateway):
    async def scenario():
        client = operator(gateway)
        await client.connect()
        created = await client.request("sessions.create", {"label": "alpha", "agentId": "main"})
        named = await client.request("sessions.create", {"key": "project-x", "displayName": "Project X"})
        with pytest.raises(GatewayError) as duplicate:
            await client.request("sessions.create", {"key": "project-x"})
        listed = await client.request("sessions.list", {"limit": 10})
        by_label = await client.request("sessions.list", {"label": "alpha"})
        described = await client.request("sessions.describe", {"key": "project-x"})
        missing = await client.request("sessions.describe", {"key": "nope"})
        patched = await client.request("sessions.patch", {"key": "project-x", "label": "renamed", "pinned": True})
        reset = await client.request("sessions.reset", {"key": "project-x"})
        with pytest.raises(GatewayError) as stale:
            await client.request(
                "sessions.patch", {"key": "project-x", "label": "x", "expectedSessionId": named["sessionId"]}
            )
        deleted = await client.request("sessions.delete", {"key": created["key"]})
        deleted_again = await client.request("sessions.delete", {"key": created["key"]})
        await client.close()
        return (
            created,
            named,
            duplicate.value,
            listed,
            by_label,
            described,
            missing,
            patched,
            reset,
            stale.value,
            deleted,
            deleted_again,
        )

    (created, named, duplicate, listed, by_label, described, missing, patched, reset, stale, deleted, deleted_again) = (
        asyncio.run(scenario())
    )
    assert created["key"].startswith("agent:main:dashboard:")
    assert created["runStarted"] is False
    assert created["entry"]["label"] == "alpha"
    assert created["resolved"] == {"modelProvider": "echo", "model": "echo"}
    assert named["key"] == "agent:main:project-x"
    assert (duplicate.code, duplicate.message) == ("INVALID_REQUEST", "session already exists: agent:main:project-x")
    assert {s["key"] for s in listed["sessions"]} == {created["key"], named["key"]}
    assert listed["hasMore"] is False and listed["count"] == 2
    assert [s["key"] for s in by_label["sessions"]] == [created["key"]]
    assert described["session"]["displayName"] == "Project X"
    assert missing == {"session": None}
    assert patched["entry"]["label"] == "renamed" and patched["entry"]["pinned"] is True
    assert reset["entry"]["sessionId"] != named["sessionId"]
    assert reset["entry"]["lifecycleRevision"] != named["entry"]["lifecycleRevision"]
    assert stale.message == "Session agent:main:project-x changed; retry."
    assert stale.details["sessionId"] == reset["entry"]["sessionId"]
    assert deleted["deleted"] is True and deleted_again["deleted"] is False
    assert Session.objects.get(key="agent:main:project-x").label == "renamed"
    assert SessionWindow.objects.filter(session__key="agent:main:project-x").count() == 2
    assert not Session.objects.filter(key=created["key"]).exists()


def test_list_pages_with_has_more(gateway):
    async def scenario():
        client = operator(gateway)
        await client.connect()
        for index in range(5):
            await client.request("sessions.create", {"key": f"page-{index}"})
        first = await client.request("sessions.list", {"limit": 2})
        second = await client.request("sessions.list", {"limit": 2, "offset": 2})
        third = await client.request("sessions.list", {"limit": 2, "offset": 4})
        searched = await client.request("sessions.list", {"search": "page-3"})
        with pytest.raises(GatewayError) as bad:
            await client.request("sessions.list", {"limit": 0})
        await client.close()
        return first, second, third, searched, bad.value

    first, second, third, searched, bad = asyncio.run(scenario())
    keys = [s["key"] for page in (first, second, third) for s in page["sessions"]]
    assert keys == [f"agent:main:page-{i}" for i in (4, 3, 2, 1, 0)]
    assert (first["hasMore"], second["hasMore"], third["hasMore"]) == (True, True, False)
    assert first["nextOffset"] == 2 and third["nextOffset"] is None
    assert [s["key"] for s in searched["sessions"]] == ["agent:main:page-3"]
    assert bad.message.startswith("invalid sessions.list params: at /limit:")


def test_sessions_changed_reaches_subscribers_after_commit_in_order(gateway):
    async def scenario():
        watcher = operator(gateway)
        await watcher.connect()
        assert await watcher.request("sessions.subscribe") == {"subscribed": True}
        other = operator(gateway)
        await other.connect()
        created = await other.request("sessions.create", {"key": "watched"})
        await other.request("sessions.patch", {"key": "watched", "label": "one"})
        await other.request("sessions.reset", {"key": "watched"})
        await other.request("sessions.delete", {"key": "watched"})
        seen = [await watcher.next_event("sessions.changed") for _ in range(4)]
        assert await watcher.request("sessions.unsubscribe") == {"subscribed": False}
        await other.request("sessions.create", {"key": "unwatched"})
        await asyncio.sleep(0.3)
        late = [f for f in watcher.drain_events() if f["event"] == "sessions.changed"]
        # The creator did not subscribe: it gets none.
        creator_saw = [f for f in other.drain_events() if f["event"] == "sessions.changed"]
        await other.close()
        await watcher.close()
        return created, seen, late, creator_saw

    created, seen, late, creator_saw = asyncio.run(scenario())
    assert [e["payload"]["reason"] for e in seen] == ["create", "patch", "reset", "delete"]
    assert all(e["payload"]["sessionKey"] == "agent:main:watched" for e in seen)
    assert seen[1]["payload"]["label"] == "one"
    assert seen[2]["payload"]["sessionId"] != created["sessionId"]
    assert seen[3]["payload"]["deleted"] is True
    assert [e["seq"] for e in seen] == sorted(e["seq"] for e in seen)
    assert late == [] and creator_saw == []


def test_bad_input_changes_nothing(gateway):
    async def scenario():
        client = operator(gateway)
        await client.connect()
        errors = []
        for params in (
            {"key": "agent:"},
            {"key": "x", "cwd": "/tmp"},
            {"key": "x", "worktree": True, "cwd": "relative/path"},
            {"key": "x", "worktreeName": "feature"},
            {"key": "x", "worktree": True, "execNode": "n1"},
            {"key": "x", "worktree": True, "worktreeName": "Bad Name"},
            {"key": "x", "worktree": True, "cwd": "/"},
            {"key": "x", "unknown": 1},
        ):
            with pytest.raises(GatewayError) as failed:
                await client.request("sessions.create", params)
            errors.append(failed.value.message)
        with pytest.raises(GatewayError) as patch_unknown:
            await client.request("sessions.patch", {"key": "nope", "label": "x"})
        await client.close()
        return errors, patch_unknown.value

    errors, patch_unknown = asyncio.run(scenario())
    assert errors[0] == "invalid session key: agent:"
    assert errors[1] == "sessions.create cwd requires worktree=true or execNode"
    assert errors[2] == "sessions.create cwd must be absolute"
    assert errors[3] == "sessions.create worktreeBaseRef/worktreeName require worktree=true"
    assert errors[4] == "sessions.create worktree cannot target execNode"
    assert errors[5].startswith("invalid sessions.create params: at /worktreeName:")
    assert errors[6] == "sessions.create cwd is outside the gateway's workspace roots"
    assert errors[7] == "invalid sessions.create params: at /unknown: unexpected property"
    assert patch_unknown.message == "session not found: agent:main:nope"
    assert not Session.objects.exists()


def _repository(path) -> None:
    path.mkdir()
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", "-b", "main", str(path)], check=True)
    (path / "README.md").write_text("hello\n")
    subprocess.run([*git, "-C", str(path), "add", "."], check=True)
    subprocess.run([*git, "-C", str(path), "commit", "-q", "-m", "init"], check=True)
    (path / "sub").mkdir()


@pytest.fixture
def workspace_gateway(gateway_factory, tmp_path):
    """A gateway whose sessions may make worktrees of checkouts under ``tmp_path/allowed``."""
    (tmp_path / "allowed").mkdir()
    return gateway_factory(extra_env={"OPENCLAW_WORKSPACE_ROOTS": str(tmp_path / "allowed")})


def test_worktree_session_gets_a_managed_git_worktree(workspace_gateway, tmp_path):
    gateway = workspace_gateway
    repo = tmp_path / "allowed" / "repo"
    _repository(repo)

    async def scenario():
        client = operator(gateway)
        await client.connect()
        created = await client.request(
            "sessions.create",
            {
                "key": "wt",
                "worktree": True,
                "cwd": str(repo / "sub"),
                "worktreeName": "feature-1",
                "worktreeBaseRef": "main",
            },
        )
        with pytest.raises(GatewayError) as taken:
            await client.request(
                "sessions.create", {"key": "wt2", "worktree": True, "cwd": str(repo), "worktreeName": "feature-1"}
            )
        await client.close()
        return created, taken.value

    created, taken = asyncio.run(scenario())
    worktree = created["worktree"]
    assert worktree["branch"] == "openclaw/feature-1"
    # Paths are shown relative to the gateway's state directory, never as the host's absolute paths.
    assert worktree["path"].startswith("worktrees/feature-1-")
    assert (Path(gateway.state_dir) / worktree["path"] / "README.md").read_text() == "hello\n"
    assert created["entry"]["spawnedCwd"] == worktree["path"]
    assert str(tmp_path) not in json.dumps(created)
    branches = subprocess.run(
        ["git", "-C", str(repo), "branch", "--list", "openclaw/*"], capture_output=True, text=True, check=True
    ).stdout
    assert "openclaw/feature-1" in branches
    assert created["entry"]["worktree"]["path"] == worktree["path"]
    assert taken.message.startswith("sessions.create could not create the worktree:")
    assert not Session.objects.filter(key="agent:main:wt2").exists()
    assert Run.objects.count() == 0 and TranscriptEvent.objects.count() == 0


def _branches(repo) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "branch", "--list", "openclaw/*"], capture_output=True, text=True, check=True
    ).stdout


def test_a_worktree_needs_an_allowed_directory_and_a_commit_and_nothing_is_made_otherwise(workspace_gateway, tmp_path):
    repo, outside = tmp_path / "allowed" / "repo", tmp_path / "outside"
    _repository(repo)
    _repository(outside)
    (tmp_path / "allowed" / "escape").symlink_to(outside)

    async def scenario() -> list[str]:
        client = operator(workspace_gateway)
        await client.connect()
        errors = []
        for params in (
            {"cwd": str(outside)},
            {"cwd": str(tmp_path / "allowed" / "escape")},  # a symlink out of the root
            {"cwd": str(repo / ".." / ".." / "outside")},
            {"cwd": str(repo), "worktreeBaseRef": "--no-checkout"},  # not an option for git
            {"cwd": str(repo), "worktreeBaseRef": "-q"},
            {"cwd": str(repo), "worktreeBaseRef": "no-such-branch"},
        ):
            with pytest.raises(GatewayError) as refused:
                await client.request("sessions.create", {"key": "wt", "worktree": True, **params})
            errors.append(refused.value.message)
        await client.close()
        return errors

    errors = asyncio.run(scenario())
    outside_message = "sessions.create cwd is outside the gateway's workspace roots"
    assert errors[:3] == [outside_message] * 3
    assert errors[3:] == [
        "sessions.create worktreeBaseRef is not a commit: --no-checkout",
        "sessions.create worktreeBaseRef is not a commit: -q",
        "sessions.create worktreeBaseRef is not a commit: no-such-branch",
    ]
    assert _branches(repo) == "" and _branches(outside) == ""
    assert not Session.objects.exists()


def test_a_refused_first_turn_leaves_no_session_behind(gateway):
    async def scenario() -> list[str]:
        client = operator(gateway)
        await client.connect()
        errors = []
        for method, params in (
            ("sessions.create", {"key": "with-empty-turn", "message": "   "}),
            ("sessions.create", {"key": "with-nul-turn", "message": "a\u0000b"}),
            ("chat.send", {"sessionKey": "main", "message": "", "idempotencyKey": "empty-first-turn"}),
        ):
            with pytest.raises(GatewayError) as refused:
                await client.request(method, params)
            errors.append(refused.value.message)
        await client.close()
        return errors

    errors = asyncio.run(scenario())
    assert errors[0] == "message or attachment required"
    assert errors[1] == "message must not contain null bytes"
    assert errors[2] == "message or attachment required"
    # Neither the sessions of the refused creates nor the main session a refused chat.send would have made.
    assert not Session.objects.exists()
    assert not Run.objects.exists()
