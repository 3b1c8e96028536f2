from datetime import timedelta

import pytest
from django.utils import timezone

from veronica.swarm import blackboard, bus, ledger, skills
from veronica.engine import approvals, budget, runner, supervisor
from veronica.engine.drive import run_until_quiet
from veronica.models import Approval, Member, Message, Run, Turn, UsageDay, Wake


def w1_of(space):
    return supervisor.get_member(space, "w1")


def test_a_wake_with_nothing_to_do_exits_without_a_model_call(space, scripted):
    provider = scripted()
    assert runner.wake(w1_of(space).pk, "message") == "nothing-to-do"  # no mail: not even a claim (issue 13)
    assert provider.systems == []
    assert not Run.objects.exists()
    assert w1_of(space).run_status == "idle" and not w1_of(space).lease_token


def test_a_duplicate_wake_while_busy_coalesces(space, scripted):
    w1 = w1_of(space)
    Member.objects.filter(pk=w1.pk).update(run_status="busy", lease_token="held")
    bus.send(space, "boss", "w1", "hi")
    assert runner.wake(w1.pk, "message") == "coalesced"
    assert not Run.objects.exists() and list(Wake.objects.filter(member=w1).values_list("claimed", flat=True)) == [False]
    Member.objects.filter(pk=w1.pk).update(run_status="idle", lease_token="")
    runner.wake(w1.pk, "message")
    assert list(Wake.objects.filter(member=w1).order_by("id").values_list("claimed", flat=True)) == [False, True]


def test_the_loop_runs_tools_until_a_final_answer_and_persists_every_turn(space, scripted, tmp_path):
    (tmp_path / "alpha" / "notes.txt").write_text("hello\n")
    provider = scripted(("read_file", {"path": "notes.txt"}), "All read.")
    bus.send(space, "boss", "w1", "read notes.txt")
    assert runner.wake(w1_of(space).pk, "message") == "done"
    roles = list(Turn.objects.order_by("seq").values_list("role", flat=True))
    assert roles == ["user", "assistant", "tool", "assistant"]
    tool_turn = Turn.objects.get(role="tool")
    assert "hello" in tool_turn.content
    assert Message.objects.get(recipient__name="w1").read_at is not None
    assert "read notes.txt" in provider.requests[0][0]["content"]


def test_the_wake_brief_carries_mail_tasks_and_blackboard_age(space, scripted):
    provider = scripted("ok")
    blackboard.write(space, "boss", "Plan: ship it")
    ledger.create_task(space, "boss", "probe the api", assignee=w1_of(space))
    runner.wake(w1_of(space).pk, "message")
    brief = provider.requests[0][0]["content"]
    assert "you have new mail" in brief and "probe the api" in brief
    assert "Blackboard (updated just now by boss)" in brief and "Plan: ship it" in brief


def test_system_prompt_has_persona_skills_and_changes_apply_at_the_next_run(space, scripted):
    w1 = w1_of(space)
    Member.objects.filter(pk=w1.pk).update(persona="You are terse.", when_to_use="for probes")
    skills.add_skill(space, "style", "Use bullet points.", description="house style")

    def add_skill_mid_run(call_no):
        if call_no == 1:
            skills.add_skill(space, "late", "Added mid-run.")
    provider = scripted(("list_dir", {}), "done")
    provider.on_call = add_skill_mid_run
    bus.send(space, "boss", "w1", "go")
    runner.wake(w1.pk, "message")
    assert "You are terse." in provider.systems[0] and "## style — house style" in provider.systems[0]
    assert all("Added mid-run." not in s for s in provider.systems), "a skill must not change a run in flight"
    provider.replies = ["again"]
    bus.send(space, "boss", "w1", "again")
    runner.wake(w1.pk, "message")
    assert "Added mid-run." in provider.systems[-1]


def test_iteration_limit_pauses_the_member(space, scripted):
    Member.objects.filter(name="w1").update(max_iterations=3)
    scripted(*[("list_dir", {})] * 10)
    bus.send(space, "boss", "w1", "loop forever")
    assert runner.wake(w1_of(space).pk, "message") == "paused"
    assert w1_of(space).phase == "paused"
    assert space.events.filter(kind="run.paused").exists()


