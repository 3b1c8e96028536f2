"""Preflight, the whole ladder: a manifest folder or archive before `register` (every file's error,
nothing written), the database, the broker, a live engine ticker (so a live qcluster), every space's
workdir, every member's model spec and keys, one real authenticated request per distinct model
endpoint, and a price for every model."""
from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.core import checks
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.db.models.functions import Now

from veronica.agent.providers import get_provider, pricing
from veronica.agent.providers.base import ProviderError
from veronica.agent.providers.probe import endpoint_for, probe
from veronica.engine.ticker import ROLE as TICKER_ROLE
from veronica.plumbing.errors import VeronicaError
from veronica.portable.manifest import MemberSpec, Preflight, check
from veronica.models import EngineLease, Member, Space
from veronica.portable.archive import check_archive


class Command(BaseCommand):
    requires_system_checks = []  # run after migrating (below), so a fresh data folder gets real answers
    help = ("Migrate, then check a manifest folder or archive (if given) as register would read it, without writing it; the "
            "database, the broker, that an engine ticker (a qcluster) is alive, every space's workdir and every member's provider: "
            "keys, one list-models request per distinct endpoint (wrong key, dead URL, doubled /v1) and a known price per model.")

    def add_arguments(self, parser):
        parser.add_argument("manifest", nargs="?", help="a manifest folder or an exported archive to check before `register`")
        parser.add_argument("--no-probe", action="store_true", help="skip the network requests to model endpoints")

    def handle(self, *args, **options):
        problems = warnings = 0

        def report(ok: bool, text: str) -> None:
            nonlocal problems
            problems += not ok
            self.stdout.write(("  ✓ " if ok else "  ✗ ") + text)

        def warn(text: str) -> None:
            nonlocal warnings
            warnings += 1
            self.stdout.write("  ! " + text)

        connection.ensure_connection()
        call_command("migrate", interactive=False, verbosity=0)  # a fresh data folder has no tables yet
        report(True, f"database: {connection.vendor} (migrated)")
        if settings.REDIS_URL:
            import redis

            try:
                redis.Redis.from_url(settings.REDIS_URL).ping()
                report(True, "redis: reachable")
            except redis.RedisError as exc:
                report(False, f"redis: {exc}")
        self.ticker(report)
        specs: dict[str, list[str]] = {}  # model spec -> who uses it
        if options.get("manifest"):
            for member in self.preflight(options["manifest"], report):
                specs.setdefault(member.model, []).append(f"manifest/{member.name}")
        for space in Space.objects.all():
            report(Path(space.workdir).is_dir(), f"space {space.slug}: workdir {space.workdir}")
            for member in Member.objects.filter(space=space, removed_at__isnull=True):
                try:
                    get_provider(member.model)
                    report(True, f"  {member.name}: {member.model}")
                    specs.setdefault(member.model, []).append(f"{space.slug}/{member.name}")
                except (ProviderError, VeronicaError) as exc:
                    report(False, f"  {member.name}: {member.model}: {exc}")
        learning = os.environ.get("VERONICA_LEARNING_MODEL", "")
        if learning and learning != "offline":
            specs.setdefault(learning, []).append("VERONICA_LEARNING_MODEL")
        if not options["no_probe"]:
            problems_before = problems
            self.probe_endpoints(specs, report, warn)
            if problems > problems_before:
                self.stdout.write("    (members on a failing endpoint fail every run until it is fixed)")
        for spec, users in sorted(specs.items()):
            if not pricing.known(spec):
                warn(f"no price known for {spec} (used by {', '.join(users[:3])}): it is metered in tokens at $0, so a "
                     "USD ceiling never trips; add it to VERONICA_MODEL_PRICES")
        self.system_checks(report, warn)
        if problems:
            raise CommandError(f"{problems} problem(s) found" + (f", {warnings} warning(s)" if warnings else ""))
        self.stdout.write(self.style.SUCCESS("all checks passed" + (f" ({warnings} warning(s))" if warnings else "")))

    def preflight(self, source: str, report) -> list[MemberSpec]:
        """The manifest as register would read it: each file's first error with its field; nothing is
        written (an archive is unpacked into a temporary folder). The members that parsed are returned
        so their models and keys are checked below, before anything registers."""
        path = Path(source)
        try:
            found = check_archive(path.read_bytes()) if path.is_file() else check(path)
        except VeronicaError as exc:  # an unreadable or hostile archive
            found = Preflight([exc], [])
        for error in found.errors:
            report(False, f"manifest: {error.message}")
        if not found.errors:
            leader = next(m.name for m in found.members if m.role == "leader")
            exists = Space.objects.filter(slug=found.slug).exists()
            report(True, f"manifest {source}: space '{found.slug}' ({'a register refreshes it' if exists else 'new'}), "
                         f"{len(found.members)} member(s), leader {leader}")
        return found.members

    def ticker(self, report) -> None:
        """Liveness read off the database: every qcluster runs an engine ticker while its workers run,
        and the active one renews the role's lease every beat. No live lease: no worker is running, so
        no wake, timer, alarm or lease recovery happens."""
        slack = timedelta(seconds=2 * settings.ENGINE_TICK_SECONDS)  # a beat a little late is not a death
        holder = EngineLease.objects.filter(name=TICKER_ROLE, expires_at__gt=Now() - slack).values_list("holder", flat=True).first()
        if holder:
            report(True, f"engine ticker: alive ({holder}), so a qcluster is running")
        else:
            report(False, "engine ticker: none alive, so no qcluster is running: nothing wakes members, fires schedules or "
                          "recovers leases. Start `manage.py qcluster` (or `manage.py up`)")

    def system_checks(self, report, warn) -> None:
        """Django's system checks (learning.W001: rules no member reads, ...), errors as problems."""
        for message in checks.run_checks(databases=["default"]):
            text = f"{message.id}: {message.msg}" + (f" ({message.obj})" if message.obj else "") + (
                f"\n      hint: {message.hint}" if message.hint else "")
            if message.level >= checks.ERROR:
                report(False, text)
            elif message.level >= checks.WARNING:
                warn(text)

    def probe_endpoints(self, specs: dict[str, list[str]], report, warn) -> None:
        by_endpoint: dict = {}
        for spec in specs:
            try:
                endpoint = endpoint_for(spec)
            except Exception:  # noqa: BLE001 - a bad spec was reported above
                continue
            if endpoint is not None:
                by_endpoint.setdefault(endpoint, []).append(spec)
        for endpoint, endpoint_specs in by_endpoint.items():
            result = probe(endpoint)
            report(result.ok, result.text)
            if result.ok and result.models:
                for spec in endpoint_specs:
                    model = spec.partition(":")[2]
                    if model not in result.models and not any(m.startswith(model) for m in result.models):
                        warn(f"{spec}: the endpoint does not list model '{model}' (listed: {', '.join(result.models[:5])})")
