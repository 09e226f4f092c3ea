"""The operations app's reads.

The System page: the gateway processes with their connections, and the recent internal errors.

Usage reports: tokens and cost per model, per session and per day, from the runs' recorded usage.

Every figure is aggregated by the database (one ``GROUP BY`` per view of the runs, days cut with ``TruncDate`` in
the report's zone); Python only prices the grouped rows (prices are per model, so every grouping keeps the
model) and shapes OpenClaw's payloads. A turn counts on the day it was sent (``Run.created_at``, the indexed
column of the runs list). Tokens are what each finished run recorded in ``Run.usage`` (``input``, ``output``
and, when a provider reports them, ``cacheRead`` / ``cacheWrite``); a value that is not a non-negative JSON
number (a worker host reports its own usage) counts as 0 instead of failing the report.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any, Literal

from django.db.models import Count, F, Max, Min, Q, QuerySet, Sum
from django.db.models.functions import TruncDate

from gateway import selectors as gateway_selectors
from gateway import state
from gateway.exceptions import InvalidRequest
from gateway.models import GatewayProcess
from gateway.protocol import SERVER_VERSION
from gateway.selectors import now_ms, to_ms
from sessions_app import keys
from sessions_app.models import Run, RunStatus, Session
from sessions_app.run_usage import TOKEN_KINDS, recorded_tokens, recorded_total_tokens

from .models import RecordedError
from .pricing import CostTotals, TokenCounts, cost_of, model_prices, price_for, usd
from .usage_window import UsageWindow

# --- the System page --------------------------------------------------------------------------------

PROCESSES_SHOWN = 100
ERRORS_SHOWN = 50


@dataclass(frozen=True)
class ProcessRow:
    boot_id: str
    hostname: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    live: bool
    this_process: bool
    operators: int
    nodes: int


def gateway_processes() -> list[ProcessRow]:
    """Registered gateway processes, oldest first, with their open connections by role (one query)."""
    stale_before = gateway_selectors.process_stale_before()
    rows = GatewayProcess.objects.annotate(
        operators=Count("connections", filter=Q(connections__role="operator")),
        nodes=Count("connections", filter=Q(connections__role="node")),
    ).order_by("started_at", "boot_id")[:PROCESSES_SHOWN]
    return [
        ProcessRow(
            boot_id=str(process.boot_id),
            hostname=process.hostname,
            pid=process.pid,
            started_at=process.started_at,
            heartbeat_at=process.heartbeat_at,
            live=process.heartbeat_at >= stale_before,
            this_process=str(process.boot_id) == state.BOOT_ID,
            operators=process.operators,
            nodes=process.nodes,
        )
        for process in rows
    ]


def server_version() -> str:
    return SERVER_VERSION


def recent_errors(limit: int = ERRORS_SHOWN) -> list[RecordedError]:
    return list(RecordedError.objects.order_by("-id")[:limit])


# --- usage ------------------------------------------------------------------------------------------
UNKNOWN_MODEL = "unknown"


@dataclass(frozen=True)
class UsageScope:
    """Which runs a report reads: every agent's (``agent_id`` None), one agent's, or one session's."""

    agent_id: str | None = None
    session_pk: int | None = None
    nothing: bool = False  # a session key that names no session: an empty report, not an error


@dataclass
class Activity:
    """Turns, by how they ended (OpenClaw's message counts: a turn is a user message, a reply an assistant one)."""

    runs: int = 0
    replies: int = 0
    errors: int = 0

    def add(self, other: Activity) -> None:
        self.runs += other.runs
        self.replies += other.replies
        self.errors += other.errors

    def payload(self) -> dict[str, int]:
        # Tool calls are kept in the transcript, not counted per run: reported as 0.
        return {
            "total": self.runs + self.replies,
            "user": self.runs,
            "assistant": self.replies,
            "toolCalls": 0,
            "toolResults": 0,
            "errors": self.errors,
        }


@dataclass
class ModelUsage:
    provider: str
    model: str
    priced: bool
    runs: int = 0
    cost: CostTotals = field(default_factory=CostTotals)

    def payload(self) -> dict[str, Any]:
        return {
            **_named(self.provider, self.model),
            "count": self.runs,
            "totals": self.cost.payload(),
            "priced": self.priced,
        }


def _named(provider: str, model: str) -> dict[str, str]:
    """OpenClaw's optional ``provider`` / ``model`` fields: left out when a run recorded none."""
    return {**({"provider": provider} if provider else {}), **({"model": model} if model else {})}


@dataclass
class DayUsage:
    day: date
    cost: CostTotals = field(default_factory=CostTotals)
    activity: Activity = field(default_factory=Activity)


