"""Operators' console benchmark: the sessions page at 10 and at 10,000 sessions (should be flat), the
session page's time to first byte, and how soon a reply sent from the console streams to the page's
live socket (first ``chat`` delta, then ``final``).

The gateway starts as ``./dev run`` starts it (``bootstrap``: migrations, token, admin login; then
``manage.py serve``), in a scratch state directory, on the embedded profile unless
``--database-url``/``--redis-url`` name PostgreSQL + Redis (then with a Celery worker). The client logs
in through the console's own login form with the admin login ``bootstrap`` wrote.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import websockets

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    ScratchPostgres,
    ScratchRedisPrefix,
    bench_gateway,
    fmt_ms,
    is_postgres_url,
    latency_header,
    latency_row,
    progress,
    summarize,
)
from bench.sessions_bench import ORM_SEED_SCRIPT  # noqa: E402

LABEL = "console bench"


def login(base_url: str, state_dir: str) -> httpx.Client:
    credentials = Path(state_dir, "admin-credentials").read_text(encoding="utf-8")
    fields = dict(line.split("=", 1) for line in credentials.splitlines() if "=" in line)
    client = httpx.Client(base_url=base_url, timeout=60)
    client.get("/ui/login/")
    answer = client.post(
        "/ui/login/",
        data={
            "username": fields["username"],
            "password": fields["password"],
            "csrfmiddlewaretoken": client.cookies["csrftoken"],
        },
        headers={"Referer": f"{base_url}/ui/login/"},
    )
    if answer.status_code != 302:
        raise RuntimeError(f"console login failed: HTTP {answer.status_code}")
    return client


def timed_get(client: httpx.Client, path: str) -> tuple[float, float]:
    """(time to first byte, time to the whole page), seconds."""
    started = time.perf_counter()
    with client.stream("GET", path) as response:
        first = time.perf_counter() - started
        body = response.read()
        whole = time.perf_counter() - started
    if response.status_code != 200 or not body:
        raise RuntimeError(f"GET {path}: HTTP {response.status_code}")
    return first, whole


def page_samples(client: httpx.Client, path: str, count: int) -> tuple[dict, dict]:
    for _ in range(5):
        timed_get(client, path)
    samples = [timed_get(client, path) for _ in range(count)]
    return summarize([s[0] for s in samples]), summarize([s[1] for s in samples])


def seed_sessions(launch, count: int, first: int) -> None:
    rows = [{"key": f"agent:main:bench-{first + n:06d}", "label": f"{LABEL} {first + n}"} for n in range(count)]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(rows, handle)
    launch.manage("shell", "-c", ORM_SEED_SCRIPT.format(path=handle.name), timeout=600)
    Path(handle.name).unlink(missing_ok=True)


async def streamed_replies(client: httpx.Client, base_url: str, ws_url: str, key: str, turns: int) -> dict:
    """Per turn: the console's send form posted, then the page socket's first delta and its final."""
    cookie = "; ".join(f"{name}={value}" for name, value in client.cookies.items())
    socket = await websockets.connect(f"{ws_url}/ui/live/", origin=base_url, additional_headers={"Cookie": cookie})
    to_delta, to_final = [], []
    try:
        for n in range(turns + 3):
            page = await asyncio.to_thread(client.get, f"/ui/sessions/{key}/")
            idempotency_key = re.search(r'name="idempotencyKey" value="([^"]+)"', page.text).group(1)
            started = time.perf_counter()
            posted = await asyncio.to_thread(
                client.post,
                f"/ui/sessions/{key}/send",
                data={
                    "message": f"Reply exactly: console bench turn {n} {uuid.uuid4().hex[:6]}",
                    "idempotencyKey": idempotency_key,
                    "csrfmiddlewaretoken": client.cookies["csrftoken"],
                },
                headers={"Referer": f"{base_url}/ui/"},
            )
            if posted.status_code != 302:
                raise RuntimeError(f"send: HTTP {posted.status_code}")
            first_delta = None
            while True:
                frame = json.loads(await asyncio.wait_for(socket.recv(), 30))
                payload = frame.get("payload") or {}
                if frame.get("event") != "chat" or payload.get("sessionKey") != key:
                    continue
                if payload.get("state") == "delta" and first_delta is None:
                    first_delta = time.perf_counter() - started
                if payload.get("state") in ("final", "error", "aborted"):
                    if payload["state"] != "final":
                        raise RuntimeError(f"turn ended {payload['state']}")
                    if n >= 3:  # after warm-up
                        to_delta.append(first_delta if first_delta is not None else time.perf_counter() - started)
                        to_final.append(time.perf_counter() - started)
                    break
    finally:
        await socket.close()
    return {"delta": summarize(to_delta), "final": summarize(to_final)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help="PostgreSQL server (a scratch database is created and dropped)")
    parser.add_argument("--redis-url", help="Redis for the channel layer, cache and Celery (a scratch prefix)")
    parser.add_argument("--requests", type=int, default=100, help="timed GETs per page and size")
    parser.add_argument("--large", type=int, default=10_000, help="sessions of the second sessions-page figure")
    parser.add_argument("--turns", type=int, default=30, help="timed console turns")
    args = parser.parse_args()

    postgres = ScratchPostgres(args.database_url, "_console") if is_postgres_url(args.database_url) else None
    redis_prefix = ScratchRedisPrefix(args.redis_url) if args.redis_url else None
    launch = server = None
    try:
        if postgres is not None:
            postgres.create()
        launch = bench_gateway(
            database_url=postgres.url if postgres else None,
            redis_url=args.redis_url,
            redis_prefix=redis_prefix.prefix if redis_prefix else None,
        )
        progress("bootstrap (as ./dev run): migrations, token, admin login")
        launch.manage("bootstrap", timeout=300)
        server = launch.start(worker=True)
        client = login(server.http_url, launch.state_dir)
        seed_sessions(launch, 9, 0)
        client.post(
            "/ui/sessions/new",
            data={"key": "agent:main:console-bench", "csrfmiddlewaretoken": client.cookies["csrftoken"]},
            headers={"Referer": f"{server.http_url}/ui/"},
        )
        progress(f"sessions page at 10 sessions, {args.requests} requests")
        small = page_samples(client, "/ui/sessions/", args.requests)
        session_page = page_samples(client, "/ui/sessions/agent:main:console-bench/", args.requests)
        seed_sessions(launch, 40, 9)
        progress(f"sessions page at 50 sessions (one full page), {args.requests} requests")
        full_page = page_samples(client, "/ui/sessions/", args.requests)
        progress(f"seeding {args.large - 50} more sessions")
        seed_sessions(launch, args.large - 50, 49)
        progress(f"sessions page at {args.large} sessions")
        large = page_samples(client, "/ui/sessions/", args.requests)
        searched = page_samples(client, "/ui/sessions/?q=bench-0099", args.requests)
        progress(f"{args.turns} turns sent from the console, watched on the page socket")
        replies = asyncio.run(
            streamed_replies(client, server.http_url, server.url, "agent:main:console-bench", args.turns)
        )
    finally:
        if server is not None:
            server.stop()
        if launch is not None:
            launch.remove_state()
        if postgres is not None:
            postgres.drop()
        if redis_prefix is not None:
            redis_prefix.cleanup()

    profile = "PostgreSQL + Redis + Celery" if postgres else "embedded (SQLite, in-memory layer, in-process turns)"
    print(f"Operators' console benchmark ({profile})")
    print(latency_header("page (ms)", width=46))
    print(latency_row("sessions page, 10 sessions: first byte", small[0], width=46))
    print(latency_row("sessions page, 10 sessions: whole page", small[1], width=46))
    print(latency_row("sessions page, 50 sessions: whole page", full_page[1], width=46))
    print(latency_row(f"sessions page, {args.large:,} sessions: first byte", large[0], width=46))
    print(latency_row(f"sessions page, {args.large:,} sessions: whole page", large[1], width=46))
    print(latency_row(f"search among {args.large:,}: whole page", searched[1], width=46))
    print(latency_row("session page: first byte", session_page[0], width=46))
    print(latency_row("console send -> first streamed delta", replies["delta"], width=46))
    print(latency_row("console send -> final on the page socket", replies["final"], width=46))
    # A page holds 50 rows: 10 sessions render fewer rows, so flatness compares full pages.
    ratio = large[1]["p50"] / full_page[1]["p50"] if full_page[1]["p50"] else float("nan")
    print(f"  sessions page {args.large:,} / 50 sessions (both a full page of 50 rows), p50: {ratio:.2f}x (flat: ~1)")
    print(f"  send -> first delta p50 {fmt_ms(replies['delta']['p50'])} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
