"""Many runs per worker process (issue 25.1) on the real django-q2 cluster, in both modes: one worker
process runs many members at once against the mock vendor's HTTP, its one heartbeat keeps all their
leases, its runs share a few database connections, and lease, fence and kill recovery hold per run."""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
from django.db import close_old_connections, connection, transaction
from django.db.models import F, Sum

from tests.conftest import make_space
from tests.harness import isolate_queue, kill_cluster, qcluster, wait_for
from tests.vendors.faults import tokens
from tests.vendors.mock_openai import MockOpenAI
from veronica.agent.providers import gateway
from veronica.swarm import bus
from veronica.engine import supervisor, tick
from veronica.models import Member, Message, Run, RunOutcome, Turn, UsageDay

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

STEPS = 3  # model calls per run: two list_dir calls, then "done"


@pytest.fixture(autouse=True)
def own_queue():
    isolate_queue()
    yield
    close_old_connections()


def fleet_space(tmp_path, n: int) -> list[Member]:
    names = tuple(f"m{i}" for i in range(n))
    space = make_space(tmp_path, workers=names)
    Member.objects.filter(space=space, name__in=names).update(model="openai:gpt-4.1-mini")
    return list(Member.objects.filter(space=space, name__in=names).order_by("pk"))


def mail_all(members: list[Member]) -> None:
    with transaction.atomic():  # every wake is enqueued at the one commit
        for m in members:
            bus.send(m.space, "boss", m.name, "list the folder, then say done")


def answered(members: list[Member]) -> bool:
    close_old_connections()
    ids = [m.pk for m in members]
    done = Turn.objects.filter(session__member_id__in=ids, role="assistant", content="done").values("session__member_id").distinct()
    return done.count() == len(ids) and not Member.objects.filter(pk__in=ids).exclude(lease_token="").exists()


def ticking(predicate, timeout: float, message: str):
    """Wait while running the engine tick (the new cluster's ticker takes the role only when the old one's runs out)."""
    def step():
        close_old_connections()
        tick.tick()
        return predicate()
    return wait_for(step, timeout, interval=0.5, message=message)


def in_flight(members: list[Member]) -> int:
    close_old_connections()
    return Run.objects.filter(member__in=members, ended_at__isnull=True).count()


def peak_overlap(members: list[Member]) -> int:
    points = []
    for start, end in Run.objects.filter(member__in=members).values_list("started_at", "ended_at"):
        points += [(start, 1), (end, -1)]
    peak = running = 0
    for _, delta in sorted(points, key=lambda p: (p[0], p[1])):
        running += delta
        peak = max(peak, running)
    return peak


def assert_one_answer_each_and_no_overlap(members: list[Member]) -> None:
    close_old_connections()
    for m in members:
        assert Turn.objects.filter(session__member=m, role="assistant").count() == STEPS, f"{m.name} answered twice or not at all"
        assert not Message.objects.filter(recipient=m, read_at__isnull=True).exists()
        runs = list(Run.objects.filter(member=m).order_by("started_at").values_list("started_at", "ended_at"))
        for (_, prev_end), (start, _) in zip(runs, runs[1:]):
            assert prev_end is not None and start >= prev_end, f"two runs of {m.name} overlapped"


