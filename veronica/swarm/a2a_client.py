"""Calling a remote A2A agent (JSON-RPC over HTTP): requests and answers are a2a-sdk's models, sent
through the guarded outbound client (the A2A purpose: internal addresses refused in hosted mode,
checked at connect time too). Synchronous on purpose: a tool call runs in the member's run thread.

Agent cards differ between protocol versions: 0.3 cards name the JSON-RPC endpoint in `url`, 1.0
cards in `supportedInterfaces`; both are read."""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

import httpx
from pydantic import ValidationError

from veronica.ops import outbound
from veronica.plumbing.errors import VeronicaError


class _A2ATypes:
    """a2a-sdk's models, imported on first use rather than with this module: they are ~0.5 CPU-s of
    pydantic classes that every worker paid at start-up, though most members never call an agent."""

    def __getattr__(self, name: str):
        from a2a import types

        return getattr(types, name)


t = _A2ATypes()
# TaskState values (a str enum: its members compare equal to these)
TERMINAL = {"completed", "failed", "canceled", "rejected"}
WAITS_ON_US = {"input-required", "auth-required"}
POLL_EVERY = 0.5
MAX_ANSWER_BYTES = 1024 * 1024


class RemoteError(VeronicaError):
    """The remote agent could not be reached, refused, or answered something that is not A2A."""

    status = 502


@dataclass
class Card:
    name: str
    description: str
    endpoint: str


def _headers(token: str) -> dict:
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def _get_json(response: httpx.Response, what: str) -> object:
    if response.status_code in (401, 403):
        raise RemoteError(f"{what}: the remote agent refused our credential (HTTP {response.status_code})", field="token")
    if len(response.content) > MAX_ANSWER_BYTES:
        raise RemoteError(f"{what}: the answer is larger than {MAX_ANSWER_BYTES} bytes")
    try:
        return response.json()
    except ValueError:
        raise RemoteError(f"{what}: the answer (HTTP {response.status_code}) is not JSON") from None


def card_endpoint(data: object) -> Card:
    if not isinstance(data, dict):
        raise RemoteError("the agent card is not a JSON object", field="card_url")
    try:
        card = t.AgentCard.model_validate(data)
        return Card(card.name, card.description, card.url)
    except ValidationError:
        pass
    interfaces = data.get("supportedInterfaces") or data.get("supported_interfaces") or []
    for item in interfaces if isinstance(interfaces, list) else []:
        binding = str(item.get("protocolBinding") or item.get("protocol_binding") or "") if isinstance(item, dict) else ""
        if binding.upper() == "JSONRPC" and isinstance(item.get("url"), str):
            return Card(str(data.get("name") or ""), str(data.get("description") or ""), item["url"])
    raise RemoteError("the agent card names no JSON-RPC endpoint (neither url nor a JSONRPC supportedInterface)",
                      field="card_url")


def fetch_card(card_url: str, *, token: str = "", timeout: float = 30) -> Card:
    try:
        with outbound.client(timeout, outbound.A2A) as http:
            response = http.get(card_url, headers=_headers(token))
    except outbound.Refused:
        raise
    except httpx.HTTPError as exc:
        raise RemoteError(f"could not fetch the agent card: {exc}", field="card_url") from None
    if response.status_code != 200:
        raise RemoteError(f"the agent card answered HTTP {response.status_code}", field="card_url")
    card = card_endpoint(_get_json(response, "agent card"))
    outbound.check_url(card.endpoint, "card_url", outbound.A2A)  # the card may point elsewhere: the same guard
    return card


def _rpc(endpoint: str, token: str, request, answer_model, timeout: float):
    body = request.model_dump(mode="json", by_alias=True, exclude_none=True)
    try:
        with outbound.client(timeout, outbound.A2A) as http:
            response = http.post(endpoint, content=json.dumps(body), headers=_headers(token))
    except outbound.Refused:
        raise
    except httpx.HTTPError as exc:
        raise RemoteError(f"{request.method}: {exc.__class__.__name__}: {exc}") from None
    data = _get_json(response, request.method)
    data = _unwrapped(data)
    try:
        answer = answer_model.model_validate(data).root
    except ValidationError as exc:
        raise RemoteError(f"{request.method}: the answer is not an A2A response ({exc.error_count()} problems)") from None
    if isinstance(answer, t.JSONRPCErrorResponse):
        error = answer.error
        raise RemoteError(f"{request.method}: the remote agent answered error {error.code}: {error.message}")
    return answer.result


