"""``pip install .`` builds a distribution whose console script runs the protocol client's CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.support.processes import ROOT, free_port

pytestmark = pytest.mark.slow


def run(*args: str, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=300, **kwargs)


PACKAGED = (
    "openclaw_client",
    "openclaw_site",
    "gateway",
    "devices_app",
    "approvals_app",
    "sessions_app",
    "native_harness",
    "workers_app",
    "tests",
)


def test_the_wheel_installs_the_apps_and_the_openclaw_gateway_script(tmp_path):
    # A copy of the source (a setuptools build writes build/ and *.egg-info next to it); the tests
    # come along to show they are left out of the distribution.
    source = tmp_path / "source"
    for name in PACKAGED:
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "requirements.txt"):
        shutil.copy(ROOT / name, source / name)
    # No build isolation and no index: the build uses the setuptools of the test environment, offline.
    built = run(
        sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(source)
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("openclaw_django-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for module in (
        "openclaw_client/cli.py",
        "openclaw_site/settings.py",
        "sessions_app/migrations/0001_initial.py",
        "workers_app/openclaw_worker/worker.mjs",  # what the OpenClaw-format bundle is built from
    ):
        assert module in names
    assert not [name for name in names if name.startswith("tests/")]
    entry_points = next(name for name in names if name.endswith("entry_points.txt"))
    declared = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "openclaw-gateway = openclaw_client.cli:main" in declared
    assert "openclaw-node = openclaw_client.node:main" in declared

    prefix = tmp_path / "prefix"
    installed = run(
        sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--prefix", str(prefix), str(wheel)
    )
    assert installed.returncode == 0, installed.stderr
    site = Path(sysconfig.get_path("purelib", vars={"base": str(prefix), "platbase": str(prefix)}))
    script = prefix / "bin" / "openclaw-gateway"
    # Outside the checkout, so the installed package (not the source tree) is what runs.
    env = {**os.environ, "PYTHONPATH": str(site), "OPENCLAW_STATE_DIR": str(tmp_path / "state")}
    helped = run(str(script), "call", "--help", cwd=tmp_path, env=env)
    unreachable = run(
        str(script), "call", "health", "--url", f"ws://127.0.0.1:{free_port()}", "--token", "t", cwd=tmp_path, env=env
    )
    assert helped.returncode == 0 and "exit codes" in helped.stdout.lower(), helped.stdout + helped.stderr
    assert unreachable.returncode == 3
    assert unreachable.stderr.startswith("error: cannot connect to ws://127.0.0.1:")
    assert "Traceback" not in unreachable.stderr
    # The node host runs from the installed package too (no Django): its own argument check answers.
    node_host = run(
        str(prefix / "bin" / "openclaw-node"),
        "--gateway",
        "http://x",
        "--state-dir",
        str(tmp_path / "n"),
        cwd=tmp_path,
        env=env,
    )
    assert node_host.returncode == 2 and "--gateway must be a ws:// or wss:// URL" in node_host.stderr