@dataclass
class SessionUsage:
    session: Session
    cost: CostTotals = field(default_factory=CostTotals)
    activity: Activity = field(default_factory=Activity)
    first_activity: datetime | None = None
    last_activity: datetime | None = None
    days: dict[date, CostTotals] = field(default_factory=dict)
    models: dict[tuple[str, str], ModelUsage] = field(default_factory=dict)
    model_days: dict[tuple[date, str, str], ModelUsage] = field(default_factory=dict)


@dataclass
class UsageReport:
    window: UsageWindow
    totals: CostTotals
    activity: Activity
    days: dict[date, DayUsage]
    models: list[ModelUsage]
    agents: dict[str, CostTotals]
    model_days: dict[tuple[date, str, str], ModelUsage]
    sessions: list[SessionUsage]
    # Sessions with turns in the window (``sessions`` holds at most the limit of them).
    session_count: int
    missing_pricing: list[str]

    def daily(self) -> list[DayUsage]:
        """Every day of the window, the ones without a run included (a chart's x axis)."""
        return [self.days.get(day) or DayUsage(day=day) for day in self.window.each_day()]


def _sums() -> dict[str, Any]:
    return {
        **{kind: Sum(recorded_tokens(kind)) for kind in TOKEN_KINDS},
        "usage_runs": Count("run_id", filter=Q(usage__isnull=False)),
        "runs": Count("run_id"),
        "replies": Count("run_id", filter=Q(status=RunStatus.OK)),
        "errors": Count("run_id", filter=Q(status=RunStatus.ERROR)),
    }


def _runs(window: UsageWindow, scope: UsageScope) -> QuerySet[Run]:
    runs = Run.objects.filter(created_at__gte=window.start, created_at__lt=window.end)
    if scope.nothing:
        return runs.none()
    if scope.session_pk is not None:
        runs = runs.filter(session_id=scope.session_pk)
    if scope.agent_id is not None:
        runs = runs.filter(session__agent_id=scope.agent_id)
    return runs


def _tokens(row: dict[str, Any]) -> TokenCounts:
    return TokenCounts(**{kind: round(row[kind] or 0) for kind in TOKEN_KINDS}, runs=row["usage_runs"])


def _activity(row: dict[str, Any]) -> Activity:
    return Activity(runs=row["runs"], replies=row["replies"], errors=row["errors"])


def model_label(model: str) -> str:
    return model or UNKNOWN_MODEL


def usage_report(
    window: UsageWindow,
    scope: UsageScope,
    *,
    session_limit: int = 0,
    session_order: Literal["recent", "tokens"] = "recent",
    by_agent: bool = False,
) -> UsageReport:
    """The report of the runs in ``window`` and ``scope``: totals, per day, per model, per agent (``by_agent``), and
    the ``session_limit`` sessions first by ``session_order`` (latest activity, or most tokens) with their own
    breakdown. One grouped query; with sessions, one to rank them, one for their rows and one to break them down."""
    prices = model_prices()
    missing: set[str] = set()

    def priced(provider: str, model: str, tokens: TokenCounts) -> tuple[CostTotals, bool]:
        price = price_for(prices, provider=provider, model=model)
        if price is None and tokens.runs:
            missing.add(f"{provider}/{model_label(model)}" if provider else model_label(model))
        return cost_of(tokens, price), price is not None

    totals, activity = CostTotals(), Activity()
    days: dict[date, DayUsage] = {}
    models: dict[tuple[str, str], ModelUsage] = {}
    agents: dict[str, CostTotals] = defaultdict(CostTotals)
    model_days: dict[tuple[date, str, str], ModelUsage] = {}
    # The agent is a join to the sessions (about a third of the query's time): only when the totals per agent
    # are asked for.
    agent = {"agent": F("session__agent_id")} if by_agent else {}
    grouped = (
        _runs(window, scope)
        .annotate(day=TruncDate("created_at", tzinfo=window.zone), **agent)
        .values("day", *agent, "model_provider", "model")
        .annotate(**_sums())
        .order_by()
    )
    for row in grouped:
        tokens = _tokens(row)
        cost, is_priced = priced(row["model_provider"], row["model"], tokens)
        row_activity = _activity(row)
        totals.add(cost)
        activity.add(row_activity)
        day = days.get(row["day"]) or days.setdefault(row["day"], DayUsage(day=row["day"]))
        day.cost.add(cost)
        day.activity.add(row_activity)
        if by_agent:
            agents[row["agent"]].add(cost)
        model_key = (row["model_provider"], row["model"])
        _add_to(models, model_key, model_key, is_priced, tokens.runs, cost)
        _add_to(model_days, (row["day"], *model_key), model_key, is_priced, tokens.runs, cost)

    sessions, session_count = (
        _session_usage(window, scope, session_limit, session_order, priced) if session_limit else ([], 0)
    )
    return UsageReport(
        window=window,
        totals=totals,
        activity=activity,
        days=days,
        models=sorted(models.values(), key=lambda m: (-m.cost.totalCost, -m.cost.totalTokens, m.model)),
        agents=dict(agents),
        model_days=model_days,
        sessions=sessions,
        session_count=session_count,
        missing_pricing=sorted(missing),
    )


