"""A fleet of members running at once, embedded (SQLite) and hosted (PostgreSQL + Redis): issue 25.

Per mode, against a mock OpenAI-compatible vendor in its own process whose every call takes
`--latency` seconds and whose conversations are scripted to `--steps` calls (list_dir tool calls,
then "done"), with real `manage.py qcluster` processes:

1. Many runs per worker: `--members` members each get one message in one commit (t0); every member
   then makes `--steps` calls, so the ideal schedule (all of them at once from t0) ends at
   steps x latency. Printed: peak members running at once (from the Run rows), completion (last run's
   end - t0) over the ideal, total RSS of the cluster's processes (sampled; every q2 process, the
   sentinel and monitor included), peak PostgreSQL connections to the bench's database (hosted),
   lost (members without their final answer, or with unread mail, after the drain) and overlapping
   runs of one member. The plain case runs `--repeat` times (3) on fresh members, and its figures are
   the median run's (every run's ratio is printed; RSS and connections are the most, lost and overlaps
   the sum): this host's speed varies by up to +-25 % between identical runs. Then the same again with one q2 worker SIGKILLed mid-way (its sentinel forks a
   replacement, which ends the leases the dead one held as it spawns, veronica.engine.holders, and
   takes their members' resumes; the task queue's read lock a killed worker held is given back at
   once, veronica.engine.qguard), and again with the workers split over two hosts (qcluster process
   groups) and one host SIGKILLed mid-way and started again on the same machine: as it starts it ends
   the leases its dead predecessor held. (A host dead for good on another machine still costs its
   runs the lease.) The kill cases print a second ratio, against the ideal schedule with that fault
   as it is without a model gateway (VERONICA_MODEL_GATEWAY=0): the model calls in flight in the killed
   process are lost, so the ideal is the kill's moment plus, for a member started at t0, the calls it
   had not had answered by then. With the gateway (the default) a killed worker's calls go on and its
   resumed runs take them over (the gateway's counts: calls made, orphaned, taken over), so the worker
   kill is judged against the plain ideal; a killed host's gateway dies with it, as its calls did.
5. Worker memory: a one-worker cluster that is never recycled (VERONICA_Q_RECYCLE), a zero-latency model, `--mem-members` members each re-mailed
   (its session cleared) as soon as it is idle, until the vendor has answered `--mem-steps` calls:
   the cluster's RSS after 1,000 steps and at the end, and the growth in percent.
2-4 (idle members, the tick, big spaces) come from bench/fleet_scale.py when it is there.

The 1-minute load average is printed beside every figure (the host is shared).
Usage: .venv/bin/python bench/fleet.py [--modes embedded,hosted] [--members 500] [--latency 2] [--steps 5]
       [--workers 2] [--runs-per-worker 256] [--lease 10] [--mem-steps 100000] [--skip-kill] [--skip-memory] [--skip-scale]
       [--cases run,kill,host_kill] [--repeat 3]
The worker-kill case also prints its resumes' timeline (the reap, their claims, first replies, ends); with
BENCH_PYSPY=path it profiles the replacement worker (profile_replacement).
The last line is one JSON object: the issue's figures (the hosted run's, the goals' mode) and both modes'.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._setup import REPO, QCluster, isolated_env  # noqa: E402

GOALS = {"completion_ratio_to_ideal": "<= 1.2", "worker_rss_mb": "<= 2048", "pg_connections_max": "<= 50", "lost": "= 0",
         "overlaps": "= 0", "rss_growth_pct": "<= 10"}


def load() -> str:
    return f"load {os.getloadavg()[0]:.1f}/{os.cpu_count()} CPUs"


# --- processes ----------------------------------------------------------------------------------

def host_cpu() -> tuple[float, float]:
    """The whole host's CPU seconds since boot, busy and in all (/proc/stat's first line: idle and
    iowait are the only idle ones), summed over its cores."""
    with open("/proc/stat") as fh:
        user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in fh.readline().split()[1:9])
    busy = user + nice + system + irq + softirq + steal
    return busy / TICK, (busy + idle + iowait) / TICK


def rss_mb(pgid: int) -> float:
    return rss_of(pgid, scan())


def rss_of(pgid: int, procs: dict) -> float:
    """The RSS of a process group (a qcluster and every process it forked), in MB."""
    return sum(rss for _, group, _, rss in procs.values() if group == pgid)


TICK = os.sysconf("SC_CLK_TCK")
PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20


def scan() -> dict[int, tuple[int, int, float, float]]:
    """Every process: pid -> (parent pid, process group, CPU seconds used so far, RSS in MB), from one
    read of /proc/<pid>/stat each (the sampler runs beside what it measures: it must stay cheap)."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    fields = fh.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            found[int(entry)] = (int(fields[1]), int(fields[2]), (int(fields[11]) + int(fields[12])) / TICK,
                                 int(fields[21]) * PAGE_MB)
    return found


