"""What a run costs besides its steps (issue 25 point 1): the claim, the reads before its first model
call and its finish, pinned in statements, and the run-start reads compiled once per shape
(veronica.plumbing.compiled_select) yet built exactly as the ORM builds them."""
from __future__ import annotations

import pytest
from django.db import connection
from django.db.models import Count
from django.test.utils import CaptureQueriesContext

from veronica.swarm import bus
from veronica.engine import runner, supervisor
from veronica.models import Member, Session, Turn, TurnRole
from veronica.plumbing.compiled_select import fetch

# A one-call run ("done") of a member whose session is open already: the claim with its Run, Wake and
# event rows, the run's reads (session, MCP servers, A2A remotes, transcript, mail, tasks, blackboard,
# skills, memory, waggle), its brief (with the first phase), the model turn and the finish with its ring.
# Measured 20 (PostgreSQL) / 42 (SQLite) statements, savepoints included (issue 25: the claim with its
# Run row, member, session, probes and unread mail in one statement, the empty reads skipped, the finish's
# fence releasing and looking at the mailbox; waggle: its ring's last seq only, the routes cached, nothing
# waiting, the message's row in the brief's commit); 22 before the claim read the mail and the release
# looked, 40 / 46 before that, 52 / 58 before issue 25.
REPEAT_RUN = 22 if connection.vendor == "postgresql" else 44


def w1(space):
    return supervisor.get_member(space, "w1")


def one_call_run(space, scripted, text: str):
    scripted("done")
    bus.send(space, "boss", "w1", text)
    with CaptureQueriesContext(connection) as queries:
        assert runner.wake(w1(space).pk, "message") == "done"
    return [q["sql"] for q in queries.captured_queries]


def test_a_members_next_run_costs_a_pinned_number_of_statements(space, scripted):
    one_call_run(space, scripted, "first")  # opens the session, the blackboard and today's usage row
    sqls = one_call_run(space, scripted, "second")
    assert len(sqls) <= REPEAT_RUN, "\n".join(s[:110] for s in sqls)


def test_an_open_session_is_read_without_a_fence_of_its_own(space, scripted):
    one_call_run(space, scripted, "first")
    sqls = one_call_run(space, scripted, "second")
    fences = [s for s in sqls if 'UPDATE "veronica_member" SET "lease_expires_at"' in s
              or s.startswith('WITH a AS (UPDATE "veronica_member" SET "run_status"')]  # PostgreSQL: the finish's fence releases
    assert len(fences) == 3, "the brief (with the first phase), the model turn and the finish: " + "\n".join(f[:90] for f in fences)


def test_the_run_start_reads_build_what_the_orm_builds(space):
    member = w1(space)
    session = Session.objects.create(member=member)
    Turn.objects.create(session=session, seq=1, role=TurnRole.USER, content="hi", mail_ids=[3, 4])
    Turn.objects.create(session=session, seq=2, role=TurnRole.ASSISTANT, content="", tool_calls=[{"id": "c1", "name": "x", "args": {"a": [1]}}])
    build = lambda s: Turn.objects.filter(session_id=s.int("session")).order_by("seq")  # noqa: E731
    got = fetch(("test-turns",), build, {"session": session.pk})
    want = list(Turn.objects.filter(session=session).order_by("seq"))
    fields = [f.attname for f in Turn._meta.concrete_fields]
    assert [[getattr(t, f) for f in fields] for t in got] == [[getattr(t, f) for f in fields] for t in want]
    assert got[1].tool_calls[0]["args"] == {"a": [1]} and got[0].mail_ids == [3, 4] and got[0].created_at.tzinfo is not None
    assert not got[0]._state.adding and got[0]._state.db == "default"

    claimed = fetch(("test-member",), lambda s: Member.objects.select_related("space").filter(pk=s.int("id")), {"id": member.pk})
    with CaptureQueriesContext(connection) as queries:
        assert claimed[0].space.name == space.name and claimed[0].name == "w1"
    assert not queries.captured_queries, "select_related's space is attached, not read again"
    assert fetch(("test-member",), lambda s: Member.objects.select_related("space").filter(pk=s.int("id")), {"id": -1}) == []


