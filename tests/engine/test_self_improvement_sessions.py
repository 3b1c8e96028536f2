"""Issue 24: the demo team's model calls fall round over round with long-lived sessions too (no
session cleared between rounds: each round is a new episode of the same sessions)."""
from django.db.models import Sum

from veronica.swarm import bus
from veronica.engine.drive import run_until_quiet
from veronica.portable.manifest import register
from veronica.models import Run, Space
from veronica.portable.seed import DEMO_GOAL


def _round(space: Space) -> int:
    first = Run.objects.order_by("-id").values_list("id", flat=True).first() or 0
    bus.send(space, "operator", "leader", DEMO_GOAL)
    run_until_quiet(space)
    return Run.objects.filter(pk__gt=first).aggregate(n=Sum("model_calls"))["n"]


def test_the_demo_team_needs_fewer_model_calls_round_over_round_in_long_lived_sessions(db, demo_manifest):
    space = register(demo_manifest)
    calls = [_round(space) for _ in range(3)]
    print("model calls per round:", calls)
    assert calls[1] < calls[0] and calls[2] < calls[1], calls
    assert space.events.filter(kind="waggle.replayed").exists()