def scan_one(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as fh:
        fields = fh.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def cluster_roles(pgid: int, procs: dict) -> dict[int, str]:
    """The roles of a qcluster's processes (q2 names none without setproctitle): the main process
    leads the group, the sentinel is its child, and the sentinel forks the workers first, then the
    monitor, then the pusher (a worker it forks later, for a dead one, is named by the sampler)."""
    parents = {pid: ppid for pid, (ppid, group, _, _) in procs.items() if group == pgid}
    roles = {pgid: "main"}
    for sentinel in [pid for pid, parent in parents.items() if parent == pgid]:
        roles[sentinel] = "sentinel"
        children = sorted(pid for pid, parent in parents.items() if parent == sentinel)
        for pid in [pid for pid in children if is_gateway(pid)]:  # started before the workers
            roles[pid] = "gateway"
            children.remove(pid)
        for pid in children:
            roles[pid] = "worker"
        if len(children) >= 2:
            roles[children[-2]], roles[children[-1]] = "monitor", "pusher"
    return roles


def is_gateway(pid: int) -> bool:
    """The host's model gateway (veronica.agent.providers.gateway), a process of its own."""
    try:
        return b"veronica.agent.providers.gateway" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def start_cluster(env: dict, log: Path) -> QCluster:
    """A host of the fleet: up and running before the mail goes out."""
    return QCluster(env, log, wait_running=True, grace=20)


class Mock:
    """The mock vendor in a process of its own (its threads never compete with the bench's)."""

    def __init__(self, latency: float, steps: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.vendors.mock_openai", "--port", "0", "--key", "sk-fleet",
                                      "--latency", str(latency), "--steps", str(steps), "--lean"], cwd=REPO,
                                     stdout=subprocess.PIPE, text=True, start_new_session=True)
        self.root = self.proc.stdout.readline().strip()

    def served(self) -> int:
        return self.stats()["served"]

    def stats(self) -> dict:
        import urllib.request

        with urllib.request.urlopen(self.root + "/_mock/served", timeout=10) as response:
            return json.load(response)

    def arrivals(self) -> list[tuple[float, int]]:
        """(wall-clock time, tool results in its conversation) of each model request as it arrived."""
        import urllib.request

        with urllib.request.urlopen(self.root + "/_mock/arrivals", timeout=30) as response:
            return [tuple(pair) for pair in json.load(response)["arrivals"]]

    def lateness(self) -> str:
        """How late the mock itself started its answers, past the scripted latency (its own load)."""
        stats = self.stats()
        return f"{stats['served']} calls, late {stats['late_mean'] * 1000:.0f} ms mean, {stats['late_max'] * 1000:.0f} ms max"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


class Sampler(threading.Thread):
    """Every half second: the cluster's RSS, (hosted) the bench database's connections, and the CPU
    seconds each part used (the workers, q2's pusher, monitor and sentinel, the mock vendor, the
    database's backends, this process): where a fleet's time goes on a host of two cores."""

    def __init__(self, clusters: list[QCluster], hosted: bool, mock: Mock | None = None) -> None:
        super().__init__(daemon=True)
        self.clusters, self.hosted, self.mock = clusters, hosted, mock
        self.rss_max = self.pg_max = 0.0
        self.running = True
        self.roles: dict[int, str] = {}  # pid -> role, named at first sight
        self.first: dict[int, float] = {}  # pid -> its CPU seconds when first seen (0 for one born meanwhile)
        self.last: dict[int, float] = {}
        self.lock = threading.Lock()  # rebase() runs on the bench's thread
        self.timeline: list[tuple[float, dict[str, float]]] = []  # (wall time, cpu()) at each sample after rebase()
        self.host: list[tuple[float, float, float]] = []  # (wall time, *host_cpu()) at each sample after rebase()
        self.sample_cpu(self.backends(), initial=True)

    def backends(self) -> list[int]:
        """The database's server processes serving the bench's database (hosted), this thread's own left out."""
        from django.db import connection

        if not self.hosted:
            return []
        with connection.cursor() as cursor:
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
            return [row[0] for row in cursor.fetchall()]

    def sample_cpu(self, backends: list[int], initial: bool = False) -> None:
        procs = scan()
        with self.lock:
            self._note(procs, backends, initial)

    def _note(self, procs: dict, backends: list[int], initial: bool) -> None:
        named = {}
        for cluster in self.clusters:
            if cluster.proc.poll() is None:
                for pid, role in cluster_roles(cluster.proc.pid, procs).items():
                    # forked later by a sentinel already known: a worker replacing a dead or recycled one
                    late = not initial and role in ("monitor", "pusher") and procs[pid][0] in self.roles
                    named[pid] = "worker" if late else role
        self.rss_max = max(self.rss_max, sum(rss_of(cluster.proc.pid, procs) for cluster in self.clusters
                                             if cluster.proc.poll() is None))
        if self.mock is not None:
            named[self.mock.proc.pid] = "mock vendor"
        named[os.getpid()] = "bench"
        for pid in backends:
            named[pid] = "postgres"
        for pid, role in named.items():
            if pid not in procs:
                continue
            if pid not in self.roles:
                self.roles[pid] = role
                self.first[pid] = procs[pid][2] if initial else 0.0
            self.last[pid] = procs[pid][2]

    def rebase(self) -> dict[str, float]:
        """From now on CPU counts from here (t0: the mail is out); returns the CPU used until now. The
        500 messages mailed in one transaction before t0 cost the bench and PostgreSQL a few CPU
        seconds that no run waits for: counted in, they read as ~1 ms of host CPU per model call."""
        procs = scan()
        with self.lock:
            for pid in self.roles:
                if pid in procs:
                    self.last[pid] = procs[pid][2]
            before = self.cpu()
            self.first.update(self.last)
            self.timeline = [(time.time(), {})]
            self.host = [(time.time(), *host_cpu())]
        return before

    def cpu_until(self, moment: float) -> tuple[float, dict[str, float]]:
        """The first sample at or after moment (wall time): when it was taken, and the CPU seconds per role
        from the rebase to it."""
        with self.lock:
            return next(((at, used) for at, used in self.timeline if at >= moment), (time.time(), self.cpu()))

    def host_busy_until(self, moment: float) -> float | None:
        """The share of the host's CPU (all its cores) that was busy from the rebase to the first sample at
        or after moment (wall time), whoever used it; None before a rebase."""
        with self.lock:
            if not self.host:
                return None
            _, busy0, total0 = self.host[0]
            _, busy, total = next((h for h in self.host if h[0] >= moment), self.host[-1])
        return (busy - busy0) / (total - total0) if total > total0 else None

    def cpu(self) -> dict[str, float]:
        """CPU seconds per role since the sampler started (or was rebased)."""
        used: dict[str, float] = {}
        for pid, role in self.roles.items():
            used[role] = used.get(role, 0.0) + self.last.get(pid, 0.0) - self.first.get(pid, 0.0)
        return {role: round(seconds, 2) for role, seconds in sorted(used.items(), key=lambda kv: -kv[1])}

    def run(self) -> None:
        from django.db import connection

        while self.running:
            backends = self.backends()
            self.pg_max = max(self.pg_max, len(backends))  # not the sampler's own
            self.sample_cpu(backends)
            with self.lock:
                if self.timeline:
                    self.timeline.append((time.time(), self.cpu()))
                    self.host.append((time.time(), *host_cpu()))
            time.sleep(0.5)
        connection.close()


