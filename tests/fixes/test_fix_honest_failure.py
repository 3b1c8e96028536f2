"""The offline worker whose read failed says so and fails the task; the leader does not count it as done."""
from pathlib import Path

from veronica.swarm import blackboard, bus
from veronica.engine.drive import run_until_quiet
from veronica.models import Message, Task


def test_a_task_about_a_missing_file_fails_and_the_leader_reports_it(space):
    workdir = Path(space.workdir)
    (workdir / "notes.md").write_text("# Notes\nTODO: write more\n")
    bus.send(space, bus.OPERATOR, "boss", "Summarize notes.md\nCheck ghost.csv against notes.md")
    run_until_quiet(space, timeout=60)
    tasks = {t.title: t for t in Task.objects.filter(space=space)}
    assert tasks["Summarize notes.md"].status == "done" and "notes.md: 2 lines" in tasks["Summarize notes.md"].result
    ghost = tasks["Check ghost.csv against notes.md"]
    assert ghost.status == "failed"
    assert "could not read file ghost.csv: 'ghost.csv' is not a file" in ghost.result and "ghost.csv: 1 lines" not in ghost.result
    # the report, not the leader's reply to the goal (its final text, issue 22.3)
    report = Message.objects.get(space=space, recipient_name="operator", sender_name="boss", reply_to__isnull=True)
    assert report.subject == "Goal finished: 1 done, 1 failed"
    assert f"#{ghost.pk} [failed]" in blackboard.read(space).content
