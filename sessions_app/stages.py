"""Named stage boundaries of multi-store operations (initialization, fork, adoption, rollback).

Production code announces when it reaches a boundary; nothing happens unless something listens.
Tests attach listeners to inject a fault exactly there (a failing write, a successor's write from
another transaction) without test-only branches in the code under test.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

_listeners: dict[str, list[Callable[..., None]]] = {}
_lock = threading.Lock()


def reach(stage: str, **context: Any) -> None:
    listeners = _listeners.get(stage)
    if listeners:
        for listener in list(listeners):
            listener(**context)


@contextlib.contextmanager
def listening(stage: str, listener: Callable[..., None]) -> Iterator[None]:
    with _lock:
        _listeners.setdefault(stage, []).append(listener)
    try:
        yield
    finally:
        with _lock:
            _listeners[stage].remove(listener)
            if not _listeners[stage]:
                del _listeners[stage]
