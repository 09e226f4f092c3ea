"""``<state dir>/gateway.json``: where the gateway of a state folder listens, so that its CLI finds it.

``manage.py serve`` writes the file once its port is bound (the real port, also when ``--port 0`` picked one) and
removes it when it stops cleanly. ``gateway call`` reads it when no ``--url`` is given. A file whose process is no
longer running (the gateway was killed) and a file that cannot be read are ignored: the CLI then falls back to the
configured address. Several gateways sharing one state folder (``manage.py cluster``) each write it; the last one
to start wins, and a stopping gateway removes only a file that names its own process.

Standard library only: the Django-free client reads it, and the gateway writes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

FILE_NAME = "gateway.json"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 18789


@dataclass(frozen=True)
class RunningGateway:
    url: str
    port: int
    pid: int


@dataclass(frozen=True)
class GatewayFileReading:
    """What reading the file found: the running gateway, or why there is none (``None`` when the file is absent)."""

    gateway: RunningGateway | None
    ignored_because: str | None = None


def gateway_file(state_dir: str | Path) -> Path:
    return Path(state_dir) / FILE_NAME


def connect_host(bind: str) -> str:
    """The address a local client dials for a gateway bound to ``bind`` (a wildcard means this host), as it
    appears in a URL (IPv6 in brackets)."""
    host = DEFAULT_HOST if bind in ("", "0.0.0.0", "::") else bind
    return f"[{host}]" if ":" in host else host


def gateway_url(bind: str, port: int) -> str:
    return f"ws://{connect_host(bind)}:{port}"


def write_gateway_file(state_dir: str | Path, *, bind: str, port: int, pid: int | None = None) -> Path:
    """Publish this process's address atomically (readers see the old file or the new one, never half of one)."""
    path = gateway_file(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    content = {"url": gateway_url(bind, port), "port": port, "bind": bind, "pid": pid or os.getpid()}
    fd, temporary = tempfile.mkstemp(prefix=f".{FILE_NAME}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(content, handle)
            handle.write("\n")
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    return path


def remove_gateway_file(state_dir: str | Path, *, pid: int | None = None) -> bool:
    """Remove the file if it names ``pid`` (this process by default); a file another gateway wrote since stays."""
    path = gateway_file(state_dir)
    reading = read_gateway_file(state_dir, check_alive=False)
    if reading.gateway is None or reading.gateway.pid != (pid or os.getpid()):
        return False
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return True


def read_gateway_file(state_dir: str | Path, *, check_alive: bool = True) -> GatewayFileReading:
    path = gateway_file(state_dir)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return GatewayFileReading(None)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return GatewayFileReading(None, f"{path} cannot be read ({type(exc).__name__})")
    url, port, pid = (data.get(key) for key in ("url", "port", "pid")) if isinstance(data, dict) else (None,) * 3
    if not (
        isinstance(url, str)
        and url.startswith(("ws://", "wss://"))
        and _is_int(port)
        and 0 < port < 65536
        and _is_int(pid)
        and pid > 0
    ):
        return GatewayFileReading(None, f"{path} does not name a gateway (url, port, pid)")
    if check_alive and not process_alive(pid):
        return GatewayFileReading(None, f"{path} names process {pid}, which is not running")
    return GatewayFileReading(RunningGateway(url=url, port=port, pid=pid))


def default_url(state_dir: str | Path, *, bind: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> str:
    """The running gateway of ``state_dir``, else the configured address."""
    running = read_gateway_file(state_dir).gateway
    return running.url if running else gateway_url(bind, port)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def process_alive(pid: int) -> bool:
    """Whether a process with this id runs on this host (a process of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