def _add_to(buckets: dict, key: tuple, model_key: tuple[str, str], priced: bool, runs: int, cost: CostTotals) -> None:
    bucket = buckets.get(key)
    if bucket is None:
        bucket = buckets[key] = ModelUsage(*model_key, priced=priced)
    bucket.runs += runs
    bucket.cost.add(cost)


def _session_usage(
    window: UsageWindow,
    scope: UsageScope,
    limit: int,
    order: Literal["recent", "tokens"],
    priced: Callable[[str, str, TokenCounts], tuple[CostTotals, bool]],
) -> tuple[list[SessionUsage], int]:
    runs = _runs(window, scope)
    total_tokens = recorded_total_tokens()
    ranked = runs.values("session_id").annotate(tokens=Sum(total_tokens), latest=Max("created_at"))
    ranking = ("-tokens", "-latest") if order == "tokens" else ("-latest", "-tokens")
    ids = [row["session_id"] for row in ranked.order_by(*ranking, "session_id")[:limit]]
    # Below the limit the ranking is every session; at it, one more query counts them.
    count = len(ids) if len(ids) < limit else ranked.count()
    if not ids:
        return [], count
    rows = {session.pk: SessionUsage(session=session) for session in Session.objects.filter(pk__in=ids)}
    breakdown = (
        runs.filter(session_id__in=ids)
        .annotate(day=TruncDate("created_at", tzinfo=window.zone))
        .values("session_id", "day", "model_provider", "model")
        .annotate(**_sums(), first=Min("created_at"), last=Max("created_at"))
        .order_by()
    )
    for row in breakdown:
        usage = rows.get(row["session_id"])
        if usage is None:  # deleted between the two reads
            continue
        tokens = _tokens(row)
        cost, is_priced = priced(row["model_provider"], row["model"], tokens)
        usage.cost.add(cost)
        usage.activity.add(_activity(row))
        usage.first_activity = min(filter(None, (usage.first_activity, row["first"])))
        usage.last_activity = max(filter(None, (usage.last_activity, row["last"])))
        (usage.days.get(row["day"]) or usage.days.setdefault(row["day"], CostTotals())).add(cost)
        model_key = (row["model_provider"], row["model"])
        _add_to(usage.models, model_key, model_key, is_priced, tokens.runs, cost)
        _add_to(usage.model_days, (row["day"], *model_key), model_key, is_priced, tokens.runs, cost)
    return [rows[pk] for pk in ids if pk in rows], count


# --- OpenClaw's payloads -----------------------------------------------------------------------------------


def usage_status_payload() -> dict[str, Any]:
    """``usage.status``: OpenClaw reports the quota windows of subscription providers (Anthropic, Copilot, …).
    This gateway's providers (the built-in ``echo``, an OpenAI-compatible endpoint) report none, so there is no
    provider snapshot to give: the token and cost figures are ``usage.cost`` and ``sessions.usage``."""
    return {"updatedAt": now_ms(), "providers": []}


def usage_cost_payload(report: UsageReport) -> dict[str, Any]:
    """``usage.cost``: OpenClaw's ``CostUsageSummary`` (days with runs only), plus the window's dates and the
    models whose tokens had no price (``missingPricing``: their cost is counted as 0)."""
    return {
        "updatedAt": now_ms(),
        "days": report.window.days,
        "daily": [{"date": day.isoformat(), **report.days[day].cost.payload()} for day in sorted(report.days)],
        "totals": report.totals.payload(),
        "startDate": report.window.first_day.isoformat(),
        "endDate": report.window.last_day.isoformat(),
        "missingPricing": report.missing_pricing,
    }


