"""Curation: GC, demote, prune, compact, promote — in that order — plus the management command
and the django-q2 schedule."""
from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from waggle import service
from waggle.models import LedgerEntry, Waggle
from waggle.route import Route, Step, render_script
from waggle.service import curate

pytestmark = pytest.mark.django_db

NOW = timezone.now()
OLD = NOW - timedelta(days=60)
STALE = timedelta(days=30)


def route(tag: str = "a") -> Route:
    r = Route(steps=(Step("list_dir", binds=(("path", "path"),)), Step("grep", binds=(("path", "path"),),
                     literals=(("pattern", tag),)), Step("read_file", binds=(("path", "path"),))),
              params=("path",))
    return Route(steps=r.steps, params=r.params, name=r.stable_name())


def make(space="1", r=None, scope="space", touched=NOW, disabled=False, script=None, name=None):
    r = r or route()
    return Waggle.objects.create(name=name or r.name, scope=scope, space_key=space if scope == "space" else "",
                                 route=r.to_json(), script=render_script(r) if script is None else script,
                                 length=len(r.steps), created=touched, touched=touched, disabled=disabled)


def ledger(w, n=1, fail=False, on_demand=False, space=None):
    for _ in range(n):
        LedgerEntry.objects.create(name=w.name, scope=w.scope, store_key=w.space_key, space_key=space or w.space_key or "1",
                                   steps=2, used_steps=0 if fail else 2, yield_tokens=0 if fail else 40, fail=fail,
                                   on_demand=on_demand)


def test_gc_drops_no_script_duplicates_and_unreadable_routes():
    kept = make(name="keep", touched=OLD)
    make(name="dup", script=kept.script)  # same script, same store: a copy
    make(name="empty", script="  ")
    make(name="broken", r=route("b")).__class__.objects.filter(name="broken").update(route={"steps": []})
    other_space = make(space="2", name="same-script-other-space", script=kept.script)
    summary = curate(NOW, stale_age=timedelta(days=365))
    assert summary.gc == 3
    assert set(Waggle.objects.values_list("name", flat=True)) == {"keep", other_space.name}


def test_demote_routes_whose_replays_are_mostly_missed():
    chronic = make(name="chronic", r=route("a"))
    ledger(chronic, 3, fail=True)
    mostly_missed = make(name="mostly-missed", r=route("b"))
    ledger(mostly_missed, 5, fail=True)
    ledger(mostly_missed, 1)  # one use no longer shields a route that misses five times in six
    useful = make(name="useful", r=route("c"))
    ledger(useful, 12)
    ledger(useful, 1, fail=True)
    asked = make(name="asked", r=route("d"))
    ledger(asked, 4, fail=True, on_demand=True)  # members' bad on-demand runs are not divergences
    summary = curate(NOW, min_fails=3)
    assert summary.demoted == 2
    assert set(Waggle.objects.filter(disabled=True).values_list("name", flat=True)) == {"chronic", "mostly-missed"}
    assert Waggle.objects.get(name="chronic").touched == NOW
    assert LedgerEntry.objects.filter(name="chronic").count() == 3  # kept for inspection
    assert curate(NOW, min_fails=3).demoted == 0  # idempotent


def test_prune_zero_use_stale_waggles_only():
    make(name="stale", r=route("a"), touched=OLD)
    used = make(name="used-old", r=route("b"), touched=OLD)
    ledger(used)
    make(name="young", r=route("c"), touched=NOW - timedelta(days=3))
    assert curate(NOW, stale_age=STALE).pruned == 1
    assert set(Waggle.objects.values_list("name", flat=True)) == {"used-old", "young"}


def test_curation_order_a_just_demoted_waggle_survives_its_own_prune_pass():
    w = make(name="diverger", touched=OLD)  # old enough to prune, and a chronic diverger
    ledger(w, 3, fail=True)
    first = curate(NOW, stale_age=STALE, min_fails=3)
    assert (first.demoted, first.pruned, first.compacted) == (1, 0, 0)
    assert Waggle.objects.get(name="diverger").disabled  # kept for inspection
    # a pass with the same clock changes nothing (idempotent)
    again = curate(NOW, stale_age=STALE, min_fails=3)
    assert again.as_dict() == {"gc": 0, "demoted": 0, "pruned": 0, "compacted": 0, "promoted": 0, "forage_trimmed": 0}
    # once it has aged out it is pruned, and compact drops its ledger in the same pass
    later = curate(NOW + STALE + timedelta(days=1), stale_age=STALE, min_fails=3)
    assert (later.pruned, later.compacted) == (1, 3)
    assert not Waggle.objects.exists() and not LedgerEntry.objects.exists()


def test_compact_lets_a_re_mined_route_start_clean():
    w = make(name="gone", touched=OLD)
    ledger(w, 2, fail=True, on_demand=True)  # (failed replays would demote it, refreshing touched)
    LedgerEntry.objects.create(name="never-existed", scope="space", store_key="1", space_key="1")
    summary = curate(NOW, stale_age=STALE, min_fails=3)
    assert summary.pruned == 1 and summary.compacted == 3
    again = make(name="gone")  # mined again later under the same content-stable name
    [item] = service.list_waggles("1")
    assert item["name"] == again.name and item["stats"]["fails"] == 0 and item["stats"]["uses"] == 0


def test_promote_a_route_present_in_two_spaces():
    make(space="A")
    make(space="B")
    make(space="C", r=route("only-in-c"))
    summary = curate(NOW)
    assert summary.promoted == 1
    g = Waggle.objects.get(scope="global")
    assert g.name == route().name and g.space_key == "" and g.route == route().to_json() and "scope: global" in g.script
    assert curate(NOW).promoted == 0  # already present: skipped
    # the global copy is visible (and replayable) in a space that never mined it
    assert [w["scope"] for w in service.list_waggles("D")] == ["global"]


def test_promote_skips_disabled_copies_and_does_not_merge_different_routes():
    make(space="A")
    make(space="B", disabled=True)
    assert curate(NOW).promoted == 0
    # same name but different content (hand-made rows): never merged into one global route
    make(space="E", r=route("x"), name="clash")
    make(space="F", r=route("y"), name="clash")
    assert curate(NOW).promoted == 0
    assert not Waggle.objects.filter(scope="global").exists()


def test_management_command_prints_the_summary():
    w = make(name="diverger", touched=OLD)
    ledger(w, 3, fail=True)
    out = StringIO()
    call_command("waggle_curate", "--min-fails", "3", "--stale-days", "30", stdout=out)
    assert "waggle curate: gc=0 demoted=1 pruned=0 compacted=0 promoted=0" in out.getvalue()


def test_ensure_schedule_is_idempotent():
    from django_q.models import Schedule

    from waggle.schedules import SCHEDULE_NAME, ensure_schedule

    first = ensure_schedule()
    second = ensure_schedule()
    assert first.pk == second.pk and Schedule.objects.filter(name=SCHEDULE_NAME).count() == 1
    assert first.func == "waggle.service.curate" and first.schedule_type == Schedule.HOURLY and first.repeats == -1
    Schedule.objects.filter(pk=first.pk).update(func="something.else")
    assert ensure_schedule().func == "waggle.service.curate"
    # the scheduled function is importable by path and runs without arguments
    from django.utils.module_loading import import_string

    assert import_string(first.func)().as_dict()["gc"] == 0
