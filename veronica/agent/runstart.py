"""What a run's start need not read: the kinds of rows its claim found none of.

A run reads a handful of things before its first model call (MCP servers, A2A remotes, a provider key
among the secrets, skills, memory files, open tasks, the blackboard), one round trip each, and in most
spaces most of them are empty. On PostgreSQL the engine's claim statement (veronica.engine.slot) asks
"is there any?" for each kind in the same statement (PROBES: an EXISTS each, on the claimed row's
member and space) and the run skips the reads that would come back empty.

The answer holds for the run's start only: run_member sets it for the reads that build the run's tools,
brief and system prompt, and forgets it before the first model call, so a tool that writes a memory
file or a skill mid-run reads what it wrote. A row created between the claim and the read it would
have met is picked up by the next run, as one created just after that read always was.
"""
from __future__ import annotations

import contextvars
from contextlib import contextmanager

from veronica.models import A2ARemote, Blackboard, McpServer, MemoryFile, Secret, Skill, Task, TaskStatus

_EMPTY: contextvars.ContextVar[frozenset] = contextvars.ContextVar("run_start_empty", default=frozenset())


KINDS = ("mcp", "a2a", "secrets", "skills", "memory", "tasks", "blackboard")


def probes(qn) -> list[tuple[str, str]]:
    """(kind, an EXISTS on the claim's row `c`), in KINDS' order: true when the run's read of that kind
    may find a row. Each condition covers its read's (any row of the space, for reads that filter further)."""
    def table(model) -> str:
        return qn(model._meta.db_table)

    closed = ", ".join(f"'{s}'" for s in (TaskStatus.DONE, TaskStatus.CANCELLED))
    return [
        ("mcp", f"EXISTS (SELECT 1 FROM {table(McpServer)} x WHERE x.space_id = c.space_id)"),
        ("a2a", f"EXISTS (SELECT 1 FROM {table(A2ARemote)} x WHERE x.space_id = c.space_id)"),
        ("secrets", f"EXISTS (SELECT 1 FROM {table(Secret)} x WHERE x.space_id = c.space_id)"),
        ("skills", f"EXISTS (SELECT 1 FROM {table(Skill)} x WHERE x.space_id = c.space_id)"),
        ("memory", f"EXISTS (SELECT 1 FROM {table(MemoryFile)} x WHERE x.member_id = c.id)"),
        ("tasks", f"EXISTS (SELECT 1 FROM {table(Task)} x WHERE x.assignee_id = c.id AND x.status NOT IN ({closed}))"),
        ("blackboard", f"EXISTS (SELECT 1 FROM {table(Blackboard)} x WHERE x.space_id = c.space_id AND x.content <> '')"),
    ]


def found_empty(answers) -> frozenset:
    """The kinds whose probe found no row (answers in KINDS' order)."""
    return frozenset(kind for kind, any_row in zip(KINDS, answers, strict=True) if not any_row)


@contextmanager
def known(empty: frozenset):
    """The run's start: the reads of these kinds come back empty without a round trip."""
    token = _EMPTY.set(frozenset(empty))
    try:
        yield
    finally:
        _EMPTY.reset(token)


def forget() -> None:
    """The start is over (the first model call is next): from here every read goes to the database."""
    _EMPTY.set(frozenset())


def empty(kind: str) -> bool:
    """The run's claim found no row of this kind (only during the run's start)."""
    return kind in _EMPTY.get()
