"""The local provider's node host that exits before it connects: the provision fails with the provider's error, and
the gateway's log repeats the end of the node host's own log (where the reason is)."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from workers_app.providers import local
from workers_app.providers.base import WorkerProfile, WorkerProviderError

pytestmark = pytest.mark.django_db


def test_a_node_host_that_exits_before_it_connects_fails_the_provision_and_its_log_tail_is_logged(
    settings, tmp_path, monkeypatch, caplog
):
    settings.STATE_DIR = str(tmp_path)

    def start_one_that_exits(self, profile, state_dir):
        with open(state_dir / "node-host.log", "ab") as log:
            log.write(b"x" * (2 * local.LOG_TAIL_BYTES) + b"\n")
            process = subprocess.Popen(
                [sys.executable, "-c", "import sys; print('error: refused at connect'); sys.exit(4)", str(state_dir)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        (state_dir / local.PID_FILE).write_text(str(process.pid))
        process.wait()

    monkeypatch.setattr(local.LocalProvider, "_start", start_one_that_exits)
    caplog.set_level(logging.WARNING, logger=local.__name__)

    with pytest.raises(WorkerProviderError, match="local node host exited before it connected"):
        local.LocalProvider().provision(WorkerProfile(id="local-dev", provider_id="local"), "operation-1")

    logged = [record.getMessage() for record in caplog.records if "exited before it connected" in record.getMessage()]
    assert len(logged) == 1
    assert logged[0].rstrip().endswith("error: refused at connect")
    # Only the tail: the log's beginning is not repeated.
    assert logged[0].count("x") <= local.LOG_TAIL_BYTES


def test_the_tail_of_a_missing_log_says_it_is_unreadable(tmp_path):
    assert local._log_tail(tmp_path).startswith("(unreadable: ")
