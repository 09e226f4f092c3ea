"""What recording one RPC call costs in-process: ``gateway.metrics.record_rpc_call`` with metrics on and off.

The deterministic half of the metrics benchmark (``gateway_bench.py --metrics-compare`` is the end-to-end half,
whose calls/s swing with whatever else the machine runs): the difference between the two lines is what metrics
add to each call's CPU time, to be set against the time of a call (1 / calls/s per busy core).

    .venv/bin/python bench/metrics_cost.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CALLS = 200_000
REPEATS = 7


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="openclaw-metrics-cost-") as state_dir:
        os.environ["OPENCLAW_STATE_DIR"] = state_dir
        os.environ["DJANGO_SETTINGS_MODULE"] = "openclaw_site.settings"
        import django

        django.setup()
        from django.test.utils import override_settings

        from gateway import metrics

        print(f"record_rpc_call, best of {REPEATS} × {CALLS} calls (µs per call):")
        for enabled in (True, False, True, False):
            # As a start with OPENCLAW_METRICS_ENABLED would set it (the switch is read once, until it changes).
            with override_settings(OPENCLAW_METRICS_ENABLED=enabled):
                best = min(
                    timeit.repeat(lambda: metrics.record_rpc_call("health", "ok", 0.0003), number=CALLS, repeat=REPEATS)
                )
            print(f"  metrics {'on ' if enabled else 'off'}  {best / CALLS * 1e6:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
