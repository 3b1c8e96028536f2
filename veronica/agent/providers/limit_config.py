"""Provider limits, as configured: VERONICA_PROVIDER_LIMITS (inline TOML or JSON, or the path of a
.toml / .json file). One table per endpoint (a provider name or a base URL) and optionally per model:

    [openai]                              # every openai:* call (OPENAI_BASE_URL's endpoint)
    concurrency = 5                       # calls in flight at once, across every worker on every host
    rpm = 600                             # requests per minute
    tpm = 200000                          # tokens per minute (the request's estimate, corrected by the usage)
    ["http://vllm.internal:8000/v1"]      # an endpoint by its base URL (wins over the provider name)
    concurrency = 2
    ["anthropic:claude-sonnet-4-5"]       # one model: applies on top of its endpoint's limit
    rpm = 50

Pure parsing (no Django): settings.py calls parse() at start-up, so a bad value stops the process
with an error naming the table and the field.
"""
from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path

ENV = "VERONICA_PROVIDER_LIMITS"
FIELDS = {"concurrency": (1, 10_000), "rpm": (1, 10_000_000), "tpm": (1, 10_000_000_000), "lease_seconds": (5, 3600)}
PROVIDERS = ("openai", "anthropic")
MAX_KEY = 200


class LimitConfigError(ValueError):
    """A bad VERONICA_PROVIDER_LIMITS: the message names the table and the field."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Limit:
    key: str  # the table's name: "openai", "http://host/v1" or "openai:gpt-4o"
    concurrency: int = 0  # 0: no cap
    rpm: int = 0
    tpm: int = 0
    lease_seconds: int = 60  # a slot whose holder stopped renewing (a killed worker) frees itself after this

    @property
    def active(self) -> bool:
        return bool(self.concurrency or self.rpm or self.tpm)


def parse(raw: str) -> dict[str, Limit]:
    raw = (raw or "").strip()
    if not raw:
        return {}
    text, source = raw, ENV
    if "\n" not in raw and "=" not in raw and not raw.startswith(("{", "[")):  # a path, not inline TOML / JSON
        path = Path(raw).expanduser()
        try:
            text, source = path.read_text(), f"{ENV} ({path})"
        except OSError as exc:
            raise LimitConfigError(f"{ENV}={raw!r}: cannot read the file ({exc.strerror})", ENV) from None
    try:
        data = json.loads(text) if text.lstrip().startswith("{") else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise LimitConfigError(f"{source} is neither valid TOML nor JSON ({exc})", ENV) from None
    if not isinstance(data, dict):
        raise LimitConfigError(f"{source} must be a table of endpoint -> limits", ENV)
    return {limit.key: limit for limit in (_limit(source, key, value) for key, value in data.items())}


def _limit(source: str, key: str, table) -> Limit:
    name = f"{source}[{key!r}]"
    key = key.strip().rstrip("/")
    kind = key.split(":", 1)[0]
    if kind in PROVIDERS and ":" in key:
        key = model_key(key)
    if not key or len(key) > MAX_KEY or not (key in PROVIDERS or key.startswith(("http://", "https://"))
                                            or (kind in PROVIDERS and key.split(":", 1)[1].strip())):
        raise LimitConfigError(f"{name}: the table's name must be a provider ({', '.join(PROVIDERS)}), a base URL "
                               f"(http://..., https://...) or a model spec (openai:MODEL, anthropic:MODEL), at most "
                               f"{MAX_KEY} characters", f"{key}")
    if not isinstance(table, dict):
        raise LimitConfigError(f"{name} must be a table of {', '.join(FIELDS)}", key)
    values = {}
    for field, value in table.items():
        if field not in FIELDS:
            raise LimitConfigError(f"{name}.{field} is not a limit; known: {', '.join(FIELDS)}", f"{key}.{field}")
        low, high = FIELDS[field]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise LimitConfigError(f"{name}.{field}={value!r} must be an integer from {low} to {high}", f"{key}.{field}")
        values[field] = value
    return Limit(key=key, **values)


def model_key(spec: str) -> str:
    """A model spec as its limit is keyed: "anthropic: claude-x " calls the same model as
    "anthropic:claude-x" (the provider strips both sides), so it takes the same limit."""
    kind, _, model = spec.partition(":")
    return f"{kind.strip()}:{model.strip()}"


def limits_for(config: dict[str, Limit], spec: str, base_url: str) -> list[Limit]:
    """The limits one call takes, in a fixed order (endpoint, then model), so two calls never wait on
    each other's second limit while holding their first."""
    kind = spec.split(":", 1)[0].strip()
    endpoint = config.get(base_url.rstrip("/")) or config.get(kind)
    found = [limit for limit in (endpoint, config.get(model_key(spec))) if limit is not None and limit.active]
    return found
