"""Run the demo scenario headless, in-process, to the end, and print what happened."""
from __future__ import annotations

import time

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db.models import Sum

from veronica.swarm import audit, blackboard, bus
from veronica.engine import supervisor
from veronica.engine.drive import run_until_quiet
from veronica.portable.manifest import register
from veronica.models import Message, Run, Task, UsageDay
from veronica.portable.seed import DEMO_GOAL
from veronica.portable.startup import ensure_demo_space


class Command(BaseCommand):
    help = "Run the offline demo team over the sample workspace to the end and print tasks, messages and tokens."

    def add_arguments(self, parser):
        parser.add_argument("--goal", default=DEMO_GOAL)
        parser.add_argument("--rounds", type=int, default=1, help="Run the goal N times (clearing sessions in between).")

    @audit.as_command  # what it changes is the OS user's, via command
    def handle(self, *args, goal: str, rounds: int, **options):
        settings.WAGGLE = {**settings.WAGGLE, "sweep_async": False}  # no cluster here: mine inline
        started = time.monotonic()
        call_command("migrate", interactive=False, verbosity=0)  # a fresh data folder has no tables yet
        space = ensure_demo_space()  # its own copy under the data folder, never the checkout
        space = register(space.manifest_path, fresh=True, actor="demo", own=True, slug=space.slug)  # the manifest as written
        for round_no in range(1, rounds + 1):
            first_run = Run.objects.order_by("-id").values_list("id", flat=True).first() or 0
            bus.send(space, bus.OPERATOR, "leader", goal, subject=f"Goal (round {round_no})")
            wakes = run_until_quiet(space, timeout=120)
            calls = Run.objects.filter(pk__gt=first_run, member__space=space).aggregate(n=Sum("model_calls"))["n"] or 0
            self.stdout.write(self.style.MIGRATE_HEADING(f"\nRound {round_no}: {wakes} wakes, {calls} model calls"))
            for member in space.members.filter(removed_at__isnull=True):
                supervisor.clear_session(member, actor="demo")
        self.report(space)
        self.stdout.write(self.style.SUCCESS(f"\nDemo finished in {time.monotonic() - started:.1f}s"))

    def report(self, space) -> None:
        out = self.stdout
        out.write(self.style.MIGRATE_HEADING("\nTasks"))
        for task in Task.objects.filter(space=space).select_related("assignee").order_by("id"):
            out.write(f"  #{task.pk} [{task.status}] {task.title} → {task.assignee.name if task.assignee else '-'}")
            for line in task.result.splitlines()[:6]:
                out.write(f"      {line}")
        out.write(self.style.MIGRATE_HEADING("\nMessages"))
        for msg in Message.objects.filter(space=space).order_by("id"):
            out.write(f"  {msg.sender_name} → {msg.recipient_name}: {msg.subject or msg.body.splitlines()[0][:70]}")
        out.write(self.style.MIGRATE_HEADING("\nBlackboard"))
        board = blackboard.read(space)
        out.write("  " + (board.content.replace("\n", "\n  ") or "(empty)"))
        out.write(self.style.MIGRATE_HEADING("\nTokens (estimated by the offline provider)"))
        for row in UsageDay.objects.filter(space=space).select_related("member").order_by("member__name"):
            out.write(f"  {row.member.name:10} in {row.input_tokens:>8}  out {row.output_tokens:>6}  calls {row.model_calls}")
