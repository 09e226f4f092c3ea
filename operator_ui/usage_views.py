"""The console's Usage page: tokens and cost over a range of days, a chart per day, the sessions that used the most
tokens and the cost per model, from the same report ``usage.cost`` and ``sessions.usage`` answer with.

The range comes from GET parameters (``startDate``, ``endDate``: UTC days), validated by the RPC's own schema and
window rules; a refused range shows the refusal and no figures. The chart is SVG drawn here: no script, no
library, nothing fetched from elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET
from pydantic import ValidationError

from gateway.exceptions import GatewayError
from operations_app import selectors as usage_selectors
from operations_app.schemas import UsageWindowParams
from operations_app.selectors import DayUsage, UsageScope
from operations_app.usage_window import resolve_window

from .views import _refusal

TOP_SESSIONS = 10
PRESETS = (7, 30, 90)

# The chart's drawing box (SVG user units; the SVG scales to the page's width).
CHART_WIDTH, CHART_HEIGHT = 720, 220
PLOT_LEFT, PLOT_RIGHT, PLOT_TOP, PLOT_BOTTOM = 64, 8, 12, 28


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    label: str


@dataclass(frozen=True)
class Tick:
    position: float
    label: str


@dataclass(frozen=True)
class DailyChart:
    bars: list[Bar]
    y_ticks: list[Tick]
    x_ticks: list[Tick]
    width: int = CHART_WIDTH
    height: int = CHART_HEIGHT
    plot_left: int = PLOT_LEFT
    plot_bottom: int = CHART_HEIGHT - PLOT_BOTTOM
    plot_right: int = CHART_WIDTH - PLOT_RIGHT


def daily_chart(days: list[DayUsage]) -> DailyChart:
    """Tokens per day as bars, scaled to the busiest day; a day without tokens keeps its slot, with no bar."""
    plot_width = CHART_WIDTH - PLOT_LEFT - PLOT_RIGHT
    plot_height = CHART_HEIGHT - PLOT_TOP - PLOT_BOTTOM
    baseline = CHART_HEIGHT - PLOT_BOTTOM
    peak = max((day.cost.totalTokens for day in days), default=0)
    slot = plot_width / max(len(days), 1)
    bars = []
    for index, day in enumerate(days):
        tokens = day.cost.totalTokens
        if not tokens:
            continue
        height = max(plot_height * tokens / peak, 1.0)
        bars.append(
            Bar(
                x=round(PLOT_LEFT + index * slot + slot * 0.1, 2),
                y=round(baseline - height, 2),
                width=round(max(slot * 0.8, 0.5), 2),
                height=round(height, 2),
                label=f"{day.day.isoformat()}: {tokens:,} tokens, {format_usd(day.cost.totalCost)}",
            )
        )
    y_ticks = [Tick(position=baseline, label="0")]
    if peak:
        y_ticks.append(Tick(position=PLOT_TOP, label=f"{peak:,}"))
    x_ticks = []
    if days:
        x_ticks.append(Tick(position=PLOT_LEFT, label=days[0].day.isoformat()))
        if len(days) > 1:
            x_ticks.append(Tick(position=CHART_WIDTH - PLOT_RIGHT, label=days[-1].day.isoformat()))
    return DailyChart(bars=bars, y_ticks=y_ticks, x_ticks=x_ticks)


def format_usd(amount: float) -> str:
    return f"${amount:,.2f}" if amount >= 1 or amount == 0 else f"${amount:,.4f}"


@require_GET
@login_required(login_url="ui:login")
def usage(request: HttpRequest) -> HttpResponse:
    asked = {name: request.GET.get(name, "").strip()[:32] for name in ("startDate", "endDate")}
    presets = [resolve_window(UsageWindowParams(), days=days) for days in PRESETS]
    context = {"nav": "usage", "asked": asked, "presets": presets, "top_sessions": TOP_SESSIONS}
    try:
        window = resolve_window(UsageWindowParams.model_validate({k: v for k, v in asked.items() if v}))
    except (ValidationError, GatewayError) as refused:
        context["refusal"] = _refusal(refused)
        return render(request, "operator_ui/usage.html", context, status=400)
    report = usage_selectors.usage_report(window, UsageScope(), session_limit=TOP_SESSIONS, session_order="tokens")
    daily = report.daily()
    context.update(
        window=window,
        report=report,
        total_cost=format_usd(report.totals.totalCost),
        chart=daily_chart(daily),
        daily=[{"day": day, "cost": format_usd(day.cost.totalCost)} for day in daily],
        models=[{"usage": model, "cost": format_usd(model.cost.totalCost)} for model in report.models],
        sessions=[{"usage": usage, "cost": format_usd(usage.cost.totalCost)} for usage in report.sessions],
    )
    return render(request, "operator_ui/usage.html", context)
