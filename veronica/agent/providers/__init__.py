"""Providers behind one interface. A model spec is 'offline', 'openai:MODEL' or 'anthropic:MODEL'."""
from __future__ import annotations

from veronica.agent.providers.base import Provider, ProviderError, Reply, ToolCall, Usage
from veronica.plumbing.errors import VeronicaError, require_text

KINDS = ("offline", "openai", "anthropic")
MAX_SPEC = 120  # Member.model's column
MAX_FALLBACKS = 4

__all__ = ["KINDS", "Provider", "ProviderError", "Reply", "ToolCall", "Usage", "get_provider", "member_key", "provider_for", "validate_fallback", "validate_model_spec"]


def split_spec(spec: str) -> tuple[str, str]:
    kind, _, model = (spec or "").partition(":")
    return kind.strip(), model.strip()


def validate_model_spec(spec: str) -> str:
    spec = require_text(spec, "model", max_len=MAX_SPEC).strip()
    kind, model = split_spec(spec)
    if kind not in KINDS:
        raise VeronicaError(f"model '{spec}' must be 'offline', 'openai:MODEL' or 'anthropic:MODEL'", field="model")
    if kind != "offline" and not model:
        raise VeronicaError(f"model '{spec}' names no model after '{kind}:'", field="model")
    return spec


def validate_fallback(value, model: str = "") -> list[str]:
    """A member's fallback chain: a list of at most MAX_FALLBACKS model specs, none repeated, none
    the member's own model."""
    if value is None or value == "":
        return []
    if isinstance(value, str):  # a form's comma-separated text
        value = [part for part in (p.strip() for p in value.replace("\n", ",").split(",")) if part]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise VeronicaError("fallback must be a list of model specs, e.g. [\"openai:gpt-4o\"]", field="fallback")
    if len(value) > MAX_FALLBACKS:
        raise VeronicaError(f"fallback names {len(value)} models; the limit is {MAX_FALLBACKS}", field="fallback")
    specs = []
    for n, spec in enumerate(value):
        try:
            spec = validate_model_spec(spec)
        except VeronicaError as exc:
            raise VeronicaError(f"fallback[{n}]: {exc.message}", field="fallback") from None
        if spec in specs or spec == (model or "").strip():
            raise VeronicaError(f"fallback[{n}]: '{spec}' is already in the chain (the model or an earlier fallback)",
                                field="fallback")
        specs.append(spec)
    return specs


def get_provider(spec: str, api_key: str | None = None) -> Provider:
    """The provider for one model spec, behind the limits configured for its endpoint and model;
    api_key (a member's secret, veronica.swarm.secrets.provider_key) replaces the server's OPENAI_API_KEY /
    ANTHROPIC_API_KEY."""
    from veronica.agent.providers import limits

    kind, model = split_spec(validate_model_spec(spec))
    if kind == "offline":
        from veronica.agent.providers.offline import OfflineProvider

        return OfflineProvider()
    if kind == "openai":
        from veronica.agent.providers.openai_compat import OpenAIProvider

        return limits.wrap(OpenAIProvider.from_env(model, api_key), spec)
    from veronica.agent.providers.anthropic import AnthropicProvider

    return limits.wrap(AnthropicProvider.from_env(model, api_key), spec)


def provider_for(model: str, fallback: list[str] | None = None, make=None) -> Provider:
    """A member's provider: its model, then its fallback chain on overload and outage. make: how one
    spec becomes a provider (get_provider unless the caller has its own)."""
    make = make or get_provider
    if not fallback:
        return make(model)
    from veronica.agent.providers.fallback import FallbackProvider

    return FallbackProvider([model, *fallback], make)


def member_key(member, spec: str | None = None) -> str | None:
    """The member's API key for the vendor of `spec` (its own model by default), from its own or its
    space's secrets (OPENAI_API_KEY / ANTHROPIC_API_KEY, veronica.swarm.secrets), or None: the server's
    environment."""
    from veronica.swarm import secrets
    from veronica.plumbing import secret_store

    try:
        return secrets.provider_key(member, split_spec(spec or member.model)[0])
    except (secret_store.KeyMissing, secret_store.InvalidToken) as exc:
        raise ProviderError(f"the member's provider key is a secret that cannot be read: {exc or 'wrong key'}", permanent=True) from None

