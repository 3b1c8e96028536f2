"""Request helpers and the catalogue of every console page and API endpoint of one space."""
from __future__ import annotations

import json

from django.test import Client

from veronica.models import Approval, Member, Question, Space


def call(client: Client, method: str, url: str, body: dict | None = None):
    data = json.dumps(body) if body is not None else ""
    return client.generic(method, url, data=data, content_type="application/json")


def pending_approval(space: Space, member: str = "w1", tool: str = "write_file", **args) -> Approval:
    m = Member.objects.get(space=space, name=member)
    return Approval.objects.create(space=space, member=m, tool_name=tool, tool_args=args or {"path": "x.txt"}, status="pending")


def open_question(space: Space, member: str = "w1", text: str = "which branch?") -> Question:
    return Question.objects.create(space=space, member=Member.objects.get(space=space, name=member), text=text)


SPACE_PANELS = ("roster", "tasks", "approvals", "blackboard", "messages", "usage")
MEMBER_PANELS = ("header", "transcript", "skills", "memory", "schedule")


def read_targets(slug: str, *, task_id: int | None = None, run_id: int | None = None) -> list[tuple[str, str]]:
    """Every read; with a task and a run, their pages too (the task page, its API, the run trace)."""
    api = f"/api/spaces/{slug}"
    pages = [f"/spaces/{slug}/", f"/spaces/{slug}/members/boss/", f"/spaces/{slug}/usage/"]
    if task_id is not None:
        pages += [f"/spaces/{slug}/tasks/{task_id}/", f"{api}/tasks/{task_id}/"]
    if run_id is not None:
        pages.append(f"/spaces/{slug}/runs/{run_id}/")
    pages += [f"/spaces/{slug}/panels/{p}/" for p in SPACE_PANELS]
    pages += [f"/spaces/{slug}/members/boss/panels/{p}/" for p in MEMBER_PANELS]
    apis = [f"{api}/", f"{api}/usage/", f"{api}/members/", f"{api}/members/boss/", f"{api}/members/boss/transcript/",
            f"{api}/members/boss/skills/", f"{api}/members/boss/memory/", f"{api}/members/boss/schedule/", f"{api}/tasks/",
            f"{api}/messages/", f"{api}/events/", f"{api}/blackboard/", f"{api}/approvals/", f"{api}/questions/"]
    return [("GET", u) for u in pages + apis]


def steer_targets(slug: str, approval_id: int, question_id: int) -> list[tuple[str, str, dict]]:
    """Operator moves, each with a valid body."""
    api = f"/api/spaces/{slug}"
    m = f"{api}/members/w1"
    return [
        ("POST", f"{api}/halt/", {}),
        ("POST", f"{m}/suspend/", {}), ("POST", f"{m}/resume/", {}), ("POST", f"{m}/freeze/", {}),
        ("POST", f"{m}/unfreeze/", {}), ("POST", f"{m}/clear/", {}), ("POST", f"{m}/permission/", {"mode": "default"}),
        ("POST", f"{m}/compact/", {"kind": "micro"}),
        ("PUT", f"{m}/schedule/", {"cron": "*/5 * * * *"}), ("DELETE", f"{m}/schedule/", {}),
        ("POST", f"{api}/messages/", {"to": "boss", "body": "hello"}),
        ("PUT", f"{api}/blackboard/", {"content": "# plan"}),
        ("POST", f"{api}/approvals/{approval_id}/approve/", {}),
        ("POST", f"{api}/approvals/{approval_id}/deny/", {"reason": "no"}),
        ("POST", f"{api}/questions/{question_id}/answer/", {"answer": "main"}),
    ]


def owner_targets(slug: str) -> list[tuple[str, str, dict]]:
    api = f"/api/spaces/{slug}"
    return [
        ("GET", f"{api}/access/", None),
        ("POST", f"{api}/access/", {"username": "stranger", "role": "viewer"}),
        ("DELETE", f"{api}/access/viewer/", {}),
        ("POST", f"{api}/members/", {"name": "w9"}),
        ("DELETE", f"{api}/members/w2/", {}),
        ("GET", f"/spaces/{slug}/manage/", None),
        ("GET", f"/spaces/{slug}/export/", None),
        ("POST", f"/spaces/{slug}/manage/", {"action": "grant", "username": "stranger", "role": "viewer"}),
    ]
