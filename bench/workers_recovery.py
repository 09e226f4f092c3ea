"""Worker recovery benchmark: ``workers_recovery_sweep()`` over 100, 1,000 and 10,000 active placements, each
owning its worker environment, and contended placement transitions on PostgreSQL.

    .venv/bin/python bench/workers_recovery.py [--database-url postgres://...] [--sizes 100,1000,10000]

Runs in this process against a fresh database of its own (SQLite in a temporary state directory; with
``--database-url``, a scratch database ``openclaw_bench_<pid>_recovery`` on that PostgreSQL server, dropped at
the end), migrated first. For every size it bulk-inserts that many sessions, ``static-ssh`` environments
(``attached``, lease ``static-ssh:<op>``, a profile without a host, so ``inspect`` answers ``active`` without
network) and ``active`` placements owning them (epoch 1). One in twenty environments is ``orphaned`` and one
in twenty holds a lease the provider does not recognize (``inspect`` says ``unknown``): both placements must end
``failed`` with "cloud worker disappeared: …", the rest must stay untouched. Then it times the first sweep
(which does that failing work) and a second, steady-state one (nothing left to change), counts their SQL
statements and checks the outcome. The cost per placement should stay flat from 100 to 10,000: pages of
placements with their environments and sessions in one query each, no statement per healthy row.

Exits non-zero when a sweep or the contended run leaves a wrong state; never for speed.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import platform
import re
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ScratchPostgres, is_postgres_url, peak_rss_mib, progress, rss_mib
from tests.support.processes import PROFILE_ENV_PREFIXES

BUNDLE = "a" * 64
MANIFEST = "sha256:" + "b" * 64
PROFILE_SNAPSHOT = {"id": "bench", "provider": "static-ssh", "install": "bundle", "settings": {}}
ORPHAN_ERROR = "bench: the cloud provider lost the machine"
ACTIVE_GENERATION = 4  # local 0 -> requested -> provisioning -> syncing -> starting -> active
BATCH = 1000


class BenchFailure(Exception):
    """The sweep (or the contended run) left a state it must not."""


def setup_django(state_dir: str, database_url: str | None) -> None:
    """The embedded profile in ``state_dir`` (or ``database_url``), exactly: inherited profile variables are dropped,
    as ``bench_gateway`` does for the gateways of the other benchmarks."""
    for name in [k for k in os.environ if k.startswith(PROFILE_ENV_PREFIXES)]:
        del os.environ[name]
    os.environ["OPENCLAW_STATE_DIR"] = state_dir
    if database_url:
        os.environ["DATABASE_URL"] = database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "openclaw_site.settings"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def close_connections() -> None:
    from django.db import connections

    for conn in connections.all():
        conn.close()
        close_pool = getattr(conn, "close_pool", None)
        if close_pool is not None:
            close_pool()


# --- counting statements ----------------------------------------------------------------------


_PLACEHOLDERS = re.compile(r"%s(?:\s*,\s*%s)+")


class StatementCounter:
    """Every statement the default connection of this thread runs, by its text (IN lists collapsed)."""

    def __init__(self) -> None:
        self.by_sql: Counter[str] = Counter()
        self.seconds: Counter[str] = Counter()

    def __call__(self, execute, sql, params, many, context):
        key = _PLACEHOLDERS.sub("%s, …", sql)
        self.by_sql[key] += 1
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.seconds[key] += time.perf_counter() - started

    @property
    def total(self) -> int:
        return sum(self.by_sql.values())


def reset_peak_rss() -> bool:
    """Start a new VmHWM from the current RSS (Linux 4.0+), so the peak of the sweep alone is measured."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def timed_sweep() -> dict:
    from django.db import connection

    from workers_app.services.recovery import workers_recovery_sweep

    counter = StatementCounter()
    gc.collect()
    rss_before = rss_mib(os.getpid())
    # Without the reset, the peak is the process's so far (seeding's, usually higher): no growth is shown.
    peak_reset = reset_peak_rss()
    with connection.execute_wrapper(counter):
        started = time.perf_counter()
        report = workers_recovery_sweep()
        seconds = time.perf_counter() - started
    return {
        "seconds": seconds,
        "queries": counter.total,
        "by_sql": counter.by_sql,
        "sql_seconds": counter.seconds,
        "report": report,
        "peak_rss_growth_mib": max(peak_rss_mib(os.getpid()) - rss_before, 0.0) if peak_reset else None,
    }


