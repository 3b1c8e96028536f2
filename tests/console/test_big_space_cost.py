"""Big spaces stay fast (issue 25.4), at test size: every page of a space, GET /api/spaces/, the events API
(the timeline) and the socket's replay run the same number of queries with a few rows and with a hundred
times more events, tasks, messages per member, and more members. bench/fleet_scale.py measures the same
pages at 1,000,000 events / 100,000 tasks / 50 x 10,000 messages, with their p99 on PostgreSQL."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from bench.fleet_scale import measure_pages, pages_of, seed_big
from tests.console.conftest import make_space
from veronica.engine import supervisor
from veronica.models import Run, Task

pytestmark = pytest.mark.django_db


def test_every_page_of_a_space_costs_the_same_queries_as_it_grows(tmp_path, client, settings):
    space = make_space(tmp_path, "big", workers=("w1", "w2"))
    members = list(space.members.order_by("id"))
    Run.objects.create(member=members[1], source="message", lease_token="t", started_at=timezone.now(), ended_at=timezone.now(),
                       outcome="done", steps=2)
    client.force_login(User.objects.create_user("admin", is_staff=True, is_superuser=True))
    have = seed_big(space, members, 30, 20, 5, {"events": space.event_seq, "tasks": 0, "messages_per_member": 0})
    space.refresh_from_db()
    pages = pages_of(space, members[1], Task.objects.filter(space=space).first(), Run.objects.get())
    measure_pages(client, pages, 0)  # warm what is cached per process (content types, templates)
    small = measure_pages(client, pages, 0)
    members += [supervisor.add_member(space, f"x{i}", actor="test") for i in range(8)]
    Run.objects.bulk_create(Run(member=m, source="message", lease_token="t", started_at=timezone.now(), ended_at=timezone.now(),
                                outcome="done") for m in members for _ in range(5))
    seed_big(space, members, 3000, 2000, 500, have)
    space.refresh_from_db()
    big = measure_pages(client, pages, 0)
    grew = {name: (small[name]["queries"], big[name]["queries"]) for name in pages if small[name]["queries"] != big[name]["queries"]}
    assert not grew, f"pages whose queries grew with the space (small, big): {grew}"