class ConnectionSampler(threading.Thread):
    """The most connections the cluster held to this database at once (PostgreSQL)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.most, self.running = 0, True

    def run(self) -> None:
        try:
            while self.running:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
                    self.most = max(self.most, cursor.fetchone()[0])
                time.sleep(0.1)
        finally:
            connection.close()


def test_one_worker_process_runs_many_members_at_once_on_few_connections(tmp_path):
    """Twelve members, one q2 worker process: before, they ran one after another; now all at once.
    Each run (3 calls of 2 s) outlasts the 3 s lease: only the process's heartbeat keeps them."""
    members = fleet_space(tmp_path, 12)
    hosted = connection.vendor == "postgresql"
    sampler = ConnectionSampler() if hosted else None
    with MockOpenAI(api_key="sk-fleet") as mock:
        mock.configure(latency=2.0, steps=STEPS)
        with qcluster(workers=1, OPENAI_BASE_URL=mock.base_url, OPENAI_API_KEY="sk-fleet", VERONICA_RUNS_PER_WORKER="16",
                      VERONICA_DB_POOL_SIZE="2", VERONICA_RUN_LEASE_SECONDS="3"):
            mail_all(members)
            wait_for(lambda: in_flight(members) == len(members), 60, interval=0.1, message="every member running at once")
            if sampler:
                sampler.start()
            wait_for(lambda: answered(members), 120, message="every member answered")
            if sampler:
                sampler.running = False
                sampler.join(5)
    close_old_connections()
    assert peak_overlap(members) == len(members)
    assert not Run.objects.filter(member__in=members, outcome=RunOutcome.LEASE_EXPIRED).exists(), "a live run lost its lease"
    assert Run.objects.filter(member__in=members, outcome=RunOutcome.DONE).count() == len(members)
    assert_one_answer_each_and_no_overlap(members)
    if sampler:
        # 12 runs waiting on their model share the worker's pool of 2; the rest are the cluster's own
        # processes (main, monitor, ticker): far fewer than one connection per waiting run.
        assert sampler.most < len(members), f"{sampler.most} connections for {len(members)} waiting runs"


def test_wakes_fetched_together_reach_a_worker_in_one_task_and_those_it_has_no_room_for_wait_for_a_slot(tmp_path):
    """Twelve wakes queued before the cluster starts: its pusher's first fetch takes them all. Hosted, they
    reach the one worker as one q2 task (runner.wake_all); its pool of 8 starts eight, hands the other four
    back to the broker's head, and the host, full, fetches them again as slots free. Every member answers
    once, no more than 8 run at once, and no two runs of one member overlap."""
    members = fleet_space(tmp_path, 12)
    log_path = tmp_path / "cluster.log"
    with MockOpenAI(api_key="sk-fleet") as mock:
        mock.configure(latency=1.0, steps=STEPS)
        mail_all(members)  # queued while no worker runs
        with qcluster(workers=1, log_path=log_path, OPENAI_BASE_URL=mock.base_url, OPENAI_API_KEY="sk-fleet",
                      VERONICA_RUNS_PER_WORKER="8", VERONICA_DB_POOL_SIZE="2"):
            wait_for(lambda: answered(members), 120, message="every member answered")
    close_old_connections()
    assert_one_answer_each_and_no_overlap(members)
    assert peak_overlap(members) <= 8
    if connection.vendor == "postgresql":
        log = log_path.read_text()
        assert "'veronica.engine.runner.wake_all'" in log, "the queued wakes did not reach the worker together"
        assert "handed back: every run slot of this worker stayed busy" in log


def test_a_killed_worker_with_many_runs_loses_none_and_no_member_runs_twice_at_once(tmp_path):
    members = fleet_space(tmp_path, 6)
    with MockOpenAI(api_key="sk-fleet") as mock:
        mock.configure(latency=2.0, steps=STEPS)
        env = dict(OPENAI_BASE_URL=mock.base_url, OPENAI_API_KEY="sk-fleet", VERONICA_RUN_LEASE_SECONDS="3")
        with qcluster(workers=1, **env) as proc:
            mail_all(members)
            wait_for(lambda: in_flight(members) == len(members), 60, interval=0.1, message="every member running at once")
            kill_cluster(proc)  # the one worker process, all its runs with it
        with qcluster(workers=1, **env):  # the tick's watchdog expires the leases and re-wakes
            ticking(lambda: answered(members), 120, message="every member answered after the crash")
    close_old_connections()
    assert Run.objects.filter(member__in=members, outcome=RunOutcome.LEASE_EXPIRED).count() == len(members)
    assert_one_answer_each_and_no_overlap(members)