# --- seeding ----------------------------------------------------------------------------------


def kind_of(index: int) -> str:
    """One in twenty orphaned, one in twenty with a lost lease, the rest healthy."""
    return {0: "orphaned", 1: "lost"}.get(index % 20, "healthy")


def seed(size: int) -> dict[str, list[int]]:
    """``size`` sessions, environments and active placements; returns the placements' pks by kind."""
    from django.db import connection, transaction

    from sessions_app.models import Session
    from workers_app.models import Placement, PlacementHistory, WorkerEnvironment
    from workers_app.services.placements import now_ms

    # The previous size's rows go first, so each sweep sees exactly ``size`` placements. Its sessions stay: the
    # sweep reads sessions by primary key only.
    PlacementHistory.objects.all().delete()
    Placement.objects.all().delete()
    WorkerEnvironment.objects.all().delete()
    at = now_ms()
    prefix = f"agent:main:recovery-{size}-"
    with transaction.atomic():
        Session.objects.bulk_create(
            (Session(key=f"{prefix}{i:05d}", agent_id="main", created_via="bench") for i in range(size)),
            batch_size=BATCH,
        )
    sessions = list(Session.objects.filter(key__startswith=prefix).order_by("key").values_list("pk", "session_id"))
    environments, placements = [], []
    kinds: dict[str, list[int]] = {"healthy": [], "orphaned": [], "lost": []}
    for index, (pk, session_id) in enumerate(sessions):
        kind = kind_of(index)
        kinds[kind].append(pk)
        operation = f"bench-{size}-{index:05d}"
        environment_id = f"worker:{operation}"
        lease = f"static-ssh:{operation}"
        if kind == "lost":
            # Not a lease of static-ssh: the first one the bare prefix, the rest another prefix (the unique
            # (provider, lease) constraint allows one bare prefix per provider).
            lease = "static-ssh:" if index == 1 else f"lost:{operation}"
        environments.append(
            WorkerEnvironment(
                environment_id=environment_id,
                provider_id="static-ssh",
                profile_id="bench",
                profile_snapshot=PROFILE_SNAPSHOT,
                state="orphaned" if kind == "orphaned" else "attached",
                lease_id=lease,
                provision_operation_id=operation,
                shared_host=True,
                bootstrap_install_kind="bundle",
                owner_epoch=1,
                attached_session_ids=[session_id],
                last_error=ORPHAN_ERROR if kind == "orphaned" else None,
                created_at_ms=at,
                updated_at_ms=at,
                state_changed_at_ms=at,
                last_activated_at_ms=at,
            )
        )
        placements.append(
            Placement(
                session_id=pk,
                agent_id="main",
                session_key=f"{prefix}{index:05d}",
                execution_mode="worker-turn",
                state="active",
                generation=ACTIVE_GENERATION,
                environment_id=environment_id,
                active_owner_epoch=1,
                workspace_base_manifest_ref=MANIFEST,
                remote_workspace_dir=f"/work/{session_id}",
                worker_bundle_hash=BUNDLE,
                dispatch_target="profile:bench",
                dispatch_owner="gateway:bench",
                created_at_ms=at,
                updated_at_ms=at,
                state_changed_at_ms=at,
            )
        )
    with transaction.atomic():
        WorkerEnvironment.objects.bulk_create(environments, batch_size=BATCH)
        Placement.objects.bulk_create(placements, batch_size=BATCH)
    if connection.vendor == "postgresql":
        # What autovacuum would do shortly after such a load; without it the planner sees the previous size.
        with connection.cursor() as cursor:
            for model in (Session, Placement, PlacementHistory, WorkerEnvironment):
                cursor.execute(f'ANALYZE "{model._meta.db_table}"')
    return kinds


# --- checks -----------------------------------------------------------------------------------


def snapshot() -> tuple[dict, dict, int]:
    from workers_app.models import Placement, PlacementHistory, WorkerEnvironment

    placements = {
        row[0]: row[1:]
        for row in Placement.objects.values_list(
            "pk", "state", "generation", "updated_at_ms", "recovery_error", "terminal_reason"
        )
    }
    environments = {
        row[0]: row[1:]
        for row in WorkerEnvironment.objects.values_list("pk", "state", "owner_epoch", "updated_at_ms", "last_error")
    }
    return placements, environments, PlacementHistory.objects.count()


