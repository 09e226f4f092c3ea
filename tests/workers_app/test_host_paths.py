"""No path on the gateway's host in what operators and clients are shown.

A static-ssh profile whose key file lies in a temp directory of a name found nowhere else fails its dispatch
(the file is missing); a local worker's placement holds a workspace under the state directory, and failures on
this host name files there. Then every projection (the RPC's placement, session, environment reads; the JSON
API's), every admin page (each registered model's list and each object's page) and every console page is read,
and none holds that directory or the state directory: errors name the profile, its keyRef and the environment
instead, and this host's files relative to the state directory.
"""

from __future__ import annotations

import os

import asyncssh
import pytest
from django.apps import apps
from django.conf import settings
from django.contrib import admin
from django.test import Client
from django.urls import reverse

from gateway.exceptions import Unavailable
from gateway.redaction import host_paths_out, operator_text, shown_path
from sessions_app.models import Session
from tests.support.operators import operator_user
from tests.support.processes import free_port
from tests.workers_app.test_placement_store import DISPATCH_STEPS, make_session, walk
from tests.workers_app.test_rpc import ctx, dispatch, in_process, published, use_profiles, wire  # noqa: F401 (fixtures)
from workers_app.models import WorkerEnvironment
from workers_app.providers import WorkerProviderError
from workers_app.services import environments as envs
from workers_app.services import placements as store

LOCAL_ENV = "worker:local-env"
LOCAL_KEY = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def key_dir(tmp_path_factory):
    """A directory only the gateway host knows (the key file in it is missing: the dispatch fails on it)."""
    return tmp_path_factory.mktemp("gateway-host-only-keys-7f3a")


@pytest.fixture
def failed_ssh_dispatch(request, key_dir):
    request.getfixturevalue("in_process")
    request.getfixturevalue("published")
    install_profiles = request.getfixturevalue("use_profiles")
    host_key = asyncssh.generate_private_key("ssh-ed25519").export_public_key("openssh").decode().strip()
    settings_ = {
        "host": "127.0.0.1",
        "port": free_port(),
        "user": "worker",
        "hostKey": host_key,
        "keyRef": {"source": "file", "id": str(key_dir / "worker_key")},
    }
    install_profiles({"ssh-dev": {"provider": "static-ssh", "settings": settings_}})
    session = make_session("agent:main:ssh-dev")
    with pytest.raises(Unavailable) as failed:
        dispatch(ctx(), session.key, profileId="ssh-dev")
    return session, failed.value.message


@pytest.fixture
def local_worker():
    """A session in a worktree, active on a local worker (its workspace under this host's state directory), whose
    environment and a second session's placement failed naming files there."""
    state_dir = str(settings.STATE_DIR)
    worker_dir = f"{state_dir}/local-workers/{LOCAL_KEY}"
    session = make_session("agent:main:local")
    WorkerEnvironment.objects.create(
        environment_id=LOCAL_ENV,
        provider_id="local",
        profile_id="local-dev",
        state="attached",
        lease_id=f"local:{LOCAL_KEY}",
        owner_epoch=1,
        attached_session_ids=[session.session_id],
        created_at_ms=1,
        updated_at_ms=1,
        state_changed_at_ms=1,
    )
    # Its turns ran in a managed worktree of the gateway's (as session creation with ``worktree`` records it).
    worktree = f"{state_dir}/worktrees/local-{LOCAL_KEY[:8]}"
    Session.objects.filter(pk=session.pk).update(
        cwd=worktree,
        worktree={"id": LOCAL_KEY[:8], "branch": "openclaw/local", "path": worktree, "repoRoot": f"{state_dir}/repo"},
    )
    workspace = f"{worker_dir}/node-host/gw/workspaces/e/s/1"
    patches = {"requested": {"environment_id": LOCAL_ENV}, "syncing": {"remote_workspace_dir": workspace}}
    steps = [(a, b, {**patch, **patches.get(a, {})}) for a, b, patch in DISPATCH_STEPS]
    walk(session, steps)
    envs.environment_record_error(
        environment_id=LOCAL_ENV, error=f"inspect: the node host's log {worker_dir}/node-host.log ends with an error"
    )
    other = make_session("agent:main:local-failed")
    store.placement_start_dispatch(session=other)
    store.placement_fail(session=other, recovery_error=f"cloud worker disappeared: {worker_dir} is gone")
    return session, workspace


