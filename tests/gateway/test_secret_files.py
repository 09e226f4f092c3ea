"""First start on a fresh state dir: processes starting at once agree on every generated secret."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

from gateway import secret_files
from tests.support.processes import ROOT

READ_SECRETS = (
    "from django.conf import settings; from gateway.conf import ensure_gateway_token; "
    "print(settings.SECRET_KEY, ensure_gateway_token()[0])"
)


def test_concurrent_creators_agree_and_exactly_one_creates(tmp_path):
    path = tmp_path / "state" / "gateway-token"
    barrier = threading.Barrier(16)
    results: list[tuple[str, bool]] = []
    counter = iter(range(1000))

    def generate() -> str:
        time.sleep(0.01)  # widen the window between "absent" and "published"
        return f"secret-{next(counter)}"

    def start() -> None:
        barrier.wait()
        results.append(secret_files.read_or_create(path, generate))

    threads = [threading.Thread(target=start) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    values = {value for value, _ in results}
    assert len(values) == 1
    assert sum(created for _, created in results) == 1
    assert path.read_text() == f"{values.pop()}\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["gateway-token"]  # no temporary files left


def test_an_existing_secret_is_read_not_replaced(tmp_path):
    path = tmp_path / "django-secret-key"
    path.write_text("kept\n")
    assert secret_files.read_or_create(path, lambda: "new") == ("kept", False)
    assert path.read_text() == "kept\n"


def test_an_empty_secret_file_is_an_error_not_a_blank_secret(tmp_path):
    path = tmp_path / "gateway-token"
    path.write_text("\n")
    try:
        secret_files.read_or_create(path, lambda: "new")
    except RuntimeError as error:
        assert "is empty; remove it to generate a new secret" in str(error)
    else:
        raise AssertionError("an empty secret was accepted")


def test_processes_starting_at_once_on_a_fresh_state_dir_agree(tmp_path):
    state = tmp_path / "fresh-state"
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("OPENCLAW_GATEWAY_TOKEN", "DJANGO_SECRET_KEY", "DATABASE_URL", "HARNESS_DATABASE_URL")
    }
    env["OPENCLAW_STATE_DIR"] = str(state)
    processes = [
        subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "shell", "--no-imports", "-c", READ_SECRETS],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    outcomes = [(*process.communicate(timeout=120), process.returncode) for process in processes]

    assert [code for _, _, code in outcomes] == [0] * 8, [err for _, err, _ in outcomes]
    assert len({out.strip() for out, _, _ in outcomes}) == 1
    secret_key, token = outcomes[0][0].split()[-2:]
    assert (state / "django-secret-key").read_text().strip() == secret_key
    assert (state / "gateway-token").read_text().strip() == token
    assert not [p.name for p in Path(state).iterdir() if p.name.startswith(".")]