def check_first_sweep(size: int, kinds: dict[str, list[int]], before: tuple, first: dict) -> None:
    from workers_app.models import Placement, WorkerEnvironment
    from workers_app.services.environments import PROVIDER_LOST_LEASE_ERROR

    problems: list[str] = []
    placements_before, environments_before, _ = before
    placements, environments, _ = snapshot()
    healthy_changed = [pk for pk in kinds["healthy"] if placements[pk] != placements_before[pk]]
    if healthy_changed:
        pk = healthy_changed[0]
        problems.append(
            f"{len(healthy_changed)} healthy placements changed (first: {placements_before[pk]} -> {placements[pk]})"
        )
    env_of = dict(Placement.objects.values_list("pk", "environment_id"))
    healthy_envs = [env_of[pk] for pk in kinds["healthy"]]
    touched = [e for e in healthy_envs if environments[e] != environments_before[e]]
    if touched:
        first_touched = touched[0]
        problems.append(
            f"{len(touched)} healthy environments changed (first: {first_touched}: {environments[first_touched]})"
        )
    expected = {
        "orphaned": f"cloud worker disappeared: {ORPHAN_ERROR}",
        "lost": f"cloud worker disappeared: {PROVIDER_LOST_LEASE_ERROR}",
    }
    for kind, reason in expected.items():
        wrong = [
            pk
            for pk in kinds[kind]
            if placements[pk][0] != "failed" or placements[pk][3] != reason or placements[pk][4] != reason
        ]
        if wrong:
            problems.append(
                f"{len(wrong)} {kind} placements not failed with {reason!r} (first: {placements[wrong[0]]})"
            )
    lost_envs = WorkerEnvironment.objects.filter(pk__in=[env_of[pk] for pk in kinds["lost"]])
    not_failed = [e.pk for e in lost_envs if e.state != "failed"]
    if not_failed:
        problems.append(f"{len(not_failed)} environments with a lost lease not failed (first: {not_failed[0]})")
    report = first["report"]
    failed = len(kinds["orphaned"]) + len(kinds["lost"])
    wanted = {"placement:healthy": len(kinds["healthy"]), "placement:active-failed": failed}
    got = {key: report.outcomes.get(key, 0) for key in wanted}
    if report.placements_seen != size or got != wanted:
        problems.append(f"report: {report.placements_seen} placements seen, {report.as_dict()}; expected {wanted}")
    if problems:
        raise BenchFailure(f"first sweep at {size:,} placements: " + "; ".join(problems))


def check_steady_sweep(size: int, after_first: tuple, steady: dict) -> None:
    after = snapshot()
    problems = []
    for label, old, new in zip(("placements", "environments"), after_first[:2], after[:2], strict=True):
        changed = [key for key in old if old[key] != new.get(key)]
        if changed or len(new) != len(old):
            problems.append(f"{len(changed)} {label} changed (first: {changed[:1]})")
    if after[2] != after_first[2]:
        problems.append(f"{after[2] - after_first[2]} history rows written")
    changes = {
        k: v for k, v in steady["report"].outcomes.items() if not k.endswith((":healthy", ":terminal", ":settled"))
    }
    if changes and set(changes) != {"environment:active"}:
        problems.append(f"report outcomes {steady['report'].as_dict()}")
    if problems:
        raise BenchFailure(f"steady sweep at {size:,} placements changed something: " + "; ".join(problems))


# --- contended transitions (PostgreSQL) -------------------------------------------------------


