"""Serving a space's members as A2A agents (JSON-RPC 2.0, protocol 0.3 method names), the requests
validated with a2a-sdk's models.

    message/send    mail from the caller (sender `a2a:<credential name>`) that starts a task on the
                    board assigned to the member; the answer is the A2A task (its id a UUID linked
                    to the board's task, scoped to the space)
    message/stream  the same, then the task's changes and the member's live text as SSE events
    tasks/get       the board task's status and result as A2A state and artifact
    tasks/cancel    cancels the board task (ledger.cancel)

A message naming a taskId continues that task: mail to the member about it, no new task.
Every refusal is a JSON-RPC error and writes nothing: the checks all run before the first write."""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from a2a import types as t
from django.conf import settings
from django.db import transaction
from pydantic import ValidationError

from veronica.swarm import a2a_client, bus, ledger
from veronica.plumbing.errors import VeronicaError, check_tree, text_problem
from veronica.models import A2ACredential, A2ATaskLink, Member, Skill, Space, Task, TaskStatus

S = TaskStatus
STATE = {S.PENDING: t.TaskState.submitted, S.READY: t.TaskState.submitted, S.RUNNING: t.TaskState.working,
         S.VERIFYING: t.TaskState.working, S.BLOCKED: t.TaskState.working, S.DONE: t.TaskState.completed,
         S.FAILED: t.TaskState.failed, S.CANCELLED: t.TaskState.canceled}
READ_METHODS = {"tasks/get"}
WRITE_METHODS = {"message/send", "message/stream", "tasks/cancel"}
FINAL = {t.TaskState.completed, t.TaskState.failed, t.TaskState.canceled}


class RpcError(Exception):
    """A JSON-RPC error answer (an a2a-sdk error model) with the HTTP status it goes out with."""

    def __init__(self, error, http_status: int = 200) -> None:
        super().__init__(error.message)
        self.error, self.http_status = error, http_status


def error_body(request_id, error) -> dict:
    body = t.JSONRPCErrorResponse(id=request_id, error=error).model_dump(mode="json", by_alias=True, exclude_none=True)
    body["id"] = request_id  # JSON-RPC: an error answers with "id": null when the id is unknown
    return body


def result_body(request_id, result, *, wrap: str = "") -> dict:
    """With `wrap` ("task"), the result also carries itself under that key: the 1.0 shape of a
    SendMessage answer, which 1.0 readers (fasta2a's client) look for; 0.3 readers ignore it."""
    payload = result.model_dump(mode="json", by_alias=True, exclude_none=True) if hasattr(result, "model_dump") else result
    if wrap:
        payload[wrap] = {k: v for k, v in payload.items() if k != "kind"}
    return {"jsonrpc": "2.0", "id": request_id, "result": payload}


def sender_name(cred: A2ACredential) -> str:
    return f"{bus.A2A}:{cred.name}"


# --- the card --------------------------------------------------------------------------------------

def card(space: Space, member: Member, endpoint: str) -> dict:
    """The Agent Card: the member's persona summary and its skills; bearer auth declared."""
    # when_to_use is the member's own summary for routing; the persona (its system prompt) is not
    # published beyond its first line
    first_line = next((line.strip() for line in member.persona.splitlines() if line.strip()), "")[:200]
    summary = (member.when_to_use or first_line or f"{member.role} of {space.name}").strip()
    skills = [t.AgentSkill(id=s.name, name=s.name, description=s.description or s.name, tags=["veronica"])
              for s in Skill.objects.filter(space=space, member=member).order_by("name")[:50]]
    if not skills:
        skills = [t.AgentSkill(id="task", name="task", description=f"Take a task for {member.name} ({member.role})",
                               tags=["veronica", member.role])]
    agent = t.AgentCard(
        name=f"{space.name} / {member.name}", description=summary[:1000], url=endpoint, version="1.0.0",
        capabilities=t.AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=["text/plain", "application/json"], default_output_modes=["text/plain"], skills=skills,
        preferred_transport="JSONRPC",
        security_schemes={"bearer": t.SecurityScheme(root=t.HTTPAuthSecurityScheme(scheme="bearer"))},
        security=[{"bearer": []}])
    body = agent.model_dump(mode="json", by_alias=True, exclude_none=True)
    # 1.0 readers (fasta2a's client among them) look for the endpoint here
    body["supportedInterfaces"] = [{"protocolBinding": "JSONRPC", "url": endpoint, "protocolVersion": "0.3.0"}]
    return body


# --- parsing a request -----------------------------------------------------------------------------

@dataclass
class Parsed:
    id: object
    method: str
    request: object  # the a2a-sdk request model


