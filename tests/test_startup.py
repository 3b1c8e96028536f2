from veronica.engine import supervisor
from veronica.portable.startup import ensure_demo_login, ensure_demo_space, ensure_schedules


def test_restart_keeps_runtime_overrides_and_the_login(db, settings, tmp_path):
    settings.DATA_DIR = tmp_path
    space = ensure_demo_space()
    scout = supervisor.set_schedule(supervisor.get_member(space, "scout"), "*/10 * * * *", actor="lead")
    supervisor.set_permission_mode(scout, "default", actor="op")
    clone = supervisor.spawn(scout, actor="lead")
    first_login = ensure_demo_login(space)
    again = ensure_demo_space()  # what `up` does on every start
    assert again.pk == space.pk
    scout.refresh_from_db()
    assert scout.schedule == "*/10 * * * *" and scout.permission_mode == "default"
    assert supervisor.get_member(space, clone.name).removed_at is None
    assert ensure_demo_login(space) == first_login


def test_schedules_are_idempotent(db):
    from django_q.models import Schedule

    ensure_schedules()
    count = Schedule.objects.count()
    ensure_schedules()
    assert Schedule.objects.count() == count
    assert not Schedule.objects.filter(func="veronica.engine.tick.tick").exists(), "the ticker thread replaced the q2 schedule"
    assert Schedule.objects.filter(func__startswith="waggle.").exists()
    assert Schedule.objects.filter(func__startswith="learning.").exists()
