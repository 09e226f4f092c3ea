"""Secrets the first start generates into the state dir (Django's secret key, the gateway token,
the first admin's password).

Several processes may start at once on a fresh state dir (a gateway and its Celery worker, two
gateways): exactly one of them creates each file, and every process reads the same complete value.
A file is written under a temporary name and then published (``os.link``, which fails when the name
exists; or ``os.replace``), so nobody ever reads a half-written secret. Standard library only:
settings use it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def read_or_create(path: Path, generate: Callable[[], str]) -> tuple[str, bool]:
    """The secret stored at ``path``, created with ``generate()`` if absent. Returns (value, created)."""
    try:
        return _read(path), False
    except FileNotFoundError:
        pass
    value = generate()
    temporary = _private_temporary(path, value)
    try:
        os.link(temporary, path)
    except FileExistsError:
        return _read(path), False  # another process published its value first
    finally:
        os.unlink(temporary)
    return value, True


def write_private(path: Path, content: str) -> None:
    """Replace ``path`` atomically with ``content``, readable by this user only."""
    temporary = _private_temporary(path, content)
    try:
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def _private_temporary(path: Path, content: str) -> str:
    """A complete, fsynced, owner-only copy of ``content`` next to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(content + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o600)
    except BaseException:
        os.unlink(temporary)
        raise
    return temporary


def _read(path: Path) -> str:
    value = path.read_text(encoding="utf-8").strip()
    if not value:
        raise RuntimeError(f"{path} is empty; remove it to generate a new secret")
    return value
