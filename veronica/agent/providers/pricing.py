"""USD per million tokens where a price is known; unknown models are metered in tokens only."""
from __future__ import annotations

from decimal import Decimal

# (input, output, cache_read) USD per 1M tokens. Extend as needed; prefixes match model names.
PRICES: dict[str, tuple[str, str, str]] = {
    "openai:gpt-4o-mini": ("0.15", "0.60", "0.075"),
    "openai:gpt-4o": ("2.50", "10.00", "1.25"),
    "openai:gpt-4.1": ("2.00", "8.00", "0.50"),
    "anthropic:claude-3-5-haiku": ("0.80", "4.00", "0.08"),
    "anthropic:claude-sonnet-4": ("3.00", "15.00", "0.30"),
    "anthropic:claude-opus-4": ("15.00", "75.00", "1.50"),
}
MILLION = Decimal(1_000_000)


def usd_for(model: str, usage) -> Decimal:
    match = next((PRICES[k] for k in sorted(PRICES, key=len, reverse=True) if model.startswith(k)), None)
    if match is None:
        return Decimal(0)
    price_in, price_out, price_cache = (Decimal(p) for p in match)
    return (usage.input * price_in + usage.output * price_out + usage.cache_read * price_cache) / MILLION
