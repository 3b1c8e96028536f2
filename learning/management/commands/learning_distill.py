from learning.passes import run_distill

from ._base import PassCommand


class Command(PassCommand):
    help = "Distill: turn finished sessions into durable notes in the members' memory files."

    def handle(self, *args, **opts):
        self.stdout.write("learning distill: starting")
        self.report(run_distill(progress=self.progress, wait=opts["wait"]))
