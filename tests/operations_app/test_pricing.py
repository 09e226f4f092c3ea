"""OPENCLAW_MODEL_PRICES: checked at start with one line naming the model and the field; the cost arithmetic."""

from __future__ import annotations

import pytest

from openclaw_site.env import SettingsError
from operations_app.pricing import ModelPrice, TokenCounts, cost_of, parse_model_prices, price_for
from tests.support.processes import manage_check


def test_prices_are_read_per_million_tokens():
    prices = parse_model_prices({"m": {"input": 3, "output": 15.5, "cacheRead": 0.3}})
    cost = cost_of(TokenCounts(input=2_000_000, output=1_000, cacheRead=10_000, runs=4), prices["m"])

    assert prices["m"] == ModelPrice(input=3.0, output=15.5, cacheRead=0.3, cacheWrite=0.0)
    assert (cost.inputCost, cost.outputCost, cost.cacheReadCost) == (6.0, 0.0155, pytest.approx(0.003))
    assert cost.totalCost == pytest.approx(6.0185)
    assert cost.missingCostEntries == 0


def test_an_unknown_model_costs_nothing_and_counts_its_runs_as_unpriced():
    cost = cost_of(TokenCounts(input=500, output=500, runs=3), price_for({}, provider="openai", model="x"))

    assert (cost.totalTokens, cost.totalCost, cost.missingCostEntries) == (1000, 0.0, 3)


def test_the_provider_qualified_name_is_looked_up_first():
    prices = parse_model_prices({"x": {"input": 1, "output": 1}, "p/x": {"input": 2, "output": 2}})

    assert price_for(prices, provider="p", model="x").input == 2.0
    assert price_for(prices, provider="q", model="x").input == 1.0
    assert price_for(prices, provider="", model="y") is None


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"m": 3}, "OPENCLAW_MODEL_PRICES: model 'm' must be an object of USD prices per million tokens"),
        ({"m": {"input": 1}}, "OPENCLAW_MODEL_PRICES: model 'm': field 'output' is required"),
        (
            {"m": {"input": 1, "output": 1, "cache": 1}},
            "OPENCLAW_MODEL_PRICES: model 'm': unknown field 'cache' (allowed: input, output, cacheRead, cacheWrite)",
        ),
        (
            {"m": {"input": "1", "output": 1}},
            "OPENCLAW_MODEL_PRICES: model 'm': field 'input' must be a number, not '1'",
        ),
        (
            {"m": {"input": True, "output": 1}},
            "OPENCLAW_MODEL_PRICES: model 'm': field 'input' must be a number, not True",
        ),
        (
            {"m": {"input": -1, "output": 1}},
            "OPENCLAW_MODEL_PRICES: model 'm': field 'input' must be between 0 and 1000000, not -1",
        ),
        ({"": {"input": 1, "output": 1}}, "OPENCLAW_MODEL_PRICES: a model name is 1-200 characters"),
    ],
)
def test_a_price_that_cannot_be_used_is_refused_at_start(raw, message):
    with pytest.raises(SettingsError) as refused:
        parse_model_prices(raw)
    assert str(refused.value) == message


def test_a_bad_setting_stops_the_start_with_one_line_naming_it(tmp_path):
    result = manage_check(tmp_path, OPENCLAW_MODEL_PRICES='{"gpt-x": {"input": 1}}')

    assert result.returncode == 2
    assert result.stderr.strip() == "error: OPENCLAW_MODEL_PRICES: model 'gpt-x': field 'output' is required"


def test_good_prices_pass_the_check(tmp_path):
    result = manage_check(tmp_path, OPENCLAW_MODEL_PRICES='{"gpt-x": {"input": 0.15, "output": 0.6}}')
    assert result.returncode == 0, result.stderr
