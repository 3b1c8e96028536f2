"""A cheap authenticated request per endpoint (list models), for `doctor`: it catches a wrong key,
a dead base URL and a doubled `/v1` before a member's run does."""
from __future__ import annotations

from dataclasses import dataclass, field

from veronica.agent.providers import split_spec

PROBE_TIMEOUT = 10.0


@dataclass(frozen=True)
class Endpoint:
    kind: str  # "openai" | "anthropic"
    base_url: str
    api_key: str = field(repr=False)

    @property
    def env(self) -> tuple[str, str]:
        return ("OPENAI_BASE_URL", "OPENAI_API_KEY") if self.kind == "openai" else ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY")


@dataclass
class Probe:
    ok: bool
    text: str
    models: list[str] = field(default_factory=list)


def endpoint_for(spec: str) -> Endpoint | None:
    kind, _ = split_spec(spec)
    if kind == "openai":
        from veronica.agent.providers.openai_compat import endpoint_from_env
    elif kind == "anthropic":
        from veronica.agent.providers.anthropic import endpoint_from_env
    else:
        return None
    base, key = endpoint_from_env()
    return Endpoint(kind, base, key)


def probe(endpoint: Endpoint, timeout: float = PROBE_TIMEOUT) -> Probe:
    url_var, key_var = endpoint.env
    where = f"{endpoint.kind} endpoint {endpoint.base_url}"
    try:
        if endpoint.kind == "openai":
            from veronica.agent.providers.openai_compat import make_client
        else:
            from veronica.agent.providers.anthropic import make_client
        page = make_client(endpoint.base_url, endpoint.api_key, timeout).models.list()
        models = [m.id for m in page.data]
    except Exception as exc:  # noqa: BLE001 - every failure becomes one line of advice
        return Probe(False, f"{where}: {advice(exc, endpoint, url_var, key_var, timeout)}")
    return Probe(True, f"{where}: reachable, key accepted ({len(models)} model(s) listed)", models)


def advice(exc: Exception, endpoint: Endpoint, url_var: str, key_var: str, timeout: float) -> str:
    status = getattr(exc, "status_code", None)
    request = getattr(exc, "request", None)
    url = str(getattr(request, "url", "") or "")
    if status in (401, 403):
        return f"the key was refused (HTTP {status}): check {key_var}"
    if status == 404:
        if "/v1/v1" in url:
            fix = "drop the trailing /v1" if endpoint.kind == "anthropic" else "keep exactly one /v1"
            return f"HTTP 404 for {url}: the base URL has a doubled /v1 ({fix} in {url_var})"
        if endpoint.kind == "openai" and not endpoint.base_url.rstrip("/").endswith("/v1"):
            return f"HTTP 404 for {url}: OpenAI-compatible servers serve under /v1 (set {url_var}=…/v1)"
        return f"HTTP 404 for {url}: no models API there; check {url_var}"
    if status is not None:
        return f"HTTP {status} from {url or endpoint.base_url}: {str(getattr(exc, 'message', exc))[:200]}"
    name = type(exc).__name__
    cause = exc.__cause__ or exc.__context__
    if "Timeout" in name:
        return f"no answer within {timeout:.0f} s: check {url_var} (is the server up?)"
    if "Connection" in name:
        return f"cannot connect ({cause or exc}): check {url_var} (is the server up?)"
    return f"probe failed: {name}: {str(exc)[:200]}"