def test_only_plain_model_shapes_are_compiled(space):
    with pytest.raises(RuntimeError, match="plain model columns"):
        fetch(("test-annotated",), lambda s: Session.objects.filter(member_id=s.int("m")).annotate(n=Count("turns")), {"m": 1})


def test_the_days_first_call_makes_its_usage_row_without_reading_it(space, scripted):
    """INSERT ... ON CONFLICT DO NOTHING, then the meter again: no get_or_create (a read, a savepoint, an insert)."""
    from veronica.models import UsageDay

    sqls = one_call_run(space, scripted, "first")
    assert not [s for s in sqls if s.startswith("SELECT") and 'FROM "veronica_usageday"' in s]
    day = UsageDay.objects.get(member=w1(space))
    assert day.model_calls == 1 and day.space_id == space.pk
    one_call_run(space, scripted, "second")
    day.refresh_from_db()
    assert day.model_calls == 2


def a_run(space, scripted, text: str) -> list[str]:
    """one_call_run's statements, without the test's own read of the member."""
    member_id = w1(space).pk
    scripted("done")
    bus.send(space, "boss", "w1", text)
    with CaptureQueriesContext(connection) as queries:
        assert runner.wake(member_id, "message") == "done"
    return [q["sql"] for q in queries.captured_queries]


def until_first_model_call(sqls: list[str]) -> list[str]:
    """The run's statements before its first model turn is written (its brief's fence included)."""
    out = []
    for s in sqls:
        if s.startswith('WITH a AS (UPDATE "veronica_member" SET "lease_expires_at"'):  # the model turn's fence (with its meter)
            break
        out.append(s)
    return out


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the one-statement claim is PostgreSQL's")
def test_a_wake_claims_reads_its_member_and_opens_its_session_in_one_statement(space, scripted):
    """The claim, its Run row, the claimed member (with its space) and the member's first session:
    ONE statement (issue 25: five round trips and a commit of their own before)."""
    sqls = a_run(space, scripted, "first")
    start = until_first_model_call(sqls)
    assert not [s for s in start if 'INSERT INTO "veronica_run"' in s and not s.startswith("WITH c AS")]
    assert not [s for s in start if s.startswith("SELECT") and 'FROM "veronica_member"' in s], "the claim returns the member"
    assert not [s for s in start if 'FROM "veronica_session"' in s and not s.startswith("WITH c AS")]
    assert not [s for s in start if 'INSERT INTO "veronica_session"' in s and not s.startswith("WITH c AS")]
    assert not [s for s in start if s.startswith("SELECT") and 'FROM "veronica_turn"' in s], "a session just opened has no turn"
    member = w1(space)
    session = Session.objects.get(member=member, ended_at__isnull=True)
    assert list(session.turns.values_list("role", flat=True)) == [TurnRole.USER, TurnRole.ASSISTANT]
    run = member.runs.get()
    assert run.outcome == "done" and run.source == "message" and run.started_at <= run.ended_at
    # the next run finds that session in the same statement, and reads its transcript
    sqls = a_run(space, scripted, "second")
    assert Session.objects.filter(member=member).count() == 1
    assert session.turns.count() == 4


# A first run's statements before its first model call on PostgreSQL (the test's savepoints included):
# its claim (one statement), the wake and run.started rows, the run-start reads, the brief's fence.
# Measured 10 (issue 25: the claim with the session and the unread mail in it, the empty kinds probed in it,
# no transcript read, nothing of waggle's read for the session it opened); 11 before the claim read the
# mail, 17 without waggle's cut; 36 before.
FIRST_RUN_START = 11


@pytest.mark.skipif(connection.vendor != "postgresql", reason="pinned on PostgreSQL")
def test_a_first_runs_start_costs_a_pinned_number_of_statements(space, scripted):
    start = until_first_model_call(a_run(space, scripted, "first"))
    assert len(start) <= FIRST_RUN_START, "\n".join(s[:110] for s in start)


