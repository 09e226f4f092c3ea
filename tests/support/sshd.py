"""A real OpenSSH server for the static-ssh provider tests, and a listener that never speaks.

``start_sshd()`` runs Debian's ``/usr/sbin/sshd`` (``./dev test`` installs openssh-server when it is missing)
in the foreground on a free loopback port, as the current user, with a host key, a client key and an
``authorized_keys`` of its own in a temporary directory; nothing of the machine's SSH setup is used::

    server = start_sshd()
    ... server.host, server.port, server.user, server.host_key, server.client_key_path, server.profile_settings()
    server.stop()

``HangingListener()`` accepts TCP connections and never sends a byte (an SSH banner that never comes)::

    with HangingListener() as listener:
        ... listener.port ...
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh

from tests.support.processes import _listens, _wait_ready, free_port, read_log, stop_process

SSHD = Path("/usr/sbin/sshd")
# sshd running as root insists on its privilege separation directory (the package's tmpfiles.d entry
# makes it at boot; a container never ran that).
PRIVSEP_DIR = Path("/run/sshd")
CONFIG = """\
ListenAddress 127.0.0.1
Port {port}
HostKey {directory}/host_ed25519
AuthorizedKeysFile {directory}/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
PidFile none
UsePAM no
LogLevel VERBOSE
"""


def _write_private(path: Path, data: bytes) -> None:
    # sshd refuses a private host key that others can read.
    path.write_bytes(data)
    path.chmod(0o600)


@dataclass
class SshServer:
    process: subprocess.Popen
    directory: Path
    port: int
    host_key: str
    client_key_path: Path
    host: str = "127.0.0.1"
    user: str = ""

    @property
    def log_path(self) -> Path:
        return self.directory / "sshd.log"

    def log(self) -> str:
        return read_log(self.log_path)

    def profile_settings(self, **overrides: Any) -> dict[str, Any]:
        """The settings of a static-ssh profile for this server (``overrides`` win)."""
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "hostKey": self.host_key,
            "keyRef": {"source": "file", "id": str(self.client_key_path)},
            # A node host installed there stays in this server's directory, not the login's home.
            "workDir": str(self.directory / "worker"),
            **overrides,
        }

    def stop(self) -> None:
        """Stops the server; its directory (keys, log) stays until ``remove``."""
        stop_process(self.process, timeout=10)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


def start_sshd(*, timeout: float = 15.0, attempts: int = 3, login_user: str | None = None) -> SshServer:
    """sshd on a free 127.0.0.1 port; returns once the port accepts connections. Its key logs in as
    ``login_user`` (an existing account; sshd running as root) or, by default, as the current user."""
    if not SSHD.exists():
        raise FileNotFoundError(f"{SSHD} not found (Debian's openssh-server)")
    if os.geteuid() == 0:
        PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="sshd-"))
    if login_user is not None:
        # sshd reads authorized_keys as the user logging in.
        directory.chmod(0o755)
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    client_key = asyncssh.generate_private_key("ssh-ed25519", comment="static-ssh-test")
    _write_private(directory / "host_ed25519", host_key.export_private_key("openssh"))
    _write_private(directory / "client_ed25519", client_key.export_private_key("openssh"))
    (directory / "authorized_keys").write_bytes(client_key.export_public_key("openssh"))
    (directory / "authorized_keys").chmod(0o644)
    host_key_line = host_key.export_public_key("openssh").decode().strip()
    # Another process may take the free port before sshd binds it: then sshd exits and we try another.
    attempt = 0
    while True:
        attempt += 1
        port = free_port()
        config = directory / "sshd_config"
        config.write_text(CONFIG.format(port=port, directory=directory), encoding="utf-8")
        log_path = str(directory / "sshd.log")
        with open(log_path, "w", encoding="utf-8") as log:
            process = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_ready(
                process,
                lambda port=port: _listens(port),
                what=f"sshd on port {port}",
                timeout=timeout,
                log_path=log_path,
                poll=0.05,
            )
        except RuntimeError:
            if attempt < attempts and "Address already in use" in read_log(log_path):
                continue
            shutil.rmtree(directory, ignore_errors=True)
            raise
        return SshServer(
            process=process,
            directory=directory,
            port=port,
            host_key=host_key_line,
            client_key_path=directory / "client_ed25519",
            user=login_user or getpass.getuser(),
        )


def unprivileged_user(name: str) -> str:
    """An ordinary account (created when missing; needs root): a worker host's login that cannot read
    what root keeps for itself."""
    if subprocess.run(["id", name], capture_output=True).returncode != 0:
        # "*": no password, yet not locked ("!"), which sshd without PAM would refuse for key logins too.
        subprocess.run(
            ["useradd", "--create-home", "--shell", "/bin/sh", "--password", "*", name], check=True, capture_output=True
        )
    return name


class HangingListener:
    """Accepts on a free 127.0.0.1 port and holds every connection open, silent, until closed."""

    def __init__(self) -> None:
        self._server = socket.socket()
        self._server.bind(("127.0.0.1", 0))
        self._server.listen()
        self._server.settimeout(0.1)
        self.port: int = self._server.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="hanging-listener", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                connection, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted.append(connection)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(5)
        self._server.close()
        for connection in self.accepted:
            connection.close()

    def __enter__(self) -> HangingListener:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
