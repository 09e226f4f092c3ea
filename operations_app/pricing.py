"""Per-model token prices (``OPENCLAW_MODEL_PRICES``) and the cost of recorded usage.

The setting is a JSON object of model → ``{"input", "output", "cacheRead"?, "cacheWrite"?}``, each a USD price
per million tokens. A key may name the model alone (``gpt-4o-mini``) or with its provider
(``openai/gpt-4o-mini``, which wins when both are given). A model without a price costs 0 and is reported as
unpriced: the usage figures say so instead of pretending the tokens were free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from openclaw_site.env import SettingsError

SETTING = "OPENCLAW_MODEL_PRICES"
PRICE_FIELDS = ("input", "output", "cacheRead", "cacheWrite")
REQUIRED_FIELDS = ("input", "output")
# Far above any real price (USD per million tokens); a larger number is a typo, not a price.
MAX_PRICE = 1_000_000
MAX_MODEL_NAME = 200
PER_TOKENS = 1_000_000


@dataclass(frozen=True)
class ModelPrice:
    input: float
    output: float
    cacheRead: float = 0.0
    cacheWrite: float = 0.0


@dataclass(slots=True)
class TokenCounts:
    """Tokens of some runs of one model (or a sum over models); ``runs`` counts the turns they came from."""

    input: int = 0
    output: int = 0
    cacheRead: int = 0
    cacheWrite: int = 0
    runs: int = 0

    @property
    def total(self) -> int:
        return self.input + self.output + self.cacheRead + self.cacheWrite


@dataclass(slots=True)
class CostTotals:
    """OpenClaw's ``CostUsageTotals``: tokens, their cost by kind, and how many runs had no price."""

    input: int = 0
    output: int = 0
    cacheRead: int = 0
    cacheWrite: int = 0
    inputCost: float = 0.0
    outputCost: float = 0.0
    cacheReadCost: float = 0.0
    cacheWriteCost: float = 0.0
    missingCostEntries: int = 0

    @property
    def totalTokens(self) -> int:
        return self.input + self.output + self.cacheRead + self.cacheWrite

    @property
    def totalCost(self) -> float:
        return self.inputCost + self.outputCost + self.cacheReadCost + self.cacheWriteCost

    def add(self, other: CostTotals) -> None:
        # Called for every grouped row and every bucket it lands in: plain attribute arithmetic, no loop.
        self.input += other.input
        self.output += other.output
        self.cacheRead += other.cacheRead
        self.cacheWrite += other.cacheWrite
        self.inputCost += other.inputCost
        self.outputCost += other.outputCost
        self.cacheReadCost += other.cacheReadCost
        self.cacheWriteCost += other.cacheWriteCost
        self.missingCostEntries += other.missingCostEntries

    def payload(self) -> dict[str, Any]:
        return {
            "input": self.input,
            "output": self.output,
            "cacheRead": self.cacheRead,
            "cacheWrite": self.cacheWrite,
            "totalTokens": self.totalTokens,
            "totalCost": usd(self.totalCost),
            "inputCost": usd(self.inputCost),
            "outputCost": usd(self.outputCost),
            "cacheReadCost": usd(self.cacheReadCost),
            "cacheWriteCost": usd(self.cacheWriteCost),
            "missingCostEntries": self.missingCostEntries,
        }


def usd(amount: float) -> float:
    # Sums of products of floats: round away the binary noise (1e-10 USD is far below any bill's precision).
    return round(amount, 10)


def parse_model_prices(raw: dict[str, Any]) -> dict[str, ModelPrice]:
    prices: dict[str, ModelPrice] = {}
    for model, entry in raw.items():
        where = f"{SETTING}: model {model!r}"
        if not model or len(model) > MAX_MODEL_NAME:
            raise SettingsError(f"{SETTING}: a model name is 1-{MAX_MODEL_NAME} characters")
        if not isinstance(entry, dict):
            raise SettingsError(f"{where} must be an object of USD prices per million tokens")
        unknown = set(entry) - set(PRICE_FIELDS)
        if unknown:
            raise SettingsError(f"{where}: unknown field {sorted(unknown)[0]!r} (allowed: {', '.join(PRICE_FIELDS)})")
        for field in REQUIRED_FIELDS:
            if field not in entry:
                raise SettingsError(f"{where}: field {field!r} is required")
        for field, value in entry.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise SettingsError(f"{where}: field {field!r} must be a number, not {value!r}")
            if not 0 <= value <= MAX_PRICE:
                raise SettingsError(f"{where}: field {field!r} must be between 0 and {MAX_PRICE}, not {value}")
        prices[model] = ModelPrice(**{field: float(value) for field, value in entry.items()})
    return prices


def model_prices() -> dict[str, ModelPrice]:
    """The configured prices; parsed on every use (a handful of entries) so that a changed setting applies."""
    return parse_model_prices(settings.OPENCLAW_MODEL_PRICES)


def price_for(prices: dict[str, ModelPrice], *, provider: str, model: str) -> ModelPrice | None:
    if provider and f"{provider}/{model}" in prices:
        return prices[f"{provider}/{model}"]
    return prices.get(model)


def cost_of(tokens: TokenCounts, price: ModelPrice | None) -> CostTotals:
    """The cost of one model's tokens; without a price, zero cost and every run counted as missing one."""
    totals = CostTotals(
        input=tokens.input, output=tokens.output, cacheRead=tokens.cacheRead, cacheWrite=tokens.cacheWrite
    )
    if price is None:
        totals.missingCostEntries = tokens.runs
        return totals
    totals.inputCost = tokens.input * price.input / PER_TOKENS
    totals.outputCost = tokens.output * price.output / PER_TOKENS
    totals.cacheReadCost = tokens.cacheRead * price.cacheRead / PER_TOKENS
    totals.cacheWriteCost = tokens.cacheWrite * price.cacheWrite / PER_TOKENS
    return totals
