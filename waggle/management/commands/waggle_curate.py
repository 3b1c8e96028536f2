"""``python manage.py waggle_curate``: run one curation pass now and print its summary."""
from __future__ import annotations

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError

from waggle.config import DEFAULT_MIN_FAILS, DEFAULT_STALE_AGE
from waggle.service import curate


class Command(BaseCommand):
    help = "Curate the waggle library: GC, demote, prune, compact, promote (in that order)."

    def add_arguments(self, parser):
        parser.add_argument("--stale-days", type=float, default=DEFAULT_STALE_AGE.total_seconds() / 86400,
                            help="prune never-used waggles untouched for this many days (default %(default)s)")
        parser.add_argument("--min-fails", type=int, default=DEFAULT_MIN_FAILS,
                            help="demote waggles with at least this many failed replays and no use "
                                 "(default %(default)s)")

    def handle(self, *args, **opts):
        if opts["stale_days"] < 0:
            raise CommandError("--stale-days must be >= 0")
        if opts["min_fails"] < 1:
            raise CommandError("--min-fails must be >= 1")
        summary = curate(stale_age=timedelta(days=opts["stale_days"]), min_fails=opts["min_fails"])
        self.stdout.write(str(summary))
