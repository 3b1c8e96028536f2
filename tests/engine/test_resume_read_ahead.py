"""The resumes a worker starts at once read their starts together (veronica.engine.runner.read_ahead,
veronica.agent.read_ahead): their first phase in one UPDATE, their transcripts and waggle's view of
their sessions in three statements for all of them. A run given its start reads none of it again and
writes exactly what it would have: the test runs a cut member through the real agent loop against the
mock vendor, with and without the read-ahead. PostgreSQL: the resumes of a reap are claimed up front
only there (elsewhere each run claims and reads its own)."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.conftest import make_space
from tests.vendors.mock_openai import MockOpenAI
from veronica.agent import waggle_bridge
from veronica.engine import runner, slot
from veronica.models import Event, Member, Message, Phase, RunStatus, Session, Turn, TurnRole
from veronica.swarm import bus
from waggle.models import ForageCall

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(connection.vendor != "postgresql", reason="resumes are claimed up front on PostgreSQL only")]


def cut(tmp_path, name: str, slug: str) -> Member:
    """A member whose run was cut (its worker died, the lease watchdog released it): mail answered by a
    list_dir call whose result is in, waggle's record of that call written, the phase back at ready."""
    space = make_space(tmp_path, slug=slug, workers=(name,))
    Member.objects.filter(space=space, name=name).update(model="openai:gpt-4.1-mini")
    bus.send(space, "boss", name, "list the folder, then say done")
    member = Member.objects.get(space=space, name=name)
    mail = list(Message.objects.filter(recipient=member).values_list("pk", flat=True))
    Message.objects.filter(pk__in=mail).update(read_at=member.created_at)
    session = Session.objects.create(member=member)
    Turn.objects.create(session=session, seq=1, role=TurnRole.USER, content="brief", mail_ids=mail)
    Turn.objects.create(session=session, seq=2, role=TurnRole.ASSISTANT, content="",
                        tool_calls=[{"id": "call_1", "name": "list_dir", "args": {"path": "."}}])
    Turn.objects.create(session=session, seq=3, role=TurnRole.TOOL, content="(empty folder)", tool_call_id="call_1",
                        tool_name="list_dir")
    ForageCall.objects.create(space_key=str(space.pk), session_key=str(session.pk), member_key=str(member.pk), seq=1,
                              tool="list_dir", args={"path": "."}, mutates=False, out_hash="h", est_tokens=1)
    Member.objects.filter(pk=member.pk).update(phase=Phase.READY, run_status=RunStatus.IDLE)
    return Member.objects.get(pk=member.pk)


def run_through_the_loop(lease) -> tuple[str, list[str]]:
    """The resume's run, to its end: its outcome and the SELECTs it sent."""
    with CaptureQueriesContext(connection) as queries:
        outcome = runner.run_claimed(lease, "resume")
    return outcome, [q["sql"] for q in queries.captured_queries if q["sql"].lstrip().upper().startswith("SELECT")]


def reads_of(selects: list[str], table: str) -> list[str]:
    return [s for s in selects if f'FROM "{table}"' in s]


@pytest.fixture
def vendor(settings, monkeypatch):
    with MockOpenAI(api_key="sk-ahead") as mock:
        mock.configure(latency=0.0, steps=3)  # list_dir twice (one result is in already), then "done"
        settings.OPENAI_BASE_URL = mock.base_url
        monkeypatch.setenv("OPENAI_API_KEY", "sk-ahead")
        yield mock


def test_resumes_claimed_up_front_get_their_starts_read_and_their_runs_read_none_of_it_again(tmp_path, vendor):
    members = [cut(tmp_path, f"w{i}", f"s{i}") for i in range(3)]
    before = Event.objects.filter(kind="member.phase").count()
    leases = runner.claim_up_front([m.pk for m in members])
    assert sorted(leases) == sorted(m.pk for m in members)
    for member in members:
        lease = leases[member.pk]
        assert [t.seq for t in lease.ahead.turns] == [1, 2, 3]
        assert lease.ahead.waggle.last == 1 and not lease.ahead.waggle.waits
        assert Member.objects.get(pk=member.pk).phase == Phase.THINKING and lease.member.phase == Phase.THINKING
    assert Event.objects.filter(kind="member.phase").count() == before + 3, "each phase has its event, as a fence writes it"

    outcome, selects = run_through_the_loop(leases[members[0].pk])
    assert outcome == "done"
    for table in ("veronica_turn", "waggle_foragecall", "waggle_firedplan"):
        assert not reads_of(selects, table), f"the run read {table} again: {reads_of(selects, table)}"
    session = Session.objects.get(member=members[0], ended_at__isnull=True)
    assert list(Turn.objects.filter(session=session).order_by("seq").values_list("seq", "role")) == [
        (1, "user"), (2, "assistant"), (3, "tool"), (4, "assistant"), (5, "tool"), (6, "assistant")]
    assert list(ForageCall.objects.filter(session_key=str(session.pk)).order_by("seq").values_list("seq", "tool")) == [
        (1, "list_dir"), (2, "list_dir")]
    assert Member.objects.get(pk=members[0].pk).phase == Phase.READY


