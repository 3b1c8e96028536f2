"""Schedules, tasks, management commands, settings wiring."""
import io

import pytest
from django.core.management import CommandError, call_command
from django_q.models import Schedule

from learning import sources, tasks
from learning.lock import WriterLock
from learning.models import MinedItem, Proposal
from learning.schedules import SCHEDULES, ensure_schedules
from learning.sources import Correction, EmptySource, SessionItem, StaticSource

pytestmark = pytest.mark.django_db

SHARED = StaticSource(
    session_items=[SessionItem("s1", "alice", ["ops"], "We decided to ship on Monday.")],
    correction_items=[Correction("c1", ["ops"], "approval denied: never delete backups; reason: we need them")],
)


def shared_source():
    return SHARED


@pytest.fixture
def wired(settings):
    SHARED.memory.clear()
    settings.LEARNING_SOURCE = shared_source  # the host sets a dotted path; import_string gives the same
    return SHARED


def test_ensure_schedules_is_idempotent():
    assert ensure_schedules() == [name for name, _, _ in SCHEDULES]
    assert ensure_schedules() == []
    assert Schedule.objects.filter(name__startswith="learning.").count() == 3
    s = Schedule.objects.get(name="learning.learn")
    assert s.func == "learning.tasks.learn" and s.schedule_type == Schedule.MINUTES and s.repeats == -1
    s.minutes, s.func = 5, "wrong.func"  # an operator's interval is kept, a broken func repaired
    s.save()
    Schedule.objects.create(name="learning.reflect", func="learning.tasks.reflect")  # duplicate from a race
    ensure_schedules()
    s.refresh_from_db()
    assert (s.minutes, s.func) == (5, "learning.tasks.learn")
    assert Schedule.objects.filter(name="learning.reflect").count() == 1


def test_settings_default_to_empty_source_and_offline(settings):
    settings.LEARNING_SOURCE = None
    settings.LEARNING_COMPLETE = None
    assert isinstance(sources.get_source(), EmptySource)
    from learning import offline
    assert sources.get_complete() is offline.complete
    settings.LEARNING_COMPLETE = "learning.offline.make_complete"
    assert sources.get_complete() is offline.complete
    assert isinstance(StaticSource(), sources.Source)
    settings.LEARNING_SOURCE = "learning.sources.StaticSource"  # a class path works as a factory
    assert isinstance(sources.get_source(), StaticSource)


def test_tasks_run_the_passes(wired, settings):
    settings.LEARNING_AUTO_APPROVE = False
    assert tasks.reflect()["status"] == "ok"
    assert tasks.learn()["stats"] == {"proposals": 1}
    assert Proposal.objects.get().status == "pending"
    assert tasks.distill()["stats"] == {"distilled": 1, "notes": 1}


def test_commands_print_progress(wired):
    out = io.StringIO()
    call_command("learning_reflect", stdout=out)
    text = out.getvalue()
    assert "took the writer lock" in text and "mined correction:c1: 1 lesson(s)" in text and ": ok " in text
    out = io.StringIO()
    call_command("learning_learn", "--domain", "ops", "--auto-approve", stdout=out)
    assert "auto-approved" in out.getvalue()
    out = io.StringIO()
    call_command("learning_distill", stdout=out)
    assert "distilled session:s1" in out.getvalue()
    assert ("alice", "session-s1") in wired.memory


def test_command_fails_when_lock_is_busy(wired):
    holder = WriterLock(ttl=60)
    holder.acquire(wait=0)
    with pytest.raises(CommandError, match="busy"):
        call_command("learning_reflect", "--wait", "0", stdout=io.StringIO())
    holder.release()
    assert not MinedItem.objects.exists()


def test_command_reports_bad_output(wired, settings):
    settings.LEARNING_COMPLETE = "tests.learning.test_learning_schedules.garbage_factory"
    with pytest.raises(CommandError, match="error"):
        call_command("learning_reflect", stdout=io.StringIO())


def garbage_factory():
    return lambda system, prompt: "sorry, no"