# --- the child (one mode, in its own database) -------------------------------------------------------

def setup_members(n: int, max_iterations: int) -> list:
    from veronica.engine import supervisor
    from veronica.models import Role, Space

    members = []
    per_space = 50
    first = Space.objects.count()
    for s in range(first * per_space, first * per_space + n, per_space):
        workdir = Path(tempfile.mkdtemp(prefix="ws-", dir=os.environ["VERONICA_DATA_DIR"]))  # dropped with the mode
        (workdir / "README.md").write_text("# fleet\n")
        space = Space.objects.create(name=f"fleet {s // per_space}", slug=f"fleet-{s // per_space}", workdir=str(workdir))
        supervisor.add_member(space, "lead", role=Role.LEADER, actor="bench")
        for i in range(s, min(first * per_space + n, s + per_space)):
            members.append(supervisor.add_member(space, f"m{i}", model="openai:gpt-mock", max_iterations=max_iterations,
                                                 actor="bench"))
    return members


def mail_all(members: list) -> float:
    """Mail every member in one commit; returns t0, the moment of that commit. The wakes' doorbells ring
    in on-commit hooks after it (500 broker pushes take a while), and workers start runs meanwhile: t0
    taken after them started the clock late (runs began "before" t0 and the ratio read low)."""
    from django.db import transaction

    from veronica.swarm import bus

    committed = []
    with transaction.atomic():
        transaction.on_commit(lambda: committed.append(time.time()))  # the first hook: runs before the doorbells
        for member in members:
            bus.send(member.space, "lead", member.name, "list the folder, then say done")
    return committed[0]


def quantiles(values: list[float]) -> str:
    """p50 / p90 / max, in seconds."""
    if not values:
        return "-"
    ordered = sorted(values)
    return "/".join(f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))]:.2f}" for q in (0.5, 0.9, 1.0))


def resume_timeline(ids: list[int], t0: float, latency: float) -> dict:
    """The runs a kill cut off and their resumes (source "resume"), in seconds from t0: when the cut
    runs ended (the reap), when the resumes started (their claims), their first reply past the latency,
    and when they ended."""
    from veronica.models import Event, Run

    cut = sorted(at.timestamp() - t0 for at in Run.objects.filter(member_id__in=ids, outcome="lease_expired")
                 .values_list("ended_at", flat=True))
    resumes = list(Run.objects.filter(member_id__in=ids, source="resume").values_list("member_id", "started_at", "ended_at"))
    counted: dict[int, int] = {}
    for n in Run.objects.filter(member_id__in=ids, source="resume").values_list("model_calls", flat=True):
        counted[n] = counted.get(n, 0) + 1
    if not cut and not resumes:
        return {}
    calls: dict[int, list[float]] = {}
    for member_id, at in Event.objects.filter(member_id__in=[r[0] for r in resumes], kind="model.called").values_list(
            "member_id", "created_at"):
        calls.setdefault(member_id, []).append(at.timestamp())
    first = [min([t for t in calls.get(m, []) if t >= start.timestamp()], default=end.timestamp() if end else t0)
             - start.timestamp() - latency for m, start, end in resumes]
    between = []  # a resumed run's later steps: one reply to the next, less the latency
    for m, start, end in resumes:
        mine = sorted(t for t in calls.get(m, []) if t >= start.timestamp())
        between += [b - a - latency for a, b in zip(mine, mine[1:])]
    return {"resume_reaped": quantiles(cut), "resume_started": quantiles([s.timestamp() - t0 for _, s, _ in resumes]),
            "resume_first_reply_over_latency": quantiles(first), "resume_step_over_latency": quantiles(between),
            "resume_ended": quantiles([e.timestamp() - t0 for _, _, e in resumes if e]), "resumes": len(resumes),
            "resume_calls": dict(sorted(counted.items())),
            "others_ended": quantiles([e.timestamp() - t0 for m, e in Run.objects.filter(member_id__in=ids, outcome="done")
                                       .exclude(source="resume").values_list("member_id", "ended_at")])}