def test_a_worker_killed_mid_call_costs_its_runs_no_model_call_again(tmp_path):
    """Six runs wait on their first model call in one worker; SIGKILL that worker alone. The calls go on
    in the host's model gateway (veronica.agent.providers.gateway); the sentinel's replacement worker ends
    the dead one's leases and resumes them; each resume sends its cut run's request again, unchanged,
    and takes over the call still in flight: the vendor answers 6 x 3 calls, not one more."""
    members = fleet_space(tmp_path, 6)
    with MockOpenAI(api_key="sk-fleet") as mock:
        mock.configure(latency=2.0, steps=STEPS)
        with qcluster(workers=1, OPENAI_BASE_URL=mock.base_url, OPENAI_API_KEY="sk-fleet",
                      VERONICA_RUN_LEASE_SECONDS="3") as proc:
            mail_all(members)
            wait_for(lambda: len(mock.model_requests()) == len(members), 60, interval=0.05, message="six first calls in flight")
            os.kill(q2_worker(proc.pid), signal.SIGKILL)
            ticking(lambda: answered(members), 120, message="every member answered after the worker died")
        requests = mock.model_requests()
    served = len(requests)
    close_old_connections()
    assert Run.objects.filter(member__in=members, outcome=RunOutcome.LEASE_EXPIRED).count() == len(members)
    assert_one_answer_each_and_no_overlap(members)
    assert served == len(members) * STEPS, f"{served - len(members) * STEPS} model calls made again after the kill"
    # every answer booked once, by the run that stored it: the day's ledger and the runs' counters hold
    # the calls the vendor answered and the prompt tokens it counted, none lost with the dead worker, none twice
    booked = UsageDay.objects.filter(member__in=members).aggregate(
        calls=Sum("model_calls"), prompt=Sum(F("input_tokens") + F("cache_read_tokens")))
    counted = Run.objects.filter(member__in=members).aggregate(calls=Sum("model_calls"))
    prompted = sum(tokens(json.dumps({"tools": r.body.get("tools"), "messages": r.body.get("messages")}, sort_keys=True))
                   for r in requests)  # (as the mock counts a prompt: tests.vendors.mock_openai.usage_for)
    assert booked == {"calls": served, "prompt": prompted} and counted["calls"] == served


def q2_worker(main_pid: int) -> int:
    """The q2 worker of a one-worker cluster: the sentinel (the main process's child) forks its model
    gateway, then the worker, then the monitor and the pusher."""
    (sentinel,) = children(main_pid)
    return [pid for pid in children(sentinel) if not gateway_argv(pid)][0]


def model_gateway(main_pid: int) -> tuple[int, str] | None:
    """The cluster's model gateway process and its socket path (its last argument), if it runs."""
    (sentinel,) = children(main_pid)
    found = [(pid, argv[-1]) for pid in children(sentinel) if (argv := gateway_argv(pid))]
    return found[0] if found else None


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid and stat[0] not in ("Z", "X"):
                found.append(int(entry))
    return sorted(found)


def gateway_argv(pid: int) -> list[str]:
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().decode().split("\0")
    except OSError:
        return []
    return [a for a in argv if a] if "veronica.agent.providers.gateway" in argv else []


def test_a_dead_model_gateway_is_started_again_and_the_workers_calls_reach_the_new_one(tmp_path):
    """The host's gateway SIGKILLed (the OOM killer's pick, a bug): the sentinel starts a new one on the
    same socket at its next guard cycle, and the worker's next calls go through it (its connection to
    the dead one, kept alive, is replaced), not straight to the vendor: the new gateway counts them."""
    (member,) = fleet_space(tmp_path, 1)
    log = tmp_path / "cluster.log"

    def answers(n: int) -> bool:
        close_old_connections()
        return Turn.objects.filter(session__member=member, role="assistant", content="done").count() == n and \
            not Member.objects.filter(pk=member.pk).exclude(lease_token="").exists()

    with MockOpenAI(api_key="sk-fleet") as mock:
        mock.configure(latency=0.0, steps=STEPS)
        with qcluster(workers=1, log_path=log, OPENAI_BASE_URL=mock.base_url, OPENAI_API_KEY="sk-fleet") as proc:
            mail_all([member])
            ticking(lambda: answers(1), 60, message="the member answered through the first gateway")
            first, path = model_gateway(proc.pid)
            os.kill(first, signal.SIGKILL)
            wait_for(lambda: (model_gateway(proc.pid) or (first,))[0] != first and gateway.answers(path), 30,
                     interval=0.1, message="a new model gateway on the same socket")
            mail_all([member])
            ticking(lambda: answers(2), 60, message="the member answered again")
        served = len(mock.model_requests())
    lines = log.read_text().splitlines()
    assert any("starting a new one" in line for line in lines)
    stats = [line for line in lines if "model gateway: {" in line]  # (the killed one logged none)
    assert served == 2 * STEPS and len(stats) == 1 and f"'calls': {STEPS}," in stats[0], stats


