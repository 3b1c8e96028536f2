"""Model and user text is rendered as sanitized markdown or escaped text: a script tag stays inert."""
import re

from tests.console.helpers import open_question, pending_approval
from veronica.swarm import blackboard, bus, ledger, skills
from veronica.engine import supervisor
from veronica.models import MemoryFile, Session, Turn

EVIL = '<script>alert("x")</script><img src=x onerror="alert(1)"> [link](javascript:alert(1)) **bold**'


def assert_inert(html: str) -> None:
    assert "<script>alert" not in html
    assert not re.search(r"<img[^>]*onerror", html)
    assert 'href="javascript:' not in html


def test_script_in_message_skill_blackboard_and_more_renders_inert(world):
    w1 = supervisor.get_member(world.space, "w1")
    bus.send(world.space, "boss", "operator", EVIL, subject="<script>s()</script>")
    skills.add_skill(world.space, "evil", EVIL, member=w1, description="<script>d()</script>")
    blackboard.write(world.space, "boss", EVIL)
    ledger.create_task(world.space, "boss", "<script>t()</script>")
    pending_approval(world.space, "w1", "write_file", content="<script>a()</script>")
    open_question(world.space, "w1", EVIL)
    MemoryFile.objects.create(member=w1, name="MEMORY.md", content=EVIL)
    session = Session.objects.create(member=w1)
    Turn.objects.create(session=session, seq=1, role="assistant", content=EVIL)
    Turn.objects.create(session=session, seq=2, role="tool", content=EVIL)

    client = world.client(world.operator)
    pages = ["/spaces/alpha/", "/spaces/alpha/members/w1/"]
    pages += [f"/spaces/alpha/panels/{p}/" for p in ("messages", "blackboard", "tasks", "approvals")]
    pages += [f"/spaces/alpha/members/w1/panels/{p}/" for p in ("skills", "memory", "transcript")]
    for url in pages:
        html = client.get(url).content.decode()
        assert_inert(html)
        assert "<script>s()" not in html and "<script>t()" not in html and "<script>a()" not in html and "<script>d()" not in html
    space_page = client.get("/spaces/alpha/").content.decode()
    assert "<strong>bold</strong>" in space_page  # markdown still renders
    board = client.get("/spaces/alpha/panels/tasks/").content.decode()  # the space page's board, loaded by its script
    assert "&lt;script&gt;t()&lt;/script&gt;" in board  # a title is text, escaped
    # the API returns the raw text as data, and an `html` twin that is sanitized
    assert_inert(client.get("/api/spaces/alpha/blackboard/").json()["html"])
    assert_inert(client.get("/api/spaces/alpha/messages/").json()["messages"][0]["html"])
    assert_inert(client.get("/api/spaces/alpha/members/w1/").json()["skills"][0]["html"])
    assert client.get("/api/spaces/alpha/messages/")["Content-Type"] == "application/json"
