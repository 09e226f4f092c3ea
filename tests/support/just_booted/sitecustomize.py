"""Makes a Python process see a monotonic clock that starts near zero, as on a host that just booted.

``time.monotonic()`` counts from boot, so code that compares it with a zero-initialised timestamp
behaves differently in the first hour of a machine's life. A test puts this directory on a child
process's ``PYTHONPATH``; ``site`` imports this module before anything else runs there.
"""

import time

_real_monotonic = time.monotonic
_offset = _real_monotonic() - 1.0  # the process starts one second after "boot"


def _just_booted_monotonic() -> float:
    return _real_monotonic() - _offset


time.monotonic = _just_booted_monotonic
