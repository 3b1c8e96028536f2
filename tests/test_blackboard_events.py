from datetime import timedelta

import pytest
from django.utils import timezone

from veronica.swarm import blackboard, events
from veronica.plumbing.errors import VeronicaError
from veronica.models import Event


def test_write_replaces_whole_and_records_writer(space):
    blackboard.write(space, "boss", "first")
    board = blackboard.write(space, "w1", "second")
    assert board.content == "second" and board.updated_by == "w1"


def test_oversize_error_names_cap_and_overage(space):
    space.blackboard_cap = 100
    blackboard.write(space, "boss", "keep")
    with pytest.raises(VeronicaError) as err:
        blackboard.write(space, "boss", "x" * 130)
    assert "cap is 100" in err.value.message and "30 over" in err.value.message
    assert blackboard.read(space).content == "keep"


def test_empty_content_clears(space):
    blackboard.write(space, "boss", "something")
    assert blackboard.write(space, "boss", "  ").content == ""


@pytest.mark.parametrize("delta,text", [(timedelta(seconds=5), "just now"), (timedelta(minutes=3, seconds=12), "3m ago"),
                                        (timedelta(hours=2, minutes=5), "2h ago"), (timedelta(days=3), "3d ago"),
                                        (timedelta(seconds=-30), "just now")])
def test_age_string_is_coarse(delta, text):
    now = timezone.now()
    assert blackboard.age_string(now - delta, now) == text


def test_event_seq_is_gapless_and_a_rollback_takes_its_seq_with_it(space):
    from django.db import transaction

    start = Event.objects.filter(space=space).count()
    events.emit(space.pk, "x")
    with pytest.raises(RuntimeError), transaction.atomic():
        events.emit(space.pk, "doomed")
        raise RuntimeError
    events.emit(space.pk, "y")
    seqs = list(Event.objects.filter(space=space).values_list("seq", flat=True))
    assert seqs == list(range(1, start + 3))


def test_signal_happens_on_commit(space, django_capture_on_commit_callbacks, monkeypatch):
    rung = []
    monkeypatch.setattr(events, "ring", lambda space_id, seq: rung.append(seq))
    with django_capture_on_commit_callbacks(execute=True):
        ev = events.emit(space.pk, "x")
        assert rung == []
    assert rung == [ev.seq]


def test_saving_a_stale_space_never_rewinds_the_event_counter(space):
    from veronica.models import Space

    stale = Space.objects.get(pk=space.pk)
    events.emit(space.pk, "a")
    stale.name = "renamed"
    stale.save()
    events.emit(space.pk, "b")  # would hit the unique (space, seq) constraint if the counter rewound
    assert Space.objects.get(pk=space.pk).name == "renamed"


def test_a_board_written_under_a_larger_cap_is_cut_at_the_lowered_cap_where_members_read_it(space):
    from veronica.agent.prompt import wake_brief
    from veronica.agent.tools import ToolContext, tools_for
    from veronica.engine import supervisor

    space.blackboard_cap = 1000
    space.save()
    blackboard.write(space, "boss", "a" * 150 + "b" * 650)
    space.blackboard_cap = 150  # lowered afterwards (admin, a register); the stored board is left as it was
    space.save()
    w1 = supervisor.get_member(space, "w1")
    brief = wake_brief(w1, "message", [])
    read = tools_for("worker")["blackboard_read"].fn(ToolContext(member=w1, space=space), {})
    for text in (brief, read):
        assert "a" * 150 + "\n[blackboard truncated: 800 characters, the cap is 150" in text
        assert "ab" not in text and "b" * 10 not in text
    assert blackboard.read(space).content.endswith("b" * 650)  # the operator still sees (and can fix) the whole board