def test_tool_errors_are_readable_results_not_crashes(space, scripted):
    scripted(("read_file", {"path": "../../etc/passwd"}), ("no_such_tool", {}), ("read_file", {}), "ok")
    bus.send(space, "boss", "w1", "try things")
    assert runner.wake(w1_of(space).pk, "message") == "done"
    results = list(Turn.objects.filter(role="tool").order_by("seq").values_list("content", flat=True))
    assert "outside the workspace" in results[0]
    assert "unknown tool 'no_such_tool'" in results[1]
    assert "missing required argument 'path'" in results[2]


def test_default_mode_holds_a_mutating_call_until_approved(space, scripted, tmp_path, django_user_model):
    operator = django_user_model.objects.create_user("op")
    w1 = supervisor.set_permission_mode(w1_of(space), "default", actor="op")
    scripted(("write_file", {"path": "out.txt", "content": "x"}), "written")
    bus.send(space, "boss", "w1", "write it")
    assert runner.wake(w1.pk, "message") == "waiting"
    w1.refresh_from_db()
    assert w1.display_phase == "waiting-approval:write_file"
    assert not (tmp_path / "alpha" / "out.txt").exists()
    approval = Approval.objects.get()
    approvals.decide(approval, approve=True, user=operator)
    assert runner.wake(w1.pk, "resume") == "done"
    assert (tmp_path / "alpha" / "out.txt").read_text() == "x"


def test_a_denial_carries_its_reason_back_to_the_model(space, scripted, django_user_model):
    operator = django_user_model.objects.create_user("op")
    w1 = supervisor.set_permission_mode(w1_of(space), "default", actor="op")
    provider = scripted(("run_command", {"command": "rm -rf ."}), "understood")
    bus.send(space, "boss", "w1", "clean up")
    runner.wake(w1.pk, "message")
    approvals.decide(Approval.objects.get(), approve=False, user=operator, reason="never delete the workspace")
    runner.wake(w1.pk, "resume")
    last_request = provider.requests[-1]
    assert "denied" in last_request[-1]["content"] and "never delete the workspace" in last_request[-1]["content"]


def test_mail_arriving_while_waiting_for_approval_does_not_skip_the_gate(space, scripted):
    w1 = supervisor.set_permission_mode(w1_of(space), "default", actor="op")
    provider = scripted(("write_file", {"path": "a", "content": "b"}))
    bus.send(space, "boss", "w1", "write")
    runner.wake(w1.pk, "message")
    bus.send(space, "boss", "w1", "hurry up")
    assert runner.wake(w1.pk, "message") == "waiting"
    assert len(provider.systems) == 1


def test_budget_breaker_trips_alerts_and_stops_runs_that_day(space, scripted):
    Member.objects.filter(name="w1").update(budget_override=150)
    scripted(("list_dir", {}), ("list_dir", {}), "done")
    bus.send(space, "boss", "w1", "work")
    assert runner.wake(w1_of(space).pk, "message") == "budget"
    assert space.events.filter(kind="ops.alert").count() == 1
    assert Message.objects.filter(recipient_name="operator", subject__startswith="Budget tripped").exists()
    bus.send(space, "boss", "w1", "more")
    assert runner.wake(w1_of(space).pk, "message") == "budget-tripped"


@pytest.mark.parametrize("override,space_default,expected", [(100, 500, 100), (-1, 500, 0), (None, 500, 500), (None, 0, 0), (0, 300, 300)])
def test_effective_budget(space, override, space_default, expected):
    space.member_daily_tokens = space_default
    space.save()
    Member.objects.filter(name="w1").update(budget_override=override)
    assert budget.effective_budget(w1_of(space)) == expected


def test_space_ceiling_trips_every_member(space, scripted):
    space.daily_token_ceiling = 200
    space.save()
    scripted(("list_dir", {}), ("list_dir", {}), ("list_dir", {}), "done")
    bus.send(space, "boss", "w1", "work")
    assert runner.wake(w1_of(space).pk, "message") == "budget"
    assert UsageDay.objects.get(member__name="w1").tripped


