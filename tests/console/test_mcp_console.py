"""The manage page's MCP servers: owners attach, check and remove; env values never echoed."""
import sys
from pathlib import Path

import pytest

from veronica.agent.mcp_client import manager
from veronica.models import McpServer

SERVER = str(Path(__file__).resolve().parent.parent / "mcp_server.py")


@pytest.fixture(autouse=True)
def unsandboxed(settings):
    settings.COMMAND_SANDBOX = "none"  # bubblewrap cannot see the suite's virtualenv (see tests/engine/test_mcp.py)
    yield
    manager().close_all()


def test_an_owner_attaches_checks_and_removes_a_server(world):
    owner = world.client(world.owner)
    form = {"action": "add_mcp", "name": "calc", "command": f"{sys.executable} {SERVER}", "env": "API_KEY=s3cret-value\nGREETING=hi",
            "timeout": "20", "member": "w1"}
    response = owner.post("/spaces/alpha/manage/", form, follow=True)
    assert b"added MCP server calc for w1" in response.content
    row = McpServer.objects.get()
    assert row.member.name == "w1" and row.command == [sys.executable, SERVER] and row.env["API_KEY"] == "s3cret-value"
    assert b"API_KEY" in response.content and b"s3cret-value" not in response.content
    response = owner.post("/spaces/alpha/manage/", {"action": "check_mcp", "name": "calc", "member": "w1"}, follow=True)
    assert b"MCP server calc is up: 7 tools" in response.content
    response = owner.post("/spaces/alpha/manage/", {"action": "remove_mcp", "name": "calc", "member": "w1"}, follow=True)
    assert b"removed MCP server calc" in response.content and not McpServer.objects.exists()


def test_a_server_that_cannot_start_shows_its_error(world):
    owner = world.client(world.owner)
    owner.post("/spaces/alpha/manage/", {"action": "add_mcp", "name": "broken", "command": "/nonexistent/server", "timeout": "5"})
    response = owner.post("/spaces/alpha/manage/", {"action": "check_mcp", "name": "broken"})
    assert response.status_code == 502 and b"MCP server &#x27;broken&#x27; could not start" in response.content
    page = owner.get("/spaces/alpha/manage/")
    assert b"could not start" in page.content and b"badge warn" in page.content


@pytest.mark.parametrize("form, field", [
    ({"name": "Bad", "url": "http://h/mcp"}, b"mcp_servers.name"),
    ({"name": "x"}, b"mcp_servers.x"),
    ({"name": "x", "url": "http://h/mcp", "timeout": "soon"}, b"timeout"),
    ({"name": "x", "url": "http://h/mcp", "env": "NOEQUALS"}, b"env: line 1"),
])
def test_bad_forms_name_the_field_and_write_nothing(world, form, field):
    response = world.client(world.owner).post("/spaces/alpha/manage/", {"action": "add_mcp", **form})
    assert response.status_code == 400 and field in response.content
    assert not McpServer.objects.exists()


def test_an_operator_cannot_attach_servers(world):
    response = world.client(world.operator).post("/spaces/alpha/manage/", {"action": "add_mcp", "name": "x", "url": "http://h/mcp"})
    assert response.status_code in (403, 404) and not McpServer.objects.exists()


def test_an_owner_fills_in_and_edits_env_values_without_seeing_them(world):
    """After an import the values are scrubbed (names kept): the owner fills them in on the page.
    `KEY=` keeps a value, a missing key is removed, and no value ever reaches the page."""
    from veronica.swarm import mcp_servers

    mcp_servers.add(world.space, mcp_servers.check({"name": "calc", "command": [sys.executable, SERVER],
                                                    "env": {"API_KEY": "", "GREETING": "hi", "OLD": "x"}}), actor="import")
    owner = world.client(world.owner)
    page = owner.get("/spaces/alpha/manage/").content.decode()
    assert 'name="action" value="env_mcp"' in page and "API_KEY=\nGREETING=\nOLD=\n" in page and ">hi<" not in page
    response = owner.post("/spaces/alpha/manage/", {"action": "env_mcp", "name": "calc", "env": "API_KEY=s3cret\nGREETING=\n"},
                          follow=True)
    assert b"saved the environment of MCP server calc (2 variables)" in response.content
    assert McpServer.objects.get().env == {"API_KEY": "s3cret", "GREETING": "hi"}  # filled, kept, removed
    assert b"s3cret" not in response.content
    assert world.space.events.filter(kind="mcp.updated").get().payload["env"] == ["API_KEY", "GREETING"]


@pytest.mark.parametrize("env, field", [("NOEQUALS", b"env: line 1"), ("bad key=v", b"mcp_servers.calc.env.bad key"),
                                        ("K=" + "v" * 5000, b"mcp_servers.calc.env.K")])
def test_a_bad_env_edit_names_the_field_and_changes_nothing(world, env, field):
    from veronica.swarm import mcp_servers

    mcp_servers.add(world.space, mcp_servers.check({"name": "calc", "url": "http://h/mcp", "env": {"A": "1"}}), actor="op")
    response = world.client(world.owner).post("/spaces/alpha/manage/", {"action": "env_mcp", "name": "calc", "env": env})
    assert response.status_code == 400 and field in response.content
    assert McpServer.objects.get().env == {"A": "1"} and not world.space.events.filter(kind="mcp.updated").exists()


def test_only_owners_edit_an_env_and_an_unknown_server_is_404(world):
    from veronica.swarm import mcp_servers

    mcp_servers.add(world.space, mcp_servers.check({"name": "calc", "url": "http://h/mcp", "env": {"A": "1"}}), actor="op")
    response = world.client(world.operator).post("/spaces/alpha/manage/", {"action": "env_mcp", "name": "calc", "env": "A=2"})
    assert response.status_code in (403, 404) and McpServer.objects.get().env == {"A": "1"}
    response = world.client(world.owner).post("/spaces/alpha/manage/", {"action": "env_mcp", "name": "nope", "env": "A=2"})
    assert response.status_code == 404