# A run's end is the database's clock (Now(): whole milliseconds on SQLite), an event's stamp Python's (microseconds):
# the final reply's event, written a moment before the end, could read as after it, and the run's tail then
# ran from the reply before (2.01 s at p90, embedded).
CLOCK_SLACK = 0.005


def step_timeline(runs: list, ids: list[int], latency: float) -> dict:
    """Where a run's time goes besides its model calls, from each call's `model.called` event (written
    in the fence that persists the reply): the run's start to its first reply, one reply to the next
    (each less the scripted latency: the cost of a step between two calls), the last reply to the end
    (of the runs that finished: a run a kill cut off ended at its reap, seconds after its last reply)."""
    from veronica.models import Event

    calls: dict[int, list[float]] = {}
    for member_id, at in Event.objects.filter(member_id__in=ids, kind="model.called").order_by("created_at").values_list(
            "member_id", "created_at"):
        calls.setdefault(member_id, []).append(at.timestamp())
    first, between, tail = [], [], []
    for member_id, start, end, result in runs:
        if end is None:
            continue
        mine = [t for t in calls.get(member_id, []) if start.timestamp() <= t <= end.timestamp() + CLOCK_SLACK]
        if not mine:
            continue
        first.append(mine[0] - start.timestamp() - latency)
        between += [b - a - latency for a, b in zip(mine, mine[1:])]
        if result != "lease_expired":
            tail.append(end.timestamp() - mine[-1])
    return {"first_reply_over_latency": quantiles(first), "step_over_latency": quantiles(between),
            "last_reply_to_end": quantiles(tail)}


