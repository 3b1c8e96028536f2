"""Member memory from the member's side: the tools (through a real run), the caps, the permission
gate, the prompt index, and distilled sessions landing as one readable notes file."""
from __future__ import annotations

import pytest

from veronica.swarm import bus, memory
from veronica.agent.prompt import system_prompt
from veronica.agent.tools import ToolContext, tools_for
from veronica.engine import approvals, runner, supervisor
from veronica.swarm.learning_bridge import VeronicaSource
from veronica.models import Approval, MemoryFile, Turn


def w1_of(space):
    return supervisor.get_member(space, "w1")


def tool_results(member) -> list[str]:
    return list(Turn.objects.filter(session__member=member, role="tool").order_by("id").values_list("content", flat=True))


def test_a_member_writes_lists_and_reads_its_memory_in_a_run(space, scripted):
    w1 = w1_of(space)
    scripted(("memory_write", {"name": "MEMORY", "content": "# Index\n- the build needs make"}),
             ("memory_write", {"name": "MEMORY.md", "content": "- deploys on Fridays are banned", "mode": "append"}),
             ("memory_list", {}), ("memory_read", {"name": "MEMORY.md"}), "noted")
    bus.send(space, "boss", "w1", "remember this")
    assert runner.wake(w1.pk, "message") == "done"
    wrote, appended, listing, read = tool_results(w1)
    assert wrote == "wrote MEMORY.md (30 characters)" and appended.startswith("appended to MEMORY.md")
    assert "- MEMORY.md (" in listing and "— Index" in listing
    assert read == "# Index\n- the build needs make\n\n- deploys on Fridays are banned"
    assert MemoryFile.objects.get(member=w1).name == "MEMORY.md"


def test_the_system_prompt_carries_an_index_not_the_contents(space, scripted):
    w1 = w1_of(space)
    memory.write(w1, "project-x", "# Project X: the billing rewrite\n" + "secret detail " * 50, actor="test")
    provider = scripted("ok")
    bus.send(space, "boss", "w1", "hi")
    runner.wake(w1.pk, "message")
    prompt = provider.systems[0]
    assert "# Memory" in prompt and "- project-x.md (" in prompt and "— Project X: the billing rewrite" in prompt
    assert "secret detail" not in prompt
    assert "(no memory files yet" in system_prompt(supervisor.get_member(space, "w2"))


def test_caps_name_the_limit_and_write_nothing(space, settings):
    settings.MEMORY_FILE_CHARS, settings.MEMORY_TOTAL_CHARS, settings.MEMORY_MAX_FILES = 200, 300, 2
    ctx = ToolContext(member=w1_of(space), space=space)
    write = tools_for("worker")["memory_write"].fn
    from veronica.plumbing.errors import VeronicaError

    with pytest.raises(VeronicaError, match="the limit per memory file is 200"):
        write(ctx, {"name": "a.md", "content": "x" * 201})
    write(ctx, {"name": "a.md", "content": "x" * 200})
    with pytest.raises(VeronicaError, match="the limit per member is 300"):
        write(ctx, {"name": "b.md", "content": "y" * 150})
    write(ctx, {"name": "b.md", "content": "y" * 100})
    with pytest.raises(VeronicaError, match="the limit is 2"):
        write(ctx, {"name": "c.md", "content": "z"})
    with pytest.raises(VeronicaError, match="not allowed"):
        write(ctx, {"name": "../../etc/passwd", "content": "z"})
    assert sorted(MemoryFile.objects.values_list("name", flat=True)) == ["a.md", "b.md"]
    read = tools_for("worker")["memory_read"].fn
    with pytest.raises(VeronicaError, match="files: a.md, b.md"):
        read(ctx, {"name": "nope"})


def test_memory_write_waits_for_approval_in_default_mode(space, scripted, django_user_model):
    w1 = supervisor.set_permission_mode(w1_of(space), "default", actor="op")
    scripted(("memory_write", {"name": "notes", "content": "keep me"}), "saved")
    bus.send(space, "boss", "w1", "save a note")
    assert runner.wake(w1.pk, "message") == "waiting"
    assert not MemoryFile.objects.exists()
    assert tools_for("worker")["memory_read"].needs_approval is False
    approvals.decide(Approval.objects.get(), approve=True, user=django_user_model.objects.create_user("op"))
    assert runner.wake(w1.pk, "resume") == "done"
    assert MemoryFile.objects.get(member=w1).content == "keep me"


def test_distilled_sessions_land_as_sections_of_one_readable_notes_file(space, settings):
    w1 = w1_of(space)
    source = VeronicaSource()
    source.write_memory(str(w1.pk), "session-11", "# Notes from session 11\n\n- We use PostgreSQL.")
    source.write_memory(str(w1.pk), "session-12", "# Notes from session 12\n\n- Deploys go through CI.")
    source.write_memory(str(w1.pk), "db-choice", "PostgreSQL 16, one database per space.")
    names = sorted(MemoryFile.objects.filter(member=w1).values_list("name", flat=True))
    assert names == ["db-choice.md", "session-notes.md"], "notes, not one opaque file per session"
    notes = MemoryFile.objects.get(member=w1, name="session-notes.md").content
    assert notes.startswith("# Session notes (distilled by learning)\n\n## Notes from session 11 (")
    assert "- We use PostgreSQL." in notes and "## Notes from session 12 (" in notes
    # a full file drops its oldest sections instead of failing the distill pass
    settings.MEMORY_FILE_CHARS = 200
    source.write_memory(str(w1.pk), "session-13", "# Notes from session 13\n\n- " + "long " * 20)
    notes = MemoryFile.objects.get(member=w1, name="session-notes.md").content
    assert len(notes) <= 200 and "session 13" in notes and "session 11" not in notes
