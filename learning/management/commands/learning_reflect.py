from learning.passes import run_reflect

from ._base import PassCommand


class Command(PassCommand):
    help = "Reflect: turn unmined sessions, outbox edits and corrections into reflections."

    def handle(self, *args, **opts):
        self.stdout.write("learning reflect: starting")
        self.report(run_reflect(progress=self.progress, wait=opts["wait"]))
