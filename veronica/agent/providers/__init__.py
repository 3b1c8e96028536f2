"""Providers behind one interface. A model spec is 'offline', 'openai:MODEL' or 'anthropic:MODEL'."""
from __future__ import annotations

from veronica.agent.providers.base import Provider, ProviderError, Reply, ToolCall, Usage
from veronica.errors import VeronicaError, require_text

KINDS = ("offline", "openai", "anthropic")
MAX_SPEC = 120  # Member.model's column

__all__ = ["KINDS", "Provider", "ProviderError", "Reply", "ToolCall", "Usage", "member_key", "get_provider", "validate_model_spec"]


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


def get_provider(spec: str, api_key: str | None = None) -> Provider:
    """The provider for a model spec; api_key (a member's secret, veronica.secrets.provider_key)
    replaces the server's OPENAI_API_KEY / ANTHROPIC_API_KEY."""
    kind, model = split_spec(validate_model_spec(spec))
    if kind == "offline":
        from veronica.agent.providers.offline import OfflineProvider

        return OfflineProvider()
    if kind == "openai":
        from veronica.agent.providers.openai_compat import OpenAIProvider

        return OpenAIProvider.from_env(model, api_key)
    from veronica.agent.providers.anthropic import AnthropicProvider

    return AnthropicProvider.from_env(model, api_key)


def member_key(member) -> str | None:
    """The member's API key from its own or its space's secrets (OPENAI_API_KEY / ANTHROPIC_API_KEY,
    veronica.secrets), or None: the server's environment."""
    from veronica import secret_store, secrets

    try:
        return secrets.provider_key(member, split_spec(member.model)[0])
    except (secret_store.KeyMissing, secret_store.InvalidToken) as exc:
        raise ProviderError(f"the member's provider key is a secret that cannot be read: {exc or 'wrong key'}", permanent=True) from None
