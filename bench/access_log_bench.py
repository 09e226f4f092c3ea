"""What the RPC access line costs a call: the gateway's request path (``run_request``) in this process, with the
project's log configuration (standard error in ``--format``, the JSON log file in a scratch state directory), the
``openclaw.access.rpc`` logger on and off in alternating rounds. The call is ``health`` (no database hop), so the
difference is the line's own cost: record, context filter, two formatters, two writes.

    .venv/bin/python bench/access_log_bench.py --format json 2>/dev/null
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


async def per_call_us(run_request, ctx, frame, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        await run_request(ctx, frame)
    return (time.perf_counter() - started) / calls * 1e6


async def measure(calls: int, rounds: int) -> dict[str, float]:
    from gateway import scopes as sc
    from gateway.context import RpcContext
    from gateway.dispatch import run_request
    from gateway.protocol import RequestFrame

    ctx = RpcContext(
        conn_id="bench",
        channel_name="bench",
        role=sc.ROLE_OPERATOR,
        scopes=[sc.ADMIN],
        auth_method="token",
        client_id="bench",
        client_mode="bench",
        device_id="d" * 64,
    )
    frame = RequestFrame(type="req", id="bench-1", method="health", params={})
    access = logging.getLogger("openclaw.access.rpc")
    samples: dict[str, list[float]] = {"on": [], "off": []}
    await per_call_us(run_request, ctx, frame, calls // 10)
    for _ in range(rounds):
        for mode in ("on", "off"):
            access.disabled = mode == "off"
            samples[mode].append(await per_call_us(run_request, ctx, frame, calls))
    access.disabled = False
    return {mode: statistics.median(values) for mode, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--format", choices=("plain", "json"), default="json", help="standard error's log format")
    parser.add_argument("--calls", type=int, default=5000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds of on and off")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="access-log-bench-") as state_dir:
        os.environ.update(
            {
                "DJANGO_SETTINGS_MODULE": "openclaw_site.settings",
                "OPENCLAW_STATE_DIR": state_dir,
                "OPENCLAW_LOG_FORMAT": args.format,
            }
        )
        import django

        django.setup()
        medians = asyncio.run(measure(args.calls, args.rounds))
    # Standard out: the log lines went to standard error.
    print(f"health through run_request, {args.format} console + JSON file, median of {args.rounds} rounds:")
    print(f"  access line on : {medians['on']:7.1f} µs/call")
    print(f"  access line off: {medians['off']:7.1f} µs/call")
    print(f"  the line costs : {medians['on'] - medians['off']:7.1f} µs/call")


if __name__ == "__main__":
    main()