def contended(target: int, writers: int) -> dict:
    """``writers`` threads race on one placement around local -> requested -> failed -> local (the cycle of
    ``test_sixteen_concurrent_writers_lose_no_update``) until ``target`` changes succeeded."""
    from django.db import connections

    from gateway.exceptions import Conflict, InvalidRequest
    from sessions_app.models import Session
    from workers_app.models import Placement, PlacementHistory, PlacementState
    from workers_app.services import placements as store

    S = PlacementState
    session = Session.objects.create(key="agent:main:recovery-contended", agent_id="main", created_via="bench")
    store.placement_ensure_local(session=session)
    next_step = {S.LOCAL: S.REQUESTED, S.REQUESTED: S.FAILED, S.FAILED: S.LOCAL}
    successes: list[int] = []
    conflicts: Counter[str] = Counter()
    crashes: list[str] = []
    lock = threading.Lock()

    def writer() -> None:
        try:
            while True:
                with lock:
                    if len(successes) >= target or crashes:
                        return
                state, generation = Placement.objects.values_list("state", "generation").get(pk=session.pk)
                try:
                    if next_step[state] == S.FAILED:
                        moved = store.placement_fail(
                            session=session, recovery_error="cycle", expected_generation=generation
                        )
                    else:
                        moved = store.placement_transition(
                            session=session, from_state=state, to_state=next_step[state], expected_generation=generation
                        )
                except (Conflict, InvalidRequest) as error:
                    with lock:
                        conflicts[re.sub(r"@\d+", "@N", error.message.replace(session.session_id, "<session>"))] += 1
                    continue
                finally:
                    # Back to the pool after every attempt, as a request would.
                    connections.close_all()
                with lock:
                    successes.append(moved.generation)
        except Exception as error:
            with lock:
                crashes.append(f"{type(error).__name__}: {error}")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=writer, name=f"writer-{n}") for n in range(writers)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    seconds = time.perf_counter() - started
    final = Placement.objects.get(pk=session.pk)
    history = PlacementHistory.objects.filter(session=session).count()
    problems = []
    if crashes:
        problems.append(f"{len(crashes)} writers died (first: {crashes[0]})")
    if any(thread.is_alive() for thread in threads):
        problems.append("writers still running after 600 s")
    if len(successes) < target:
        problems.append(f"only {len(successes)} of {target} transitions succeeded")
    if len(set(successes)) != len(successes):
        problems.append(f"{len(successes) - len(set(successes))} generations were handed out twice")
    if final.generation != len(successes):
        problems.append(f"final generation {final.generation} != {len(successes)} successes (an update was lost)")
    if history != len(successes) + 1:
        problems.append(f"{history} history rows for {len(successes)} successes (+1 creation)")
    if problems:
        raise BenchFailure("contended transitions: " + "; ".join(problems))
    return {
        "seconds": seconds,
        "successes": len(successes),
        "conflicts": sum(conflicts.values()),
        "by_message": conflicts,
        "writers": writers,
    }


# --- output -----------------------------------------------------------------------------------


def per_row_statements(by_sql: Counter[str], size: int) -> list[tuple[int, str]]:
    """Statements run at least once for every other placement: a query per row."""
    return [(count, sql) for sql, count in by_sql.most_common() if count >= size / 2]


def print_statements(title: str, sweep: dict, limit: int) -> None:
    print(f"{title} (count, ms in the database call, statement)")
    for sql, count in sweep["by_sql"].most_common(limit):
        print(f"  {count:>7,} {sweep['sql_seconds'][sql] * 1000:>9.1f} ms  {sql[:130]}")


