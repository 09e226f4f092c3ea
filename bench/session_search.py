"""The sessions list's reads at scale: one page of the console's session index (``sessions_app.session_index``) —
no search, a transcript search for a common word, a rare word, a phrase and a word no message holds, and the
tokens sort — over N sessions of M messages each, with percentiles.

A scratch database is migrated first (PostgreSQL with ``--database-url``: a database of its own on that server,
dropped at the end; else the embedded SQLite in a temporary state directory), then sessions, their transcript
windows and messages, and two finished turns with usage per session are bulk-inserted and the tables analysed.
The timings are the selector's (the one query of a page) plus the placements' read the view adds.

    .venv/bin/python bench/session_search.py --database-url postgres://postgres@127.0.0.1:5432/postgres
    .venv/bin/python bench/session_search.py --sessions 2000
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ScratchPostgres, is_postgres_url, latency_header, latency_row, progress, summarize
from bench.workers_recovery import close_connections, setup_django

BATCH = 5000
# Text made of a plain vocabulary: "deploy" is in about one message in ten, "zeppelin" in one session in a thousand.
VOCABULARY = (
    "the a to of and in for on with that this is was it be as at by from or an are not have has you we they "
    "please review check file code test build run fix error update change add remove write read open close "
    "service server client request response model agent session message tool result output input branch"
).split()
COMMON, RARE, ABSENT = "deploy", "zeppelin", "quixotic"


def message_text(rng: random.Random, session_index: int, message_index: int) -> str:
    words = rng.choices(VOCABULARY, k=rng.randint(8, 60))
    if rng.random() < 0.1:
        words.insert(rng.randrange(len(words)), COMMON)
    if session_index % 1000 == 7 and message_index == 3:
        words.insert(0, RARE)
    return " ".join(words)


def seed(sessions: int, messages: int) -> None:
    from django.db import connection, transaction

    from sessions_app.models import Run, Session, SessionWindow, TranscriptEvent

    rng = random.Random(30)
    for start in range(0, sessions, BATCH // 10):
        stop = min(start + BATCH // 10, sessions)
        with transaction.atomic():
            rows = Session.objects.bulk_create(
                Session(key=f"agent:main:bench-{index:06d}", label=f"bench {index}" if index % 3 else "")
                for index in range(start, stop)
            )
            SessionWindow.objects.bulk_create(
                SessionWindow(
                    id=row.session_id, session=row, reason="initial", next_seq=messages + 1, message_count=messages
                )
                for row in rows
            )
            events = []
            for offset, row in enumerate(rows):
                for seq in range(1, messages + 1):
                    role = "user" if seq % 2 else "assistant"
                    text = message_text(rng, start + offset, seq)
                    body = {"role": role, "content": [{"type": "text", "text": text}], "timestamp": seq}
                    events.append(TranscriptEvent(window_id=row.session_id, seq=seq, body=body))
            TranscriptEvent.objects.bulk_create(events, batch_size=BATCH)
            Run.objects.bulk_create(
                (
                    Run(
                        run_id=str(uuid.uuid4()),
                        session=row,
                        session_key=row.key,
                        window_id=row.session_id,
                        status="ok",
                        message="m",
                        usage={"input": rng.randint(10, 5000), "output": rng.randint(10, 900)},
                    )
                    for row in rows
                    for _turn in range(2)
                ),
                batch_size=BATCH,
            )
        progress(f"seeded {stop}/{sessions} sessions")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def timed_page(samples: int, **query) -> tuple[dict, int]:
    from sessions_app.session_index import sessions_index_page
    from workers_app import selectors as worker_selectors

    durations = []
    found = 0
    for index in range(samples + 3):
        started = time.perf_counter()
        rows, _more = sessions_index_page(limit=50, offset=0, archived=False, **query)
        worker_selectors.placement_fields([row.session for row in rows])
        if index >= 3:  # the first reads warm the caches
            durations.append(time.perf_counter() - started)
        found = len(rows)
    return summarize(durations), found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", help="a PostgreSQL server (a scratch database is made on it)")
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--messages", type=int, default=20)
    parser.add_argument("--samples", type=int, default=30)
    args = parser.parse_args()
    scratch = None
    if args.database_url:
        if not is_postgres_url(args.database_url):
            parser.error("--database-url must name a PostgreSQL server")
        scratch = ScratchPostgres(args.database_url, "_search")
        scratch.create()
    try:
        with tempfile.TemporaryDirectory(prefix="openclaw-session-search-") as state_dir:
            setup_django(state_dir, scratch.url if scratch else None)
            from django.db import connection

            started = time.perf_counter()
            seed(args.sessions, args.messages)
            vendor = connection.vendor
            print(
                f"session index, {args.sessions} sessions x {args.messages} messages on {vendor} "
                f"{scratch.server_version if scratch else ''} (seeded in {time.perf_counter() - started:.0f} s); "
                "a page of 50, ms"
            )
            print(latency_header("query", width=44) + f"{'rows':>7}")
            cases = [
                ("no search, newest first", {"search": None, "sort": "-updated"}),
                ("no search, most tokens first", {"search": None, "sort": "-tokens"}),
                (f"search '{COMMON}' (~1 message in 10)", {"search": COMMON, "sort": "-updated"}),
                (f"search '{RARE}' (1 session in 1000)", {"search": RARE, "sort": "-updated"}),
                ("search a phrase", {"search": '"review the code"', "sort": "-updated"}),
                (f"search '{ABSENT}' (no match)", {"search": ABSENT, "sort": "-updated"}),
            ]
            for label, query in cases:
                stats, found = timed_page(args.samples, **query)
                print(latency_row(label, stats, width=44) + f"{found:>7}")
            close_connections()
    finally:
        if scratch is not None:
            scratch.drop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