def test_a_paused_worker_with_many_runs_writes_nothing_for_any_of_them(tmp_path):
    """SIGSTOP past the lease with six runs in their model calls; another cluster answers them all;
    SIGCONT: the process's heartbeat finds every lease gone and each run stops, writing nothing."""
    members = fleet_space(tmp_path, 6)
    log = tmp_path / "paused.log"
    with MockOpenAI(api_key="sk-fleet") as mock:
        mock.configure(latency=120.0, steps=STEPS)  # the paused runs' calls do not come back on their own
        env = dict(OPENAI_BASE_URL=mock.base_url, OPENAI_API_KEY="sk-fleet", VERONICA_RUN_LEASE_SECONDS="3")
        with qcluster(workers=1, log_path=log, **env) as paused:
            mail_all(members)
            wait_for(lambda: len(mock.model_requests()) == len(members), 60, interval=0.1, message="six calls in flight")
            os.killpg(paused.pid, signal.SIGSTOP)
            try:
                mock.configure(latency=0.2)
                with qcluster(workers=1, **env):
                    ticking(lambda: answered(members), 120, message="the other cluster answered every member")
                before = written(members)
                os.killpg(paused.pid, signal.SIGCONT)
                wait_for(lambda: log.read_text().count("lost its lease") >= len(members) or written(members) != before, 30,
                         message="the paused runs to go on after SIGCONT")
                time.sleep(1)
            finally:
                os.killpg(paused.pid, signal.SIGCONT)
    assert written(members) == before, "a paused run wrote after it lost its lease"
    assert log.read_text().count("lost its lease") == len(members)
    assert_one_answer_each_and_no_overlap(members)


def written(members: list[Member]) -> tuple:
    close_old_connections()
    return (list(Turn.objects.filter(session__member__in=members).order_by("id").values_list("id", "role", "content")),
            list(Member.objects.filter(pk__in=[m.pk for m in members]).order_by("pk").values_list(
                "phase", "phase_since", "run_status", "lease_token")),
            list(Run.objects.filter(member__in=members).order_by("id").values_list("outcome", "ended_at")))



def test_approved_commands_cut_off_by_a_crash_in_a_shared_worker_are_never_run_twice(tmp_path, django_user_model):
    """Six members' approved commands run at once in one worker process; the cluster is SIGKILLed while
    they run (their effect done, their results not yet written); after the leases run out each member
    is told its call was interrupted and none is run again."""
    from veronica.engine import approvals
    from veronica.models import Approval

    operator = django_user_model.objects.create_user("op")
    members = fleet_space(tmp_path, 6)
    for m in members:
        supervisor.set_permission_mode(m, "default", actor="op")
    log = tmp_path / "alpha" / "effects.txt"
    with MockOpenAI(api_key="sk-fleet") as mock:
        mock.configure(latency=0.2, steps=2, tool="run_command", args={"command": "echo once >> effects.txt; sleep 60"})
        env = dict(OPENAI_BASE_URL=mock.base_url, OPENAI_API_KEY="sk-fleet", VERONICA_RUN_LEASE_SECONDS="3",
                   VERONICA_COMMAND_SANDBOX="none")
        with qcluster(workers=1, **env) as proc:
            mail_all(members)
            wait_for(lambda: Approval.objects.filter(member__in=members).count() == len(members), 60, message="six held calls")
            for approval in Approval.objects.filter(member__in=members):
                approvals.decide(approval, approve=True, user=operator)
            wait_for(lambda: log.exists() and log.read_text().count("once") == len(members) and in_flight(members) == len(members),
                     60, interval=0.1, message="six approved commands running at once")
            kill_cluster(proc)
        with qcluster(workers=1, **env):
            ticking(lambda: answered(members), 120, message="every member answered after the crash")
    close_old_connections()
    assert log.read_text().count("once") == len(members), "an approved command ran twice"
    for m in members:
        results = list(Turn.objects.filter(session__member=m, role="tool").values_list("content", flat=True))
        assert len(results) == 1 and "interrupted while it ran" in results[0] and "not run again" in results[0]
    assert all(a.consumed for a in Approval.objects.filter(member__in=members))