def sessions_usage_payload(report: UsageReport, *, include_context_weight: bool) -> dict[str, Any]:
    """``sessions.usage``: OpenClaw's ``SessionsUsageResult``. One row per session key, covering every transcript
    generation of the session (what OpenClaw's ``groupBy: "family"`` reports)."""
    return {
        "updatedAt": now_ms(),
        "startDate": report.window.first_day.isoformat(),
        "endDate": report.window.last_day.isoformat(),
        "sessions": [_session_entry(usage, include_context_weight) for usage in report.sessions],
        "totals": report.totals.payload(),
        "aggregates": {
            "sessionCount": report.session_count,
            "messages": report.activity.payload(),
            "tools": {"totalCalls": 0, "uniqueTools": 0, "tools": []},
            "byModel": [model.payload() for model in report.models],
            "byProvider": _by_provider(report.models),
            "byAgent": [
                {"agentId": agent, "totals": cost.payload()}
                for agent, cost in sorted(report.agents.items(), key=lambda item: (-item[1].totalCost, item[0]))
            ],
            "byChannel": [],
            # Who started each session (OpenClaw's operator profiles and channels): this gateway does not record it.
            "byCreator": [],
            "costDaily": [
                {"date": day.isoformat(), **usage.cost.payload()} for day, usage in sorted(report.days.items())
            ],
            "daily": [
                {
                    "date": day.isoformat(),
                    "tokens": usage.cost.totalTokens,
                    "cost": usd(usage.cost.totalCost),
                    "messages": usage.activity.runs + usage.activity.replies,
                    "toolCalls": 0,
                    "errors": usage.activity.errors,
                }
                for day, usage in sorted(report.days.items())
            ],
            "modelDaily": _model_days(report.model_days),
        },
        "missingPricing": report.missing_pricing,
    }


def _by_provider(models: list[ModelUsage]) -> list[dict[str, Any]]:
    providers: dict[str, ModelUsage] = {}
    for model in models:
        bucket = providers.setdefault(model.provider, ModelUsage(model.provider, "", priced=True))
        bucket.runs += model.runs
        bucket.cost.add(model.cost)
        bucket.priced = bucket.priced and model.priced
    ordered = sorted(providers.values(), key=lambda p: (-p.cost.totalCost, -p.cost.totalTokens, p.provider))
    return [
        {**_named(p.provider, ""), "count": p.runs, "totals": p.cost.payload(), "priced": p.priced} for p in ordered
    ]


def _model_days(model_days: dict[tuple[date, str, str], ModelUsage]) -> list[dict[str, Any]]:
    return [
        {
            "date": day.isoformat(),
            **_named(usage.provider, usage.model),
            "tokens": usage.cost.totalTokens,
            "cost": usd(usage.cost.totalCost),
            "count": usage.runs,
        }
        for (day, _, _), usage in sorted(model_days.items(), key=lambda item: (item[0][0], item[0][1], item[0][2]))
    ]


def _session_entry(usage: SessionUsage, include_context_weight: bool) -> dict[str, Any]:
    session = usage.session
    first, last = to_ms(usage.first_activity), to_ms(usage.last_activity)
    entry: dict[str, Any] = {
        "key": session.key,
        "sessionId": session.session_id,
        "updatedAt": to_ms(session.updated_at),
        "agentId": session.agent_id,
        "usage": {
            **usage.cost.payload(),
            "sessionId": session.session_id,
            "firstActivity": first,
            "lastActivity": last,
            "durationMs": (last - first) if first is not None and last is not None else 0,
            "activityDates": [day.isoformat() for day in sorted(usage.days)],
            "dailyBreakdown": [
                {"date": day.isoformat(), "tokens": cost.totalTokens, "cost": usd(cost.totalCost)}
                for day, cost in sorted(usage.days.items())
            ],
            "dailyModelUsage": _model_days(usage.model_days),
            "messageCounts": usage.activity.payload(),
            "modelUsage": [model.payload() for model in usage.models.values()],
        },
    }
    if session.label:
        entry["label"] = session.label
    if session.model:
        entry["model"] = session.model
    if session.model_provider:
        entry["modelProvider"] = session.model_provider
    entry["hasContextWeight"] = False
    if include_context_weight:
        # OpenClaw's system-prompt report; this gateway keeps none.
        entry["contextWeight"] = None
    return entry


# --- who a request reads -----------------------------------------------------------------------------------


def usage_scope(
    *, agent_id: str | None, agent_scope: str | None, key: str | None = None, accepts_key: bool = False
) -> UsageScope:
    """OpenClaw's rules: ``agentScope: "all"`` reads every agent (and takes no agent or session key with it), a
    session key reads that session (its agent must match ``agentId``), else one agent: ``agentId``, or the default
    agent. ``accepts_key``: the method takes a ``key`` (``sessions.usage``), which its refusal names."""
    if agent_scope == "all":
        if key is not None or agent_id is not None:
            combined = "key or agentId" if accepts_key else "agentId"
            raise InvalidRequest(f"agentScope=all cannot be combined with {combined}")
        return UsageScope()
    agent = keys.normalize_agent_id(agent_id) if agent_id is not None else None
    if key is not None:
        canonical = keys.canonical_key(key, agent)
        if agent is not None and keys.agent_of(canonical) != agent:
            raise InvalidRequest("session key agent does not match agentId")
        session_pk = Session.objects.filter(key=canonical).values_list("pk", flat=True).first()
        return UsageScope(nothing=True) if session_pk is None else UsageScope(session_pk=session_pk)
    return UsageScope(agent_id=agent or keys.DEFAULT_AGENT_ID)