def parse(raw: bytes) -> Parsed:
    if len(raw) > settings.A2A_MAX_BYTES:
        raise RpcError(t.InvalidRequestError(message=f"the request is {len(raw)} bytes; the limit is {settings.A2A_MAX_BYTES}"), 413)
    try:
        data = json.loads(raw)
    except RecursionError:
        raise RpcError(t.JSONParseError(message="the body nests too deeply")) from None
    except (ValueError, UnicodeDecodeError):
        raise RpcError(t.JSONParseError()) from None
    if not isinstance(data, dict):
        raise RpcError(t.InvalidRequestError(message="the body must be one JSON-RPC request object (batches are not served)"))
    request_id = data.get("id") if isinstance(data.get("id"), (str, int)) and not isinstance(data.get("id"), bool) else None
    method = data.get("method")
    if data.get("jsonrpc") != "2.0" or not isinstance(method, str):
        raise Rpc(request_id, t.InvalidRequestError(message="jsonrpc must be \"2.0\" and method a string"))
    if method not in READ_METHODS | WRITE_METHODS:
        raise Rpc(request_id, t.MethodNotFoundError(message=f"method {method[:60]!r} is not served; "
                                                            f"one of {', '.join(sorted(READ_METHODS | WRITE_METHODS))}"))
    try:
        check_tree(data, what="params")
    except VeronicaError as exc:
        raise Rpc(request_id, t.InvalidParamsError(message=str(exc))) from None
    try:
        # JSON-RPC allows "id": null (fasta2a's tasks/get sends it); a2a-sdk's models want a value
        request = t.A2ARequest.model_validate({**data, "id": 0} if data.get("id") is None else data).root
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"][1:]) or "params"
        raise Rpc(request_id, t.InvalidParamsError(message=f"{where}: {first['msg']}")) from None
    return Parsed(request_id, method, request)


class Rpc(RpcError):
    """A JSON-RPC error for a request whose id is known."""

    def __init__(self, request_id, error, http_status: int = 200) -> None:
        super().__init__(error, http_status)
        self.request_id = request_id


def message_text(message: t.Message) -> str:
    """Text and data parts as the mail's body; files are not taken (no place to keep them yet)."""
    if any(isinstance(part.root, t.FilePart) for part in message.parts):
        raise VeronicaError("file parts are not accepted; send text or data parts", field="params.message.parts")
    text = a2a_client.parts_text(message.parts).strip()
    if not text:
        raise VeronicaError("the message has no text", field="params.message.parts")
    if len(text) > bus.MAX_BODY:
        raise VeronicaError(f"the message's parts are {len(text)} characters; the limit is {bus.MAX_BODY}",
                            field="params.message.parts")
    if text_problem(text):
        raise VeronicaError(f"the message {text_problem(text)}", field="params.message.parts")
    return text


# --- the methods -----------------------------------------------------------------------------------

def link_of(space: Space, a2a_id: str) -> A2ATaskLink:
    """Another space's task id is as unknown as one that never existed."""
    link = A2ATaskLink.objects.filter(space=space, a2a_id=a2a_id[:64]).select_related("task").first()
    if link is None:
        raise RpcError(t.TaskNotFoundError())
    return link


def as_task(link: A2ATaskLink) -> t.Task:
    task = link.task
    state = STATE[task.status]
    status_message = None
    if state in (t.TaskState.failed, t.TaskState.canceled) and (task.result or task.status_reason):
        status_message = agent_message(link, task.result or task.status_reason)
    artifacts = None
    if state == t.TaskState.completed or (state == t.TaskState.failed and task.result):
        artifacts = [t.Artifact(artifact_id=f"result-{task.pk}", name="result",
                                parts=[t.Part(root=t.TextPart(text=task.result or "(no result)"))])]
    return t.Task(id=link.a2a_id, context_id=link.context_id,
                  status=t.TaskStatus(state=state, message=status_message, timestamp=task.updated_at.isoformat()),
                  artifacts=artifacts, metadata={"veronica_task": task.pk, "member": link.member.name if link.member else None})


def agent_message(link: A2ATaskLink, text: str) -> t.Message:
    return t.Message(role=t.Role.agent, message_id=uuid.uuid4().hex, task_id=link.a2a_id, context_id=link.context_id,
                     parts=[t.Part(root=t.TextPart(text=text[:20000]))])


def start(space: Space, member: Member, cred: A2ACredential, params: t.MessageSendParams) -> A2ATaskLink:
    """message/send and message/stream: mail from the caller that starts (or continues) a task."""
    text = message_text(params.message)
    sender = sender_name(cred)
    if params.message.task_id:
        link = link_of(space, params.message.task_id)
        if link.task.status in (S.DONE, S.FAILED, S.CANCELLED):
            raise RpcError(t.InvalidParamsError(message=f"task {link.a2a_id} is {STATE[link.task.status].value}; "
                                                        "start a new task (leave taskId out)"))
        bus.send(space, sender, link.member.name if link.member else member.name, text,
                 subject=f"More on task #{link.task_id}", task=link.task)
        return link
    title = text.splitlines()[0][:ledger.MAX_TITLE] or "A2A request"
    with transaction.atomic():
        task = ledger.create_task(space, sender, title, spec=text, assignee=member)
        link = A2ATaskLink.objects.create(space=space, a2a_id=str(uuid.uuid4()), task=task, member=member, credential=cred,
                                          context_id=params.message.context_id or str(uuid.uuid4()), caller=sender)
    link.task = task
    return link