def test_usage_is_metered_on_every_run(space, scripted):
    scripted(("list_dir", {}), "done")
    bus.send(space, "boss", "w1", "go")
    runner.wake(w1_of(space).pk, "message")
    day = UsageDay.objects.get(member__name="w1")
    assert (day.input_tokens, day.output_tokens, day.model_calls) == (200, 20, 2)
    assert Run.objects.get().tokens == 220


def test_suspended_run_resumes_the_same_conversation(space, scripted):
    provider = scripted(("list_dir", {}), "finished")
    w1 = w1_of(space)

    def suspend_after_first_call(call_no):
        if call_no == 1:
            supervisor.suspend(w1, actor="op")
    provider.on_call = suspend_after_first_call
    bus.send(space, "boss", "w1", "job")
    assert runner.wake(w1.pk, "message") == "aborted"
    supervisor.resume(w1, actor="op")
    provider.on_call = None
    assert runner.wake(w1.pk, "resume") == "done"
    assert provider.requests[-1][0]["content"].startswith("# Wake")  # same session, brief kept
    assert w1.sessions.count() == 1


def test_one_members_crash_does_not_touch_another(space, scripted, monkeypatch):
    scripted("fine")
    import veronica.agent.loop as loop
    real = loop.run_member
    monkeypatch.setattr(loop, "run_member", lambda m, c: (_ for _ in ()).throw(RuntimeError("boom")) if m.name == "w1" else real(m, c))
    bus.send(space, "boss", "w1", "a")
    bus.send(space, "boss", "w2", "b")
    assert runner.wake(w1_of(space).pk, "message") == "error"
    assert runner.wake(supervisor.get_member(space, "w2").pk, "message") == "done"
    assert w1_of(space).phase == "error" and w1_of(space).run_status == "idle"


def test_expired_lease_is_released_and_rewoken(space, django_capture_on_commit_callbacks, monkeypatch):
    woken = []
    from veronica.engine import failures, leases

    monkeypatch.setattr(failures, "enqueue_wake", lambda pk, source: woken.append((pk, source)))
    w1 = w1_of(space)
    Member.objects.filter(pk=w1.pk).update(run_status="busy", lease_token="dead", lease_expires_at=timezone.now() - timedelta(seconds=1))
    cut = Run.objects.create(member=w1, lease_token="dead", source="message", started_at=timezone.now())
    with django_capture_on_commit_callbacks(execute=True):
        assert leases.expire_leases() == [w1.pk]
    w1.refresh_from_db()
    assert w1.run_status == "idle" and not w1.lease_token and woken == [(w1.pk, "resume")]
    cut.refresh_from_db()
    assert cut.outcome == "lease_expired" and cut.ended_at is not None
    # the timeline links the expiry to the run it cut off
    assert space.events.get(kind="run.lease_expired").payload["run"] == cut.pk