def outcome(members: list, t0: float, latency: float) -> dict:
    from django.db import close_old_connections

    from veronica.models import Message, Run, Turn

    close_old_connections()
    ids = [m.pk for m in members]
    runs = list(Run.objects.filter(member_id__in=ids).order_by("member_id", "started_at").values_list(
        "member_id", "started_at", "ended_at", "outcome"))
    resumed = resume_timeline(ids, t0, latency)
    overlaps, points = 0, []
    for (m1, _, end1, _), (m2, start2, _, _) in zip(runs, runs[1:]):
        if m1 == m2 and (end1 is None or start2 < end1):
            overlaps += 1
    for _, start, end, _ in runs:
        points += [(start.timestamp(), 1), ((end.timestamp() if end else time.time()), -1)]
    peak = running = 0
    for _, delta in sorted(points):
        running += delta
        peak = max(peak, running)
    answered = set(Turn.objects.filter(session__member_id__in=ids, role="assistant", content="done").values_list(
        "session__member_id", flat=True))
    unread = set(Message.objects.filter(recipient_id__in=ids, read_at__isnull=True).values_list("recipient_id", flat=True))
    last_end = max((end.timestamp() for _, _, end, _ in runs if end), default=t0)
    starts = sorted(start.timestamp() - t0 for _, start, _, _ in runs)
    lengths = sorted(end.timestamp() - start.timestamp() for _, start, end, _ in runs if end)
    timeline = step_timeline(runs, ids, latency)
    return {**timeline, **resumed, "start_lag_p50": round(starts[len(starts) // 2], 2) if starts else None,
            "start_lag_max": round(starts[-1], 2) if starts else None,
            "start_lag_p90": round(starts[int(len(starts) * 0.9)], 2) if starts else None,
            "started_after_5s": sum(1 for s in starts if s > 5),  # a tail here is wakes that waited for a run slot
            "run_seconds_p50": round(lengths[len(lengths) // 2], 2) if lengths else None,
            "run_seconds_max": round(lengths[-1], 2) if lengths else None,"runs": len(runs), "expired": sum(1 for r in runs if r[3] == "lease_expired"), "overlaps": overlaps,
            "concurrent_members": peak, "lost": len(set(ids) - answered) + len(unread - answered),
            "elapsed": last_end - t0}


def drained(members: list) -> bool:
    from django.db import close_old_connections

    from veronica.models import Member, Message, Turn

    close_old_connections()
    ids = [m.pk for m in members]
    if Member.objects.filter(pk__in=ids).exclude(lease_token="").exists():
        return False
    if Message.objects.filter(recipient_id__in=ids, read_at__isnull=True).exists():
        return False
    return Turn.objects.filter(session__member_id__in=ids, role="assistant", content="done").values(
        "session__member_id").distinct().count() == len(ids)


def cluster_env(args, mock: Mock, workers: int, runs: int) -> dict:
    env = {**os.environ, "OPENAI_BASE_URL": mock.root + "/v1", "OPENAI_API_KEY": "sk-fleet", "LOG_LEVEL": "INFO",
           "VERONICA_Q_WORKERS": str(workers), "VERONICA_RUNS_PER_WORKER": str(runs),
           "VERONICA_RUN_LEASE_SECONDS": str(args.lease), "VERONICA_Q_STOP_GRACE": "10",
           "VERONICA_MODEL_STREAM": "1", "VERONICA_ENGINE_TICK_SECONDS": "1"}
    return env


def fleet_run(args, kill: str = "") -> dict:
    """One fleet run on fresh members: mail them all. kill "worker": mid-way, one q2 worker process of
    the cluster is SIGKILLed (it holds about half the runs; its sentinel replaces it). kill "host": the
    workers are split over two hosts (two qcluster process groups) and one host is SIGKILLed mid-way,
    then started again, as in bench/recovery.py."""
    from django.db import connection

    members = setup_members(args.members, args.steps + 4)
    warm = setup_members(args.workers * 4, args.steps + 4)
    mock = Mock(args.latency, args.steps)
    data = Path(os.environ["VERONICA_DATA_DIR"])
    hosts = 2 if kill == "host" else 1
    per_host = max(1, args.workers // hosts)
    env = cluster_env(args, mock, per_host, args.runs_per_worker)
    clusters = [start_cluster(env, data / f"cluster-{kill or 'run'}-{n}.log") for n in range(hosts)]
    mail_all(warm)  # every worker has imported, connected and run once before t0
    deadline = time.time() + 300
    while not drained(warm) and time.time() < deadline:
        time.sleep(0.2)
    sampler = Sampler(clusters, connection.vendor == "postgresql", mock)
    sampler.start()
    killed, killed_at = 0, None
    try:
        t0 = mail_all(members)
        mailing = sampler.rebase()
        ideal = args.steps * args.latency
        if kill:  # mid-way from t0 (mail_all returns after its doorbells: seconds of them on SQLite)
            time.sleep(max(0.0, t0 + ideal / 2 - time.time()))
        if kill == "host":
            killed_at = time.time() - t0
            clusters[0].kill()  # the host dies at once: SIGKILL to its whole group
            killed = per_host
            clusters[0] = start_cluster(env, data / "cluster-host-restarted.log")
        elif kill == "worker":
            pgid = clusters[0].proc.pid
            workers = sorted(pid for pid, role in cluster_roles(pgid, scan()).items() if role == "worker")
            children = set(pid for pid, (_, group, _, _) in scan().items() if group == pgid)
            killed_at = time.time() - t0
            os.kill(workers[0], signal.SIGKILL)
            killed = 1
            if os.environ.get("BENCH_PYSPY"):  # profile the replacement worker (a raw py-spy file at that path)
                profile_replacement(pgid, children, os.environ["BENCH_PYSPY"])
        deadline = time.time() + max(120.0, ideal * 10 + args.lease * 3)
        while time.time() < deadline and not drained(members):
            time.sleep(1.0)
        sampler.running = False
        sampler.join(timeout=5)
        figures = outcome(members, t0, args.latency)
        figures.update(cpu_seconds=sampler.cpu(), cpu_seconds_mailing=mailing, mock=mock.lateness(),
                       **calls_sent(mock.arrivals(), t0, args.latency))
        host_figures(figures, sampler, t0, ideal, mock.served())
        last_first = figures.pop("first_call_last", None)
        if last_first is not None:  # the start burst: what each part used until the last first call went out
            at, burst = sampler.cpu_until(t0 + last_first)
            figures["cpu_seconds_burst"] = {"until": round(at - t0, 2), **burst}
    finally:
        sampler.running = False
        sampler.join(timeout=5)
        for cluster in clusters:
            cluster.stop()
        mock.stop()
        gateways = gateway_stats(data, kill or "run")
        if gateways and "figures" in locals():
            figures["gateway"] = gateways
        if args.keep_logs:  # the clusters' logs outlive the mode's data directory
            Path(args.keep_logs).mkdir(parents=True, exist_ok=True)
            for log in data.glob("cluster-*.log"):
                shutil.copy(log, Path(args.keep_logs) / f"{connection.vendor}-{log.name}")
    if killed_at is not None:
        # No system gets back a model call in flight in a process that died: the ideal schedule with this fault
        # has every member start at t0 and the killed ones redo, from the kill on, each call not answered by then.
        faulted = killed_at + (args.steps - int(killed_at // args.latency)) * args.latency
        figures.update(killed_at=round(killed_at, 2), ideal_with_fault=round(faulted, 2),
                       completion_ratio_to_ideal_with_fault=round(figures["elapsed"] / faulted, 3))
    figures.update(ideal=ideal, completion_ratio_to_ideal=round(figures["elapsed"] / ideal, 3),
                   worker_rss_mb=round(sampler.rss_max, 1), pg_connections_max=int(sampler.pg_max) if sampler.hosted else None,
                   killed_workers=killed, killed_at=None if killed_at is None else round(killed_at, 2), t0=t0, load=os.getloadavg()[0])
    return figures


def host_figures(figures: dict, sampler: "Sampler", t0: float, ideal: float, calls: int) -> None:
    """How busy the host was from t0 to the last run's end, and what the CPU every part used then sets as
    a floor: on this host's cores, no schedule of that much CPU work ends sooner than its total over the
    cores (a floor for this machine's speed, not a figure of the design: a host twice as fast halves it)."""
    end = t0 + figures["elapsed"]
    busy = sampler.host_busy_until(end)
    _, used = sampler.cpu_until(end)
    total = sum(used.values())
    figures.update(host_cpu_busy_pct=None if busy is None else round(100 * busy, 1), cpu_seconds_to_end=round(total, 2),
                   cpu_ms_per_call=round(1000 * total / calls, 2) if calls else None,
                   cpu_floor_ratio=round(total / (os.cpu_count() or 1) / ideal, 3))


def calls_sent(arrivals: list[tuple[float, int]], t0: float, latency: float) -> dict:
    """When the model calls reached the vendor, from its own record: the runs' first calls (s from t0),
    and each round's calls past where the ideal schedule sends them (round k at t0 + k x latency)."""
    rounds: dict[int, list[float]] = {}
    for at, step in arrivals:
        if at >= t0:
            rounds.setdefault(step, []).append(at - t0 - step * latency)
    return {"first_call_sent": quantiles(rounds.get(0, [])), "first_call_last": max(rounds.get(0, [None])),
            "calls_past_ideal_by_round": {step: quantiles(lags) for step, lags in sorted(rounds.items())}}


def gateway_stats(data: Path, case: str) -> dict:
    """What this case's hosts' model gateways did (the line each logs as it stops; a host SIGKILLed
    logs none), summed: calls made, calls whose worker died (orphaned), taken over by the resumed run,
    answers read by a worker that died before storing them, cancelled, expired, left untaken."""
    import ast

    total: dict[str, int] = {}
    for log in data.glob(f"cluster-{case}-*.log"):
        lines = [line for line in log.read_text(errors="replace").splitlines() if "model gateway: {" in line]
        if lines:
            for key, value in ast.literal_eval(lines[-1].split("model gateway: ", 1)[1]).items():
                total[key] = total.get(key, 0) + value
    return total


def profile_replacement(pgid: int, before: set[int], out: str) -> None:
    """The worker the sentinel forks for the killed one, from its birth (BENCH_PYSPY=path): py-spy's raw
    samples for BENCH_PYSPY_SECONDS (12) with BENCH_PYSPY_FLAGS (--gil: the GIL's holder only), or, for a
    path ending in .cpu, its CPU seconds every 0.1 s for 9 s ("<unix time> <CPU seconds>" lines)."""
    deadline = time.time() + 5
    while time.time() < deadline:
        procs = scan()
        sentinels = [pid for pid, (ppid, group, _, _) in procs.items() if group == pgid and ppid == pgid]
        fresh = [pid for pid, (ppid, _, _, _) in procs.items() if ppid in sentinels and pid not in before]
        if fresh and out.endswith(".cpu"):
            def trace(pid=fresh[0]) -> None:
                start, rows = time.time(), []
                while time.time() - start < 9:
                    try:
                        rows.append((round(time.time(), 3), scan_one(pid)))
                    except OSError:
                        break
                    time.sleep(0.1)
                Path(out).write_text("\n".join(f"{t} {c}" for t, c in rows))
            threading.Thread(target=trace, daemon=True).start()
            return
        if fresh:
            subprocess.Popen([str(REPO / ".venv/bin/py-spy"), "record", "--pid", str(fresh[0]), "--rate", "250",
                              "--duration", os.environ.get("BENCH_PYSPY_SECONDS", "12"),
                              *os.environ.get("BENCH_PYSPY_FLAGS", "--gil").split(), "--format", "raw", "--output", out, "--nonblocking"],
                             stdout=subprocess.DEVNULL, stderr=open(out + ".err", "w"))
            return
        time.sleep(0.005)


def memory_run(args) -> dict:
    """Point 5: the cluster's RSS after 1,000 steps and after --mem-steps steps."""
    from django.db import close_old_connections

    from veronica.swarm import bus
    from veronica.engine import supervisor
    from veronica.plumbing.errors import VeronicaError
    from veronica.models import Member, Message

    members = setup_members(args.mem_members, args.steps + 4)
    mock = Mock(0.0, args.steps)
    log = Path(os.environ["VERONICA_DATA_DIR"]) / "cluster-memory.log"
    # q2 recycles a worker after 500 tasks by default: a fresh process would hide any growth
    cluster = start_cluster({**cluster_env(args, mock, 1, args.runs_per_worker), "VERONICA_Q_RECYCLE": str(10**9)}, log)
    early = None
    started = time.monotonic()
    try:
        while True:
            served = mock.served()
            if early is None and served >= 1000:
                early = (served, rss_mb(cluster.proc.pid), os.getloadavg()[0])
            if served >= args.mem_steps or time.monotonic() - started > args.mem_timeout:
                break
            close_old_connections()
            idle = Member.objects.filter(pk__in=[m.pk for m in members], lease_token="").exclude(
                pk__in=Message.objects.filter(read_at__isnull=True).values("recipient_id"))
            for member in idle:
                try:  # a fresh conversation each round: the transcript stays the size of one run
                    supervisor.clear_session(member, actor="bench")
                except VeronicaError:
                    continue
                bus.send(member.space, "lead", member.name, "list the folder, then say done")
            time.sleep(0.2)
        late = (mock.served(), rss_mb(cluster.proc.pid), os.getloadavg()[0])
    finally:
        cluster.stop()
        mock.stop()
    if early is None:
        early = late
    return {"steps_early": early[0], "rss_early_mb": round(early[1], 1), "steps_late": late[0], "rss_late_mb": round(late[1], 1),
            "rss_growth_pct": round((late[1] - early[1]) / early[1] * 100, 1), "load": late[2],
            "seconds": round(time.monotonic() - started)}


def child(args) -> dict:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "veronica.settings")
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    cases = args.cases.split(",")
    result = {"run": median_run([fleet_run(args) for _ in range(max(1, args.repeat))])} if "run" in cases else {}
    if not args.skip_kill:
        if "kill" in cases:
            result["kill"] = fleet_run(args, kill="worker")
        if "host_kill" in cases:
            result["host_kill"] = fleet_run(args, kill="host")
    if not args.skip_memory:
        result["memory"] = memory_run(args)
    return result


def median_run(runs: list[dict]) -> dict:
    """The plain case run several times (this host's speed varies by up to +-25 % between identical runs):
    the median run's figures, with every run's ratio, the most RSS and connections, and all the lost and
    overlapping runs."""
    ordered = sorted(runs, key=lambda f: f["completion_ratio_to_ideal"])
    figures = dict(ordered[(len(ordered) - 1) // 2])
    figures.update(repeats=[f["completion_ratio_to_ideal"] for f in runs], worker_rss_mb=max(f["worker_rss_mb"] for f in runs),
                   pg_connections_max=max((f["pg_connections_max"] for f in runs if f["pg_connections_max"] is not None), default=None),
                   lost=sum(f["lost"] for f in runs), overlaps=sum(f["overlaps"] for f in runs))
    return figures


def spawn(mode: str, args) -> dict:
    with isolated_env(mode, "fleet") as env:
        forwarded = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
                     if k not in ("child", "modes", "skip_kill", "skip_memory", "skip_scale") and v is not None]
        forwarded += [flag for flag, on in (("--skip-kill", args.skip_kill), ("--skip-memory", args.skip_memory)) if on]
        proc = subprocess.run([sys.executable, __file__, "--child", mode, *forwarded], cwd=REPO, env=env,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{mode} run failed:\n{proc.stderr[-4000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])


def scale_figures(mode: str) -> dict:
    try:
        from bench import fleet_scale
    except ImportError:
        return {}
    figures = {}
    for name in ("idle_figures", "big_space_figures"):
        try:
            figures.update(getattr(fleet_scale, name)(mode))
        except Exception as exc:  # its own failure is reported, never this bench's
            print(f"  fleet_scale.{name}({mode}) failed: {exc}")
    return figures


def show(name: str, value, goal: str = "", unit: str = "") -> None:
    shown = "not measured" if value is None else f"{value}{unit}"
    print(f"  {name:<28} {shown:<16} {('goal ' + goal) if goal else '':<14} ({load()})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modes", default="embedded,hosted")
    parser.add_argument("--members", type=int, default=500)
    parser.add_argument("--latency", type=float, default=2.0, help="seconds per model call")
    parser.add_argument("--steps", type=int, default=5, help="model calls per run")
    parser.add_argument("--workers", type=int, default=2, help="q2 worker processes")
    parser.add_argument("--runs-per-worker", type=int, default=256)
    parser.add_argument("--lease", type=int, default=10)
    parser.add_argument("--mem-members", type=int, default=16)
    parser.add_argument("--mem-steps", type=int, default=100_000)
    parser.add_argument("--mem-timeout", type=float, default=3600)
    parser.add_argument("--repeat", type=int, default=3, help="plain runs (the median's figures are shown)")
    parser.add_argument("--skip-kill", action="store_true")
    parser.add_argument("--cases", default="run,kill,host_kill", help="which fleet runs (a subset of run,kill,host_kill)")
    parser.add_argument("--keep-logs", metavar="DIR", help="copy the clusters' logs here")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-scale", action="store_true", help="leave out points 2-4 (bench/fleet_scale.py)")
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        import logging

        logging.disable(logging.CRITICAL)
        print(json.dumps(child(args), default=str))
        return
    print(f"fleet: {args.members} members x {args.steps} calls of {args.latency:g}s, {args.workers} workers x "
          f"{args.runs_per_worker} runs, lease {args.lease}s; memory: {args.mem_steps} steps\n")
    per_mode = {}
    for mode in args.modes.split(","):
        r = spawn(mode, args)
        r.update(scale={} if args.skip_scale else scale_figures(mode))
        per_mode[mode] = r
        print(f"[{mode}]")
        for label, key in (("run", "run"), ("with a worker SIGKILLed mid-way", "kill"),
                           ("with a host SIGKILLed mid-way, restarted", "host_kill")):
            f = r.get(key)
            if f is None:
                continue
            if f.get("repeats") and len(f["repeats"]) > 1:
                print(f" {label}, {len(f['repeats'])} times: completion over the ideal {', '.join(map(str, f['repeats']))};"
                      " the median run's figures:")
            print(f" {label}: {f['runs']} runs, {f['expired']} lease-expired, ideal {f['ideal']:g}s, took {f['elapsed']:.1f}s"
                  f" (load at the end {f['load']:.1f})" + (f"; killed at {f['killed_at']}s" if f.get("killed_at") else ""))
            print(f"   runs started {f['start_lag_p50']}s (p50), {f.get('start_lag_p90')}s (p90), {f['start_lag_max']}s (last) after t0, "
                  f"their first calls sent {f.get('first_call_sent')} (p50/p90/max), "
                  f"{f.get('started_after_5s')} after 5s; a run took "
                  f"{f['run_seconds_p50']}s (p50), {f['run_seconds_max']}s (max)")
            if f.get("calls_past_ideal_by_round"):
                print("   calls reached the vendor past the ideal schedule (s, p50/p90/max), by round: "
                      + ", ".join(f"{k}: {v}" for k, v in f["calls_past_ideal_by_round"].items()))
            print(f"   seconds past the model's latency (p50/p90/max): start to first reply {f['first_reply_over_latency']}, "
                  f"reply to reply {f['step_over_latency']}; last reply to the run's end {f['last_reply_to_end']}")
            if f.get("resumes"):
                print(f"   resumes (s from t0, p50/p90/max): {f['resumes']} runs; cut runs ended {f['resume_reaped']}, resumes started "
                      f"{f['resume_started']}, first reply past latency {f['resume_first_reply_over_latency']}, reply to reply past "
                      f"latency {f.get('resume_step_over_latency')}, ended {f['resume_ended']};"
                      f" model calls per resumed run {f.get('resume_calls')}; the runs not cut ended {f.get('others_ended')}")
            print(f"   mock vendor: {f['mock']}; CPU seconds from t0: " + ", ".join(f"{k} {v}" for k, v in f["cpu_seconds"].items())
                  + "; mailing before t0: " + ", ".join(f"{k} {v}" for k, v in f.get("cpu_seconds_mailing", {}).items() if v))
            if f.get("cpu_seconds_burst"):
                burst = dict(f["cpu_seconds_burst"])
                print(f"   the start burst, t0 to {burst.pop('until')}s (the last first call's sample): CPU seconds "
                      + ", ".join(f"{k} {v}" for k, v in burst.items()) + f", all {round(sum(burst.values()), 2)}")
            if f.get("cpu_floor_ratio") is not None:
                print(f"   the host's CPU was {f['host_cpu_busy_pct']} % busy from t0 to the last run's end; every part together used "
                      f"{f['cpu_seconds_to_end']} CPU seconds then ({f['cpu_ms_per_call']} ms per model call): on {os.cpu_count()} "
                      f"cores no schedule of that work ends before {f['cpu_floor_ratio']} x the ideal")
            if f.get("gateway"):
                print("   model gateway: " + ", ".join(f"{k} {v}" for k, v in f["gateway"].items()))
            show("concurrent_members", f["concurrent_members"], f">= {args.members}")
            show("completion_ratio_to_ideal", f["completion_ratio_to_ideal"], GOALS["completion_ratio_to_ideal"] if key != "host_kill"
                 else GOALS["completion_ratio_to_ideal"] + " (restarted on its machine: leases reaped as it starts)")
            if f.get("ideal_with_fault"):
                show("completion_ratio_to_ideal_with_fault", f["completion_ratio_to_ideal_with_fault"],
                     f"{GOALS['completion_ratio_to_ideal']} (killed at {f['killed_at']}s: its runs' calls in flight are "
                     f"lost; ideal {f['ideal_with_fault']}s)")
            show("worker_rss_mb", f["worker_rss_mb"], GOALS["worker_rss_mb"])
            show("pg_connections_max", f["pg_connections_max"], GOALS["pg_connections_max"] if mode == "hosted" else "")
            show("lost", f["lost"], GOALS["lost"])
            show("overlaps", f["overlaps"], GOALS["overlaps"])
            show("killed_workers", f["killed_workers"])
        m = r.get("memory")
        if m:
            print(f" worker memory: {m['rss_early_mb']} MB after {m['steps_early']} steps, {m['rss_late_mb']} MB after "
                  f"{m['steps_late']} steps ({m['seconds']}s)")
            show("rss_growth_pct", m["rss_growth_pct"], GOALS["rss_growth_pct"], " %")
        for key in ("idle_members", "tick_ms_10k_idle", "tick_statements_10k_idle", "page_p99_ms_big_space"):
            show(key, r["scale"].get(key))
        print()
    main_mode = "hosted" if "hosted" in per_mode else next(iter(per_mode))
    r = per_mode[main_mode]
    kill, host_kill, memory = r.get("kill") or {}, r.get("host_kill") or {}, r.get("memory") or {}
    run = r.get("run") or kill or host_kill  # --cases without the plain run: its figures are the first case's
    summary = {
        "mode": main_mode, "members": args.members, "latency": args.latency, "steps": args.steps,
        "concurrent_members": run["concurrent_members"], "completion_ratio_to_ideal": run["completion_ratio_to_ideal"],
        "worker_rss_mb": max(run["worker_rss_mb"], kill.get("worker_rss_mb", 0), host_kill.get("worker_rss_mb", 0)),
        "pg_connections_max": max(filter(None, [run["pg_connections_max"], kill.get("pg_connections_max"),
                                                host_kill.get("pg_connections_max")]), default=None),
        "lost": run["lost"] + kill.get("lost", 0) + host_kill.get("lost", 0),
        "overlaps": run["overlaps"] + kill.get("overlaps", 0) + host_kill.get("overlaps", 0),
        "killed_workers": kill.get("killed_workers", 0), "kill_completion_ratio": kill.get("completion_ratio_to_ideal"),
        "kill_completion_ratio_with_fault": kill.get("completion_ratio_to_ideal_with_fault"),
        "host_kill_completion_ratio": host_kill.get("completion_ratio_to_ideal"),
        "host_kill_completion_ratio_with_fault": host_kill.get("completion_ratio_to_ideal_with_fault"),
        "idle_members": r["scale"].get("idle_members"), "tick_ms_10k_idle": r["scale"].get("tick_ms_10k_idle"),
        "tick_statements_10k_idle": r["scale"].get("tick_statements_10k_idle"),
        "page_p99_ms_big_space": r["scale"].get("page_p99_ms_big_space"), "rss_growth_pct": memory.get("rss_growth_pct"),
        "load": os.getloadavg()[0], "per_mode": per_mode,
    }
    print(json.dumps(summary, default=str))


if __name__ == "__main__":
    main()
