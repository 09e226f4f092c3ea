"""Fixtures of the workers_app tests: a real sshd for the static-ssh provider, and a listener that never speaks."""

from __future__ import annotations

import os

import pytest

from tests.support.sshd import SSHD, HangingListener, start_sshd


@pytest.fixture
def sshd():
    """Debian's sshd on a free loopback port, with keys of its own (``tests/support/sshd.py``).

    ``./dev test`` installs openssh-server when it is missing; where it could not, these tests are left
    out, except in CI (``CI=true``), which runs every test and so fails instead."""
    if not SSHD.exists():
        reason = f"{SSHD} not found: install Debian's openssh-server (./dev test does, as root with apt-get)"
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail(f"CI: missing OpenSSH server: {reason}")
        pytest.skip(reason)
    server = start_sshd()
    yield server
    server.remove()


@pytest.fixture
def hanging_listener():
    with HangingListener() as listener:
        yield listener
