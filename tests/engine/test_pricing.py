"""Prices come from the genai-prices table (with a local override); cache reads and writes are
priced at their own rates."""
from __future__ import annotations

from decimal import Decimal

import pytest

from veronica.agent.providers.base import Usage
from veronica.agent.providers.pricing import known, usd_for

M = 1_000_000


@pytest.mark.parametrize("spec,per_million_in,per_million_out", [
    ("openai:gpt-4.1-mini", "0.4", "1.6"),  # once charged the gpt-4.1 rate (2 / 8)
    ("openai:gpt-4.1-nano", "0.1", "0.4"),
    ("openai:gpt-4.1", "2", "8"),
    ("anthropic:claude-haiku-4-5", "1", "5"),  # once $0
    ("openai:o3", "2", "8"),
    ("openai:gpt-5", "1.25", "10"),
])
def test_the_price_table_knows_current_models(spec, per_million_in, per_million_out):
    assert usd_for(spec, Usage(input=M)) == Decimal(per_million_in)
    assert usd_for(spec, Usage(output=M)) == Decimal(per_million_out)
    assert known(spec).startswith("genai-prices")


def test_cache_reads_and_writes_have_their_own_rates():
    # claude-haiku-4-5: input 1.00, cache read 0.10, cache write (5 min) 1.25 USD per million
    assert usd_for("anthropic:claude-haiku-4-5", Usage(cache_read=M)) == Decimal("0.1")
    assert usd_for("anthropic:claude-haiku-4-5", Usage(cache_write=M)) == Decimal("1.25")
    # gpt-4.1-mini: cached input 0.10 against 0.40 uncached
    assert usd_for("openai:gpt-4.1-mini", Usage(input=M, cache_read=M)) == Decimal("0.5")


def test_an_unknown_model_costs_nothing_and_is_flagged():
    assert usd_for("openai:llama3.1:8b", Usage(input=M, output=M)) == 0
    assert known("openai:llama3.1:8b") == ""


def test_a_local_override_wins_longest_prefix_first(settings):
    settings.MODEL_PRICES = {"openai:llama": {"input": 1, "output": 2},
                             "openai:llama3.1": {"input": 0.5, "output": 1, "cache_read": 0.05, "cache_write": 0.6}}
    assert usd_for("openai:llama3.1:8b", Usage(input=M, output=M, cache_read=M, cache_write=M)) == Decimal("2.15")
    assert usd_for("openai:llama2", Usage(input=M)) == Decimal(1)
    assert usd_for("openai:llama2", Usage(cache_read=M)) == Decimal(1)  # no cache rate given: the input rate
    assert known("openai:llama3.1:8b") == "VERONICA_MODEL_PRICES[openai:llama3.1]"
