from django.conf import settings

from learning.passes import run_learn

from ._base import PassCommand


class Command(PassCommand):
    help = "Learn: consolidate reflections into proposals of operations on each domain's learned rules."

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument("--domain", default=None, help="Only this domain.")
        parser.add_argument("--auto-approve", action="store_true",
                            help="Apply proposals at once (default: LEARNING_AUTO_APPROVE, else they wait for review).")

    def handle(self, *args, **opts):
        self.stdout.write("learning learn: starting")
        auto = True if opts["auto_approve"] else getattr(settings, "LEARNING_AUTO_APPROVE", False)
        self.report(run_learn(domain=opts["domain"], auto_approve=auto, progress=self.progress, wait=opts["wait"]))
