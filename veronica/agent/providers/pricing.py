"""USD for a model call: a local override first (VERONICA_MODEL_PRICES, USD per million tokens,
longest spec prefix wins), then the maintained `genai-prices` table (the snapshot shipped with the
pinned package; no network). Cache reads and cache writes are priced at their own rates.

`Usage.input` is the uncached input; genai-prices counts cached tokens inside `input_tokens`, so the
three are added up for it. A model with no known price costs $0 and `doctor` warns about it.
"""
from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache

MILLION = Decimal(1_000_000)
VENDORS = {"openai": "openai", "anthropic": "anthropic"}


@dataclass(frozen=True)
class Rates:
    """USD per million tokens."""
    input: Decimal
    output: Decimal
    cache_read: Decimal
    cache_write: Decimal
    source: str


def _overrides() -> dict:
    from django.conf import settings

    return getattr(settings, "MODEL_PRICES", {}) or {}


def override_for(spec: str) -> Rates | None:
    table = _overrides()
    key = next((k for k in sorted(table, key=len, reverse=True) if spec.startswith(k)), None)
    if key is None:
        return None
    p = table[key]
    price_in = Decimal(str(p["input"]))
    return Rates(price_in, Decimal(str(p["output"])), Decimal(str(p.get("cache_read", p["input"]))),
                 Decimal(str(p.get("cache_write", p["input"]))), f"VERONICA_MODEL_PRICES[{key}]")


@lru_cache(maxsize=256)
def _table_name(spec: str) -> str:
    """'provider/model' as genai-prices knows it, or '' when the table has no price for the model."""
    import genai_prices

    vendor, _, model = spec.partition(":")
    if vendor not in VENDORS or not model:
        return ""
    try:
        found = genai_prices.calc_price(genai_prices.Usage(input_tokens=1), model, provider_id=VENDORS[vendor])
    except LookupError:
        return ""
    return f"{found.provider.id}/{found.model.id}"


def known(spec: str) -> str:
    """Where a price comes from ('' when unknown): for doctor's warning."""
    if spec.startswith("offline"):
        return "offline (free)"
    rates = override_for(spec)
    if rates is not None:
        return rates.source
    name = _table_name(spec)
    return f"genai-prices {genai_prices_version()} ({name})" if name else ""


def genai_prices_version() -> str:
    import genai_prices

    return genai_prices.__version__


def warm() -> None:
    """Read genai-prices' table now: its first lookup loads it (~16 ms), and a worker's first calls all
    waited on that (veronica.engine.warm)."""
    _table_name("openai:gpt-4o")


def usd_for(spec: str, usage) -> Decimal:
    rates = override_for(spec)
    if rates is not None:
        return (usage.input * rates.input + usage.output * rates.output + usage.cache_read * rates.cache_read
                + usage.cache_write * rates.cache_write) / MILLION
    if not _table_name(spec):
        return Decimal(0)
    import genai_prices

    vendor, _, model = spec.partition(":")
    tokens = genai_prices.Usage(input_tokens=usage.input + usage.cache_read + usage.cache_write, output_tokens=usage.output,
                                cache_read_tokens=usage.cache_read, cache_write_tokens=usage.cache_write)
    return Decimal(genai_prices.calc_price(tokens, model, provider_id=VENDORS[vendor]).total_price)