def test_a_killed_runs_counters_are_recounted_from_its_metered_calls(space, scripted, monkeypatch):
    """SIGKILL mid-run: the counters the run kept in memory for its finish are gone; the watchdog
    recounts them from the model.called events its metering wrote (UsageDay was exact all along)."""
    from veronica.engine import failures, leases, slot

    monkeypatch.setattr(failures, "enqueue_wake", lambda pk, source: None)
    scripted(("list_dir", {}), ("list_dir", {"path": "."}), "done")
    monkeypatch.setattr(slot, "finish", lambda *a, **k: (_ for _ in ()).throw(SystemExit("killed")))  # dies before its finish
    bus.send(space, "boss", "w1", "go")
    with pytest.raises(SystemExit):
        runner.wake(w1_of(space).pk, "message")
    run = Run.objects.get(member=w1_of(space))
    assert run.model_calls == 0 and run.ended_at is None  # what a kill leaves
    Member.objects.filter(pk=run.member_id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    leases.expire_leases()
    run.refresh_from_db()
    day = UsageDay.objects.get(member=run.member)
    assert run.outcome == "lease_expired" and run.model_calls == 3 == day.model_calls
    assert run.tokens == day.input_tokens + day.output_tokens + day.cache_read_tokens + day.cache_write_tokens > 0


def test_phases_follow_the_members_events(space, scripted):
    scripted(("glob", {"pattern": "*.md"}), "done")
    bus.send(space, "boss", "w1", "go")
    runner.wake(w1_of(space).pk, "message")
    phases = [(e.payload["phase"], e.payload["tool"]) for e in space.events.filter(kind="member.phase").order_by("seq")]
    assert phases == [("thinking", ""), ("executing", "glob"), ("thinking", ""), ("ready", "")]


def test_a_fused_step_never_leaves_thinking_and_still_reports_its_call(space, scripted):
    """list_dir runs inside the model turn's transaction: nothing commits while it runs, so it has no
    phase of its own; its tool.called and tool.result commit with the turn."""
    scripted(("list_dir", {}), "done")
    bus.send(space, "boss", "w1", "go")
    runner.wake(w1_of(space).pk, "message")
    phases = [(e.payload["phase"], e.payload["tool"]) for e in space.events.filter(kind="member.phase").order_by("seq")]
    assert phases == [("thinking", ""), ("ready", "")]
    kinds = list(space.events.filter(kind__in=["model.called", "tool.called", "tool.result"]).order_by("seq").values_list("kind", flat=True))
    assert kinds == ["model.called", "tool.called", "tool.result", "model.called"]


def test_the_offline_team_finishes_the_demo_goal(db, demo_manifest):
    from veronica.portable.manifest import register
    from veronica.models import Task
    from veronica.portable.seed import DEMO_GOAL

    space = register(demo_manifest)
    bus.send(space, "operator", "leader", DEMO_GOAL)
    run_until_quiet(space)
    # the goal names data/stock.csv, which the sample workspace does not have: that task fails, honestly
    assert list(Task.objects.filter(space=space).values_list("status", flat=True)) == ["done", "done", "failed"]
    assert "FIXME" in Task.objects.get(title__startswith="Find TODO").result
    assert Message.objects.filter(space=space, recipient_name="operator", subject="Goal finished: 2 done, 1 failed").exists()
    assert blackboard.read(space).content.startswith("# Summary")


def test_listing_members_writes_nothing(space):
    from veronica.agent.tools import ToolContext, tools_for

    ctx = ToolContext(member=w1_of(space), space=space)
    listing = tools_for("worker")["list_members"].fn(ctx, {})
    assert "w1 (worker, active, ready) today 0/" in listing
    assert not UsageDay.objects.exists()


def test_an_idle_team_costs_nothing(space, monkeypatch):
    from veronica.engine import tick

    enqueued = []
    monkeypatch.setattr(tick, "enqueue_wake", lambda pk, source: enqueued.append(pk))
    summary = tick.tick()
    assert enqueued == [] and summary["swept"] == 0
    assert not Run.objects.exists() and not Wake.objects.exists()


def test_the_sweep_rewakes_idle_members_with_unread_mail_only(space, monkeypatch):
    from veronica.engine import tick

    enqueued = []
    monkeypatch.setattr(tick, "enqueue_wake", lambda pk, source: enqueued.append(pk))
    Message.objects.create(space=space, sender_name="boss", recipient=w1_of(space), recipient_name="w1", body="lost wake")
    supervisor.freeze(supervisor.get_member(space, "w2"), actor="t")
    Message.objects.create(space=space, sender_name="boss", recipient=supervisor.get_member(space, "w2"), recipient_name="w2", body="x")
    Message.objects.update(created_at=timezone.now() - timedelta(minutes=1))  # no wake came for it
    tick.tick()
    assert enqueued == [w1_of(space).pk]


def test_budget_rolls_over_at_midnight(space, scripted):
    yesterday = timezone.now().date() - timedelta(days=1)
    UsageDay.objects.create(space=space, member=w1_of(space), day=yesterday, input_tokens=10**9, tripped=True)
    Member.objects.filter(name="w1").update(budget_override=1000)
    scripted("fresh day")
    bus.send(space, "boss", "w1", "morning")
    assert runner.wake(w1_of(space).pk, "message") == "done"


def test_demo_command_finishes_the_scenario_from_a_fresh_database_in_under_a_minute(db):
    import io
    import time

    from django.core.management import call_command

    out = io.StringIO()
    started = time.monotonic()
    call_command("demo", stdout=out)
    assert time.monotonic() - started < 60
    text = out.getvalue()
    tasks = [line for line in text.splitlines() if line.startswith("  #") and "] " in line]
    assert len(tasks) == 3 and [line.split("]")[0].split("[")[1] for line in tasks] == ["done", "done", "failed"]
    assert "could not read file data/stock.csv" in text
    assert "lead → operator: Goal finished: 2 done, 1 failed" in text and "Demo finished" in text


def test_cron_tick_fires_each_slot_once_and_skips_frozen(space, monkeypatch):
    from veronica.engine import tick

    enqueued = []
    monkeypatch.setattr(tick, "enqueue_wake", lambda pk, source: enqueued.append((pk, source)))
    w1 = supervisor.set_schedule(w1_of(space), "*/5 * * * *", actor="t")
    w2 = supervisor.set_schedule(supervisor.freeze(supervisor.get_member(space, "w2"), actor="t"), "*/5 * * * *", actor="t")
    Member.objects.filter(pk__in=[w1.pk, w2.pk]).update(schedule_next_at=timezone.now() - timedelta(seconds=1))
    tick.fire_cron()
    tick.fire_cron()
    assert enqueued == [(w1.pk, "timer")]
    assert Member.objects.get(pk=w1.pk).schedule_next_at > timezone.now()


def test_a_member_waiting_for_approval_is_not_rewoken_by_its_own_mail(space, scripted, monkeypatch):
    from veronica.engine import tick

    from veronica.engine import wakes

    enqueued = []
    monkeypatch.setattr(wakes, "enqueue_wake", lambda pk, source: enqueued.append(pk))  # the run's own re-wake at finish
    monkeypatch.setattr(tick, "enqueue_wake", lambda pk, source: enqueued.append(pk))
    w1 = supervisor.set_permission_mode(w1_of(space), "default", actor="op")
    scripted(("write_file", {"path": "a", "content": "b"}))
    bus.send(space, "boss", "w1", "write")
    runner.wake(w1.pk, "message")
    bus.send(space, "boss", "w1", "more mail while waiting")
    assert runner.wake(w1.pk, "message") == "waiting"
    tick.sweep_unread()
    assert enqueued == [], "a waiting member must not spin on wakes"


def test_the_turns_input_is_the_whole_prompt_cached_tokens_included(space, scripted):
    """The member view's context pressure reads Turn.input_tokens: a prompt mostly served from the
    vendor's cache is still that long (Anthropic and OpenAI report cached tokens apart)."""
    from veronica.agent.providers.base import Reply, Usage

    scripted(Reply(text="ok", usage=Usage(input=40, output=5, cache_read=900, cache_write=60)))
    bus.send(space, "boss", "w1", "hi")
    assert runner.wake(w1_of(space).pk, "message") == "done"
    turn = Turn.objects.get(role="assistant")
    assert turn.input_tokens == 1000 and turn.tokens == 1005


def test_a_stop_read_by_a_fused_steps_fence_runs_no_call_but_keeps_the_turn(space, scripted, monkeypatch):
    """The fence of a fused step reads the cancel flag first: the model's turn and its usage commit,
    the call does not run (the next run finds it dangling and re-runs it: it only reads)."""
    from pathlib import Path

    from veronica.agent.tools import workspace
    from veronica.models import Member, Turn, UsageDay

    Path(space.workdir, "a.txt").write_text("a\n")
    ran = []
    tool = next(t for t in workspace.TOOLS if t.name == "read_file")
    real = tool.fn
    monkeypatch.setattr(tool, "fn", lambda ctx, args: (ran.append(args), real(ctx, args))[1])
    provider = scripted(("read_file", {"path": "a.txt"}), "done")
    w1 = w1_of(space)
    provider.on_call = lambda n: n == 1 and Member.objects.filter(pk=w1.pk).update(cancel_requested=True)
    bus.send(space, "boss", "w1", "go")
    assert runner.wake(w1.pk, "message") == "aborted"
    assert ran == [] and list(Turn.objects.filter(role="assistant").values_list("tool_calls", flat=True))[0][0]["name"] == "read_file"
    assert not Turn.objects.filter(role="tool").exists() and UsageDay.objects.get(member=w1).model_calls == 1
    assert runner.wake(w1.pk, "resume") == "done" and len(ran) == 1