def test_the_days_first_call_is_metered_in_one_statement(space, scripted):
    """An upsert (INSERT ... ON CONFLICT DO UPDATE): no UPDATE that matches nothing, then an INSERT, then the UPDATE again."""
    sqls = a_run(space, scripted, "first")
    assert not [s for s in sqls if s.startswith('UPDATE "veronica_usageday"')]
    assert not [s for s in sqls if s.startswith('INSERT INTO "veronica_usageday"') and "DO NOTHING" in s]


START_READS = ('FROM "veronica_mcpserver"', 'FROM "veronica_a2aremote"', 'FROM "veronica_secret"', 'FROM "veronica_skill"',
               'FROM "veronica_memoryfile"', 'FROM "veronica_task"', 'FROM "veronica_blackboard"')


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the claim's probes are PostgreSQL's")
def test_a_run_start_skips_the_reads_its_claim_found_empty(space, scripted):
    """The claim asks "is there any?" of each kind the run's start reads (veronica.agent.runstart): in an
    empty space none of those round trips is made."""
    sqls = a_run(space, scripted, "first")
    made = [s[:80] for s in until_first_model_call(sqls) if s.startswith("SELECT") and any(t in s for t in START_READS)]
    assert not made, made


def test_a_run_start_still_reads_what_is_there(space, scripted):
    """Each kind present is read as before: skills, memory, open tasks, the blackboard."""
    from veronica.swarm import blackboard, memory, skills
    from veronica.models import Run, Task

    member = w1(space)
    skills.add_skill(space, "triage", "Sort the inbox first.", description="how to triage")
    memory.write(member, "MEMORY.md", "the index", actor="test")
    Task.objects.create(space=space, title="ship the report", assignee=member, status="ready")
    blackboard.write(space, "boss", "the plan is on")
    a_run(space, scripted, "first")
    prompt = Run.objects.get(member=member).system_prompt
    assert "Sort the inbox first." in prompt and "MEMORY.md" in prompt
    brief = Turn.objects.filter(session__member=member, role=TurnRole.USER).get().content
    assert "ship the report" in brief and "the plan is on" in brief


def test_what_the_claim_found_empty_holds_for_the_start_only(space, scripted):
    """Skipped reads are the run's start's: after it (the first model call on), every read goes to the database."""
    from veronica.agent import runstart

    with runstart.known(frozenset({"skills", "memory"})):
        assert runstart.empty("skills")
        runstart.forget()
        assert not runstart.empty("skills") and not runstart.empty("memory")
    assert not runstart.empty("skills")


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the one-statement claim is PostgreSQL's")
def test_a_wakes_claim_reads_the_mailbox_its_run_starts_with(space, scripted):
    """The claim's statement returns the member's unread mail: the run's start makes no read of it."""
    sqls = a_run(space, scripted, "first")
    start = until_first_model_call(sqls)
    assert not [s for s in start if s.startswith("SELECT") and 'FROM "veronica_message"' in s], "the claim read the mail"
    brief = Turn.objects.filter(session__member=w1(space), role=TurnRole.USER).get()
    assert "first" in brief.content and len(brief.mail_ids) == 1


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the one-statement claim is PostgreSQL's")
def test_a_mailbox_longer_than_the_claim_reads_is_read_whole_by_the_run(space, scripted):
    from veronica.engine import slot

    scripted("done")
    for i in range(slot.CLAIM_MAIL + 3):
        bus.send(space, "boss", "w1", f"job {i}")
    assert runner.wake(w1(space).pk, "message") == "done"
    brief = Turn.objects.filter(session__member=w1(space), role=TurnRole.USER).get()
    assert len(brief.mail_ids) == slot.CLAIM_MAIL + 3 and f"job {slot.CLAIM_MAIL + 2}" in brief.content
    assert not bus.unread_list(w1(space))