def cancel(space: Space, cred: A2ACredential, params: t.TaskIdParams) -> t.Task:
    link = link_of(space, params.id)
    task = Task.objects.select_related("assignee", "space").get(pk=link.task_id)
    if task.status in (S.DONE, S.FAILED, S.CANCELLED):
        raise RpcError(t.TaskNotCancelableError(message=f"task {link.a2a_id} is already {STATE[task.status].value}"))
    ledger.cancel(task, actor=sender_name(cred), reason="cancelled by the A2A caller")
    link.task = task
    return as_task(link)


def get(space: Space, params: t.TaskQueryParams) -> t.Task:
    link = link_of(space, params.id)
    return as_task(link)


# --- streaming -------------------------------------------------------------------------------------

def _sse(request_id, result) -> bytes:
    return f"data: {json.dumps(result_body(request_id, result))}\n\n".encode()


def _status_event(link: A2ATaskLink, state, *, text: str = "", final: bool = False) -> dict:
    event = t.TaskStatusUpdateEvent(task_id=link.a2a_id, context_id=link.context_id, final=final,
                                    status=t.TaskStatus(state=state, message=agent_message(link, text) if text else None))
    body = event.model_dump(mode="json", by_alias=True, exclude_none=True)
    body["statusUpdate"] = {k: v for k, v in body.items() if k not in ("kind", "final")}  # the 1.0 wrapping, for 1.0 readers
    return body


def _artifact_event(link: A2ATaskLink, artifact: t.Artifact) -> dict:
    event = t.TaskArtifactUpdateEvent(task_id=link.a2a_id, context_id=link.context_id, artifact=artifact, last_chunk=True)
    body = event.model_dump(mode="json", by_alias=True, exclude_none=True)
    body["artifactUpdate"] = {k: v for k, v in body.items() if k != "kind"}
    return body


class TaskStream:
    """message/stream's answer: the task first (taken when the request is answered), then what the
    event log says about it: its status moves, the member's live text (agent.delta previews,
    agent.text turns) as working updates, and at the end its result as an artifact and the final
    status. An async iterator (daphne sends each event as it comes; a sync one would be buffered
    whole), each poll a short database read in a thread; a stream that outlives max_seconds just
    ends (tasks/get still works)."""

    def __init__(self, space: Space, link: A2ATaskLink, request_id, *, after_seq: int, poll: float = 0.3,
                 max_seconds: float = 900) -> None:
        self.space, self.link, self.request_id, self.cursor = space, link, request_id, after_seq
        self.poll_every, self.max_seconds = poll, max_seconds
        first = as_task(link).model_dump(mode="json", by_alias=True, exclude_none=True)
        first["task"] = {k: v for k, v in first.items() if k != "kind"}  # the 1.0 wrapping, for 1.0 readers
        self.first = _sse(request_id, first)

    def poll(self) -> tuple[list[bytes], bool]:
        from veronica.models import Event

        out, link = [], self.link
        for ev in Event.objects.filter(space=self.space, seq__gt=self.cursor).order_by("seq")[:500]:
            self.cursor = ev.seq
            payload = ev.payload if isinstance(ev.payload, dict) else {}
            if ev.kind == "task.status" and payload.get("task") == link.task_id:
                state = STATE.get(payload.get("to"))
                if state is not None and state not in FINAL:
                    out.append(_sse(self.request_id, _status_event(link, state)))
            elif ev.kind in ("agent.delta", "agent.text") and ev.member_id == link.member_id and payload.get("text"):
                out.append(_sse(self.request_id, _status_event(link, t.TaskState.working, text=str(payload["text"]))))
        link.task.refresh_from_db()
        done = as_task(link)
        if done.status.state not in FINAL:
            return out, False
        out += [_sse(self.request_id, _artifact_event(link, artifact)) for artifact in done.artifacts or []]
        text = a2a_client.parts_text(done.status.message.parts) if done.status.message else ""
        out.append(_sse(self.request_id, _status_event(link, done.status.state, text=text, final=True)))
        return out, True

    async def __aiter__(self):
        import asyncio

        from asgiref.sync import sync_to_async

        yield self.first
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_seconds
        while loop.time() < deadline:
            chunks, done = await sync_to_async(self.poll)()
            for chunk in chunks:
                yield chunk
            if done:
                return
            await asyncio.sleep(self.poll_every)