def outputs(api_token: str) -> dict[str, str]:
    """Every projection and page an operator or a client reads, by where it was read."""
    shown: dict[str, str] = {}
    context = ctx()
    keys = list(Session.objects.values_list("key", flat=True))
    for key in keys:
        shown[f"rpc sessions.describe {key}"] = str(wire(context, "sessions.describe", {"key": key}))
    shown["rpc sessions.list"] = str(wire(context, "sessions.list", {}))
    shown["rpc environments.list"] = str(wire(context, "environments.list", {}))
    for environment_id in WorkerEnvironment.objects.values_list("environment_id", flat=True):
        shown[f"rpc environments.status {environment_id}"] = str(
            wire(context, "environments.status", {"environmentId": environment_id})
        )
    api = Client(HTTP_AUTHORIZATION=f"Bearer {api_token}")
    paths = ["/api/workers/placements", "/api/workers/environments", "/api/sessions/"]
    paths += [f"/api/workers/placements/{key}" for key in keys] + [f"/api/sessions/{key}" for key in keys]
    paths += [f"/api/workers/environments/{e}" for e in WorkerEnvironment.objects.values_list("pk", flat=True)]
    for path in paths:
        response = api.get(path)
        assert response.status_code == 200, (path, response.content)
        shown[f"api {path}"] = response.content.decode()

    staff = Client()
    staff.force_login(operator_user("root", is_staff=True, is_superuser=True))
    for model in apps.get_models():
        if not admin.site.is_registered(model) or model._meta.app_label == "auth":
            continue
        base = f"admin:{model._meta.app_label}_{model._meta.model_name}"
        pages = [reverse(f"{base}_changelist")]
        pages += [reverse(f"{base}_change", args=[pk]) for pk in model.objects.values_list("pk", flat=True)[:50]]
        for page in pages:
            response = staff.get(page)
            assert response.status_code == 200, page
            shown[f"admin {page}"] = response.content.decode()

    pages = [reverse(f"ui:{name}") for name in ("sessions", "runs", "environments", "nodes", "system")]
    pages += [reverse("ui:session", kwargs={"key": key}) for key in keys]
    for page in pages:
        response = staff.get(page)
        assert response.status_code == 200, page
        shown[f"console {page}"] = response.content.decode()
    return shown


@pytest.mark.django_db(transaction=True)
def test_no_projection_or_page_names_a_path_on_the_gateway_host(failed_ssh_dispatch, local_worker, api_token, key_dir):
    _session, message = failed_ssh_dispatch
    _local, workspace = local_worker
    state_dir = str(settings.STATE_DIR)

    shown = outputs(api_token)

    leaks = [
        where
        for where, text in shown.items()
        if str(key_dir) in text or key_dir.name in text or state_dir in text or os.path.realpath(state_dir) in text
    ]
    assert leaks == []
    # The failure names the profile and its reference.
    assert message == (
        "Worker dispatch failed in provisioning: the keyRef key file of profile ssh-dev cannot be read: "
        "No such file or directory"
    )
    assert any(message in text for where, text in shown.items() if where.startswith("admin"))
    assert any(
        f"local-workers/{LOCAL_KEY}/node-host/gw/workspaces/e/s/1" in text
        for where, text in shown.items()
        if where.startswith("rpc sessions.describe")
    )
    assert workspace.startswith(state_dir)  # the placement keeps the real path for its worker


def test_operator_text_names_this_host_s_files_relative_to_the_state_directory_and_the_installation(settings, tmp_path):
    settings.STATE_DIR = tmp_path / "state"
    state, base = str(settings.STATE_DIR), str(settings.BASE_DIR)

    assert operator_text(f"cannot open {state}/local-workers/ab/node-host.log: denied") == (
        "cannot open local-workers/ab/node-host.log: denied"
    )
    assert operator_text(f"{state} is full") == "the state directory is full"
    assert operator_text(f"bug in {base}/workers_app/x.py") == "bug in workers_app/x.py"
    # A directory of the same name elsewhere, or one whose name only starts the same, is left alone.
    assert operator_text(f"remote /home/w{state}/x and {state}-old/y") == f"remote /home/w{state}/x and {state}-old/y"
    assert host_paths_out("/srv/worker/.openclaw-worker/node-host.log") == "/srv/worker/.openclaw-worker/node-host.log"
    assert operator_text("Authorization: Bearer abc.def in " + state + "/x") == "Authorization: Bearer *** in x"
    assert shown_path(f"{state}/worktrees/a") == "worktrees/a"


def test_an_error_shows_its_own_message_and_an_unexpected_one_only_its_kind(settings, tmp_path):
    settings.STATE_DIR = tmp_path

    assert operator_text(WorkerProviderError(f"no log in {tmp_path}/local-workers/ab")) == "no log in local-workers/ab"
    assert operator_text(OSError(2, "No such file or directory", f"{tmp_path}/x")) == "unexpected FileNotFoundError"