def test_a_resume_run_without_its_start_read_ahead_reads_it_and_writes_the_same(tmp_path, vendor):
    """The other side of the test above: the same cut member, claimed alone, reads its transcript and
    waggle's view of its session, and ends with the same rows."""
    member = cut(tmp_path, "w1", "solo")
    lease = slot.claim(member.pk, "resume", gates=("breaker",), record_wake=True, open_session=True)
    assert lease.ahead is None
    outcome, selects = run_through_the_loop(lease)
    assert outcome == "done"
    assert reads_of(selects, "veronica_turn") and reads_of(selects, "waggle_foragecall")
    session = Session.objects.get(member=member, ended_at__isnull=True)
    assert Turn.objects.filter(session=session).count() == 6
    assert list(ForageCall.objects.filter(session_key=str(session.pk)).values_list("seq", flat=True).order_by("seq")) == [1, 2]


def test_a_resume_with_nothing_to_do_leaves_no_thinking_phase_behind(tmp_path, vendor):
    """Its phase was set to thinking ahead; a run that finds its member's last turn answered and no mail
    ends at once, and sets it back to ready."""
    member = cut(tmp_path, "w1", "idle")
    session = Session.objects.get(member=member)
    Turn.objects.create(session=session, seq=4, role=TurnRole.ASSISTANT, content="done")
    lease = runner.claim_up_front([member.pk])[member.pk]
    assert lease.member.phase == Phase.THINKING
    outcome, _ = run_through_the_loop(lease)
    assert outcome == "done" and vendor.stats()["model_requests"] == 0
    assert Member.objects.get(pk=member.pk).phase == Phase.READY


def test_the_phases_of_many_leases_are_written_all_or_none(tmp_path):
    """phase_many writes under the leases: one lease gone, and none of them is written (each run then
    writes its own phase, under its own fence)."""
    members = [cut(tmp_path, f"w{i}", f"p{i}") for i in range(2)]
    leases = [slot.claim(m.pk, "resume", gates=("breaker",), record_wake=True, open_session=True) for m in members]
    Member.objects.filter(pk=members[1].pk).update(lease_token="someone-else")
    before = Event.objects.filter(kind="member.phase").count()
    assert slot.phase_many(leases, Phase.THINKING) == 0
    assert set(Member.objects.filter(pk__in=[m.pk for m in members]).values_list("phase", flat=True)) == {Phase.READY}
    assert Event.objects.filter(kind="member.phase").count() == before
    assert all(lease.member.phase == Phase.READY for lease in leases)
    Member.objects.filter(pk=members[1].pk).update(lease_token=leases[1].token)
    assert slot.phase_many(leases, Phase.THINKING) == 2
    assert slot.phase_many(leases, Phase.THINKING) == 0, "already in it: nothing to write"
    assert Event.objects.filter(kind="member.phase").count() == before + 2


def test_a_failed_read_ahead_leaves_each_run_to_read_its_own(tmp_path, vendor, monkeypatch):
    from django.db import OperationalError

    from veronica.agent import read_ahead

    member = cut(tmp_path, "w1", "broken")

    def down(starts):
        raise OperationalError("the connection dropped")

    monkeypatch.setattr(read_ahead, "read", down)
    lease = runner.claim_up_front([member.pk])[member.pk]
    assert lease.ahead is None
    outcome, selects = run_through_the_loop(lease)
    assert outcome == "done" and reads_of(selects, "veronica_turn")


def test_waggle_s_read_ahead_is_best_effort(tmp_path, monkeypatch):
    from waggle import service

    member = cut(tmp_path, "w1", "wbroken")
    session = Session.objects.get(member=member)
    monkeypatch.setattr(service, "read_ahead", lambda keys: 1 / 0)
    assert waggle_bridge.read_ahead([(member, session)]) == {}  # logged, not raised: each run reads its own