def _unwrapped(data: object) -> object:
    """A 1.0-style SendMessage answer wraps its result as {"task": …} or {"message": …} (fasta2a
    does, with 0.3 method names): read it as the bare Task or Message 0.3 sends."""
    result = data.get("result") if isinstance(data, dict) else None
    if isinstance(result, dict) and "kind" not in result and len(result) == 1 and set(result) <= {"task", "message"}:
        inner = dict(next(iter(result.values())))
        inner.setdefault("kind", next(iter(result)))
        return {**data, "result": inner}
    return data


def send_message(endpoint: str, token: str, text: str, *, timeout: float = 30) -> t.Task | t.Message:
    message = t.Message(role=t.Role.user, message_id=uuid.uuid4().hex, parts=[t.Part(root=t.TextPart(text=text))])
    request = t.SendMessageRequest(id=uuid.uuid4().hex, params=t.MessageSendParams(message=message))
    return _rpc(endpoint, token, request, t.SendMessageResponse, timeout)


def get_task(endpoint: str, token: str, task_id: str, *, timeout: float = 30) -> t.Task:
    request = t.GetTaskRequest(id=uuid.uuid4().hex, params=t.TaskQueryParams(id=task_id))
    return _rpc(endpoint, token, request, t.GetTaskResponse, timeout)


def cancel_task(endpoint: str, token: str, task_id: str, *, timeout: float = 30) -> t.Task:
    request = t.CancelTaskRequest(id=uuid.uuid4().hex, params=t.TaskIdParams(id=task_id))
    return _rpc(endpoint, token, request, t.CancelTaskResponse, timeout)


def parts_text(parts: list[t.Part] | None) -> str:
    out = []
    for part in parts or []:
        root = part.root
        if isinstance(root, t.TextPart):
            out.append(root.text)
        elif isinstance(root, t.DataPart):
            out.append(json.dumps(root.data, ensure_ascii=False, default=str))
        else:
            out.append("[file part omitted]")
    return "\n".join(out)


def answer_text(task: t.Task) -> str:
    """What the model reads: the artifacts' text, else the status message's."""
    texts = [parts_text(a.parts) for a in task.artifacts or []]
    if not any(texts) and task.status.message is not None:
        texts = [parts_text(task.status.message.parts)]
    return "\n\n".join(x for x in texts if x) or "(no output)"


@dataclass
class Outcome:
    task_id: str
    state: str
    text: str
    parked: bool = False  # still going after the inline wait: the caller parks and polls later


def ended(task: t.Task) -> bool:
    state = task.status.state
    return getattr(state, "value", state) in TERMINAL | WAITS_ON_US


def cancel_quietly(endpoint: str, token: str, task_id: str) -> None:
    try:
        cancel_task(endpoint, token, task_id, timeout=10)
    except VeronicaError:
        pass


def call(endpoint: str, token: str, text: str, *, timeout: float, inline: float | None = None, clock=time.monotonic,
         sleep=time.sleep) -> Outcome:
    """Send, then wait (polling tasks/get) until the remote task ends or asks for input. With
    `inline` shorter than the timeout, a task still going after `inline` seconds comes back parked;
    past the timeout the remote task is cancelled (best effort) and RemoteError says so."""
    started = clock()
    result = send_message(endpoint, token, text, timeout=min(timeout, 30))
    if isinstance(result, t.Message):
        return Outcome("", "completed", parts_text(result.parts) or "(no output)")
    task = result
    while not ended(task):
        waited = clock() - started
        if inline is not None and inline < timeout and waited >= inline:
            return Outcome(task.id, task.status.state.value, "", parked=True)
        if waited >= timeout:
            cancel_quietly(endpoint, token, task.id)
            raise RemoteError(f"the remote task {task.id} did not finish within {timeout} s (cancelled)")
        sleep(POLL_EVERY)
        task = get_task(endpoint, token, task.id, timeout=min(timeout, 30))
    return Outcome(task.id, task.status.state.value, answer_text(task))
