"""Long, unseeded fuzzing of a live gateway: the properties of ``tests/e2e/test_fuzz.py``, N times bigger.

The test suite runs the same 2,000 cases every time (so CI is reproducible); this draws new cases on
every run, as many as asked, against the embedded profile or PostgreSQL + Redis, and prints how
many cases ran, how fast, and the falsifying example if a property broke.

    .venv/bin/python bench/fuzz_bench.py --examples 20000
    .venv/bin/python bench/fuzz_bench.py --examples 20000 --database-url postgres://postgres@127.0.0.1:5432/postgres \\
        --redis-url redis://127.0.0.1:6379/0
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What each property runs for --examples N (see the EXAMPLES arithmetic in tests/e2e/test_fuzz.py).
SHARES = {"method calls": 1.0, "raw frames after the handshake": 0.8, "first frames": 0.2}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=20_000, help="method-call cases (the other properties scale)")
    parser.add_argument("--database-url", help="PostgreSQL server (pytest-django creates and drops a test database)")
    parser.add_argument("--redis-url", help="Redis for the channel layer, cache and Celery")
    args = parser.parse_args()

    state_dir = tempfile.mkdtemp(prefix="fuzz-bench-")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENCLAW_", "DATABASE_URL", "REDIS_URL"))}
    env.update(
        FUZZ_RANDOM="1",
        FUZZ_EXAMPLES=str(args.examples),
        OPENCLAW_STATE_DIR=state_dir,
        OPENCLAW_REDIS_PREFIX=f"openclaw-fuzz-{os.getpid()}",
        DB_CONN_MAX_AGE="0",
    )
    if args.database_url:
        env["DATABASE_URL"] = args.database_url.rstrip("/").rsplit("/", 1)[0] + f"/openclaw_fuzz_{os.getpid()}"
    if args.redis_url:
        env["REDIS_URL"] = args.redis_url
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/e2e/test_fuzz.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    elapsed = time.monotonic() - started
    cases = {name: round(args.examples * share) for name, share in SHARES.items()}
    summary = re.findall(r"(\d+) (passed|failed)", result.stdout)
    print("OpenClaw gateway fuzzing (Hypothesis, unseeded)")
    print(f"  profile      database={'PostgreSQL' if args.database_url else 'SQLite'} redis={bool(args.redis_url)}")
    for name, count in cases.items():
        print(f"  {name:<32} {count:>8,} cases")
    total = sum(cases.values())
    print(f"  total                            {total:>8,} cases in {elapsed:.1f} s ({total / elapsed:,.0f} cases/s)")
    print(f"  properties   {', '.join(f'{n} {word}' for n, word in summary) or 'no result'}")
    if result.returncode != 0:
        falsifying = [line for line in result.stdout.splitlines() if "Falsifying" in line or "case=" in line]
        print("  FAILED; falsifying example(s):")
        for line in falsifying[:20] or result.stdout.splitlines()[-40:]:
            print(f"    {line}")
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
