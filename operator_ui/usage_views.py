"""The console's Usage page: tokens and cost over a range of days, a chart per day, the sessions that used the most
tokens and the cost per model, from the same report ``usage.cost`` and ``sessions.usage`` answer with.

The range comes from GET parameters (``startDate``, ``endDate``: UTC days), validated by the RPC's own schema and
window rules; a refused range shows the refusal and no figures. The chart is SVG drawn here: no script, no
library, nothing fetched from elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET
from pydantic import ValidationError

from gateway.exceptions import GatewayError
from operations_app import selectors as usage_selectors
from operations_app.schemas import UsageWindowParams
from operations_app.selectors import DayUsage, UsageScope
from operations_app.usage_window import resolve_window

from .access import operator_required
from .views import _refusal

TOP_SESSIONS = 10
PRESETS = (7, 30, 90)

# The chart's drawing box, in SVG user units: one slot of SLOT units per day, bars up to CHART_HEIGHT. The SVG is
# stretched to the page's width (its text is HTML around it, so nothing is drawn at an unreadable size).
SLOT, BAR, CHART_HEIGHT = 10, 7, 100


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    height: float
    label: str


@dataclass(frozen=True)
class DailyChart:
    bars: list[Bar]
    width: int
    peak: int
    first_day: str
    last_day: str
    bar_width: int = BAR
    height: int = CHART_HEIGHT


def daily_chart(days: list[DayUsage]) -> DailyChart:
    """Tokens per day as bars scaled to the busiest day; a day without tokens keeps its slot, with no bar."""
    peak = max((day.cost.totalTokens for day in days), default=0)
    bars = []
    for index, day in enumerate(days):
        tokens = day.cost.totalTokens
        if not tokens:
            continue
        height = max(CHART_HEIGHT * tokens / peak, 0.5)
        bars.append(
            Bar(
                x=index * SLOT + (SLOT - BAR) / 2,
                y=round(CHART_HEIGHT - height, 3),
                height=round(height, 3),
                label=f"{day.day.isoformat()}: {tokens:,} tokens, {format_usd(day.cost.totalCost)}",
            )
        )
    return DailyChart(
        bars=bars,
        width=SLOT * max(len(days), 1),
        peak=peak,
        first_day=days[0].day.isoformat() if days else "",
        last_day=days[-1].day.isoformat() if days else "",
    )


def format_usd(amount: float) -> str:
    return f"${amount:,.2f}" if amount >= 1 or amount == 0 else f"${amount:,.4f}"


@require_GET
@operator_required("usage.cost")
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
