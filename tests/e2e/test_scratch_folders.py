"""Tests leave nothing behind: every launcher's folder in the temp directory goes when the test that made it is done
(a gateway's state folder, a node host's, a node client's identity), also when the launch fails, and the test
run's clean-up reports and removes what its tests left — only its own, by the run's id. The temp directory is the
test's own here, so that what is left is exactly what these launchers made."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from tests.support.clients import IDENTITY_DIRS, call_once, node, remove_identity_dirs_made_after
from tests.support.processes import (
    SCRATCH_PREFIXES,
    TEST_RUN_ID_ENV,
    cleanup_test_run,
    make_scratch_dir,
    start_gateway,
    start_node_host,
    stop_and_remove,
    stray_scratch_dirs,
)

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def own_temp_dir(tmp_path, monkeypatch) -> Path:
    """The temp directory of this test alone (``tempfile.tempdir``, which ``tempfile.gettempdir`` answers)."""
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    return temp


def launcher_folders(temp: Path) -> list[str]:
    return sorted(path.name for path in temp.iterdir() if path.name.startswith(SCRATCH_PREFIXES))


def test_a_test_gateway_leaves_no_folder_behind(own_temp_dir, monkeypatch):
    monkeypatch.setenv(TEST_RUN_ID_ENV, "4242")
    server = start_gateway(worker=False)
    assert launcher_folders(own_temp_dir) == [Path(server.state_dir).name]
    assert Path(server.state_dir).name.startswith("gateway-state-run4242-")

    stop_and_remove([server])

    assert launcher_folders(own_temp_dir) == []


def test_a_gateway_that_fails_to_start_leaves_no_folder_behind(own_temp_dir):
    with pytest.raises(RuntimeError, match="exited with"):
        start_gateway(worker=False, extra_env={"OPENCLAW_WORKER_PROFILES": "{not json"})

    assert launcher_folders(own_temp_dir) == []


def test_a_node_host_leaves_no_folder_behind(gateway, own_temp_dir):
    node_host = start_node_host(gateway)
    try:
        call_once(gateway, "node.pair.approve", {"requestId": node_host.pairing_request()})
        node_host.wait_connects(1)
        assert launcher_folders(own_temp_dir) == [Path(node_host.state_dir).name]
    finally:
        node_host.stop()
        node_host.remove_state()

    assert launcher_folders(own_temp_dir) == []


def test_a_node_identity_made_for_a_test_goes_when_the_test_ends(gateway, own_temp_dir):
    made_before = len(IDENTITY_DIRS)
    client = node(gateway)
    assert launcher_folders(own_temp_dir) == [Path(client.options.state_dir).name]

    remove_identity_dirs_made_after(made_before)  # what the autouse fixture of tests/conftest.py runs

    assert launcher_folders(own_temp_dir) == []


def test_the_run_cleanup_reports_and_removes_only_its_own_runs_strays(own_temp_dir, monkeypatch, capsys):
    for variable in ("REDIS_URL", "OPENCLAW_TEST_RUN_DATABASES"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv(TEST_RUN_ID_ENV, "4242")
    ours = [Path(make_scratch_dir(prefix)) for prefix in SCRATCH_PREFIXES]
    (ours[0] / "gateway.log").write_text("left behind")
    monkeypatch.setenv(TEST_RUN_ID_ENV, "42420")
    another_runs = Path(make_scratch_dir("gateway-state-"))
    monkeypatch.delenv(TEST_RUN_ID_ENV)
    untagged = Path(make_scratch_dir("gateway-state-"))
    monkeypatch.setenv(TEST_RUN_ID_ENV, "4242")
    assert stray_scratch_dirs("4242") == sorted(ours)

    cleanup_test_run()

    assert sorted(own_temp_dir.iterdir()) == sorted([another_runs, untagged])
    report = capsys.readouterr().err
    assert f"test run cleanup: {len(ours)} folders left behind by tests, removed: " in report
    assert all(str(folder) in report for folder in ours)
    assert str(another_runs) not in report


def test_the_run_cleanup_reports_nothing_when_nothing_is_left(own_temp_dir, monkeypatch, capsys):
    for variable in ("REDIS_URL", "OPENCLAW_TEST_RUN_DATABASES"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv(TEST_RUN_ID_ENV, "4242")

    cleanup_test_run()

    assert capsys.readouterr().err == ""