def run(args: argparse.Namespace, cleanups: contextlib.ExitStack) -> int:
    sizes = [int(s) for s in args.sizes.split(",")]
    state_dir = tempfile.mkdtemp(prefix="openclaw-bench-state-")
    cleanups.callback(shutil.rmtree, state_dir, ignore_errors=True)
    database_url, scratch = args.database_url, None
    if is_postgres_url(database_url):
        scratch = ScratchPostgres(database_url, "_recovery")
        scratch.create()
        cleanups.callback(scratch.drop)
        database_url = scratch.url
    progress("migrating")
    setup_django(state_dir, database_url)
    cleanups.callback(close_connections)
    from django.db import connection

    vendor = connection.vendor
    print("OpenClaw worker recovery benchmark")
    if scratch is not None:
        print(f"  database       postgresql {scratch.server_version} (scratch database {scratch.name})")
    else:
        print(f"  database       {vendor} (embedded, {state_dir})")
    print(f"  python         {platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} cpus")
    print("  placements     active, each owning its static-ssh environment; 1 in 20 orphaned, 1 in 20 lost lease")
    print()
    header = (
        f"{'placements':>10}{'seed s':>8}{'first ms':>10}{'steady ms':>11}{'first µs/pl':>13}{'steady µs/pl':>14}"
        f"{'first q':>9}{'steady q':>10}{'first q/pl':>12}{'steady q/pl':>13}{'q/failed':>10}{'ms/failed':>11}"
        f"{'peak RSS +MiB':>15}"
    )
    print(header)
    findings: list[str] = []
    detail = None
    for size in sizes:
        progress(f"seeding {size:,} placements")
        seeding = time.perf_counter()
        kinds = seed(size)
        seed_s = time.perf_counter() - seeding
        before = snapshot()
        progress(f"first sweep over {size:,}")
        first = timed_sweep()
        check_first_sweep(size, kinds, before, first)
        after_first = snapshot()
        progress(f"steady sweep over {size:,}")
        steady = timed_sweep()
        check_steady_sweep(size, after_first, steady)
        failed = len(kinds["orphaned"]) + len(kinds["lost"])
        # Statements of the first sweep beyond the steady one's: what failing the broken placements cost.
        per_failed = (first["queries"] - steady["queries"]) / failed if failed else 0.0
        ms_failed = (first["seconds"] - steady["seconds"]) * 1000 / failed if failed else 0.0
        growths = [s["peak_rss_growth_mib"] for s in (first, steady) if s["peak_rss_growth_mib"] is not None]
        growth = f"{max(growths):.1f}" if growths else "-"
        print(
            f"{size:>10,}{seed_s:>8.1f}{first['seconds'] * 1000:>10.1f}{steady['seconds'] * 1000:>11.1f}"
            f"{first['seconds'] / size * 1e6:>13.1f}{steady['seconds'] / size * 1e6:>14.1f}"
            f"{first['queries']:>9,}{steady['queries']:>10,}{first['queries'] / size:>12.3f}"
            f"{steady['queries'] / size:>13.3f}{per_failed:>10.1f}{ms_failed:>11.2f}{growth:>15}",
            flush=True,
        )
        findings += [
            f"  {size:,}: {count:,} x {sql[:150]}" for count, sql in per_row_statements(steady["by_sql"], size)
        ]
        detail = (size, first, steady)
    print()
    print(
        "first = the sweep that fails the broken placements (drain, reconcile, fail, history; environment "
        "teardown for lost leases);\nsteady = the next sweep, nothing to change. q = SQL statements on the "
        "default connection; q/failed and ms/failed = (first - steady) / failed placements;\npeak RSS + = the "
        "sweeps' peak RSS (VmHWM after a reset) above the RSS before them."
    )
    if findings:
        print()
        print("steady sweep: statements run once per placement or more (a query per row)")
        print("\n".join(findings))
    if args.queries and detail is not None:
        size, first, steady = detail
        print()
        print_statements(f"first sweep at {size:,}: statements by count", first, 20)
        print_statements(f"steady sweep at {size:,}: statements by count", steady, 10)
    print()
    if vendor != "postgresql":
        print("contended transitions: skipped (PostgreSQL only; SQLite serializes writers). Use --database-url.")
    elif args.transitions > 0:
        progress(f"contended transitions: {args.writers} writers, {args.transitions:,} successes")
        result = contended(args.transitions, args.writers)
        print(
            f"contended transitions: {result['writers']} threads on one placement, "
            f"local -> requested -> failed -> local"
        )
        print(
            f"  {result['successes']:,} successful transitions in {result['seconds']:.2f} s = "
            f"{result['successes'] / result['seconds']:,.0f} transitions/s; {result['conflicts']:,} conflicts "
            f"({result['conflicts'] / max(result['successes'], 1):.2f} per success); every success got its own "
            f"generation, none lost"
        )
        for message, count in result["by_message"].most_common(4):
            print(f"    {count:>6,} x {message}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help="PostgreSQL server to use (a scratch database is created and dropped)")
    parser.add_argument("--sizes", default="100,1000,10000", help="placements per run, comma-separated")
    parser.add_argument("--transitions", type=int, default=1000, help="successful contended transitions (PostgreSQL)")
    parser.add_argument("--writers", type=int, default=16, help="threads racing on the contended placement")
    parser.add_argument("--queries", action="store_true", help="also print the statements of the largest size")
    args = parser.parse_args(argv)
    try:
        with contextlib.ExitStack() as cleanups:
            return run(args, cleanups)
    except BenchFailure as failure:
        print(f"\nFAILED: {failure}", flush=True)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
