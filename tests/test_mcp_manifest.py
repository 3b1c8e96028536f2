"""MCP servers declared in space.toml and member.toml: registered, replaced on a fresh register,
refused with the file and the field."""
import shutil

import pytest

from veronica.swarm import mcp_servers
from veronica.portable.manifest import ManifestError, register
from veronica.models import McpServer, Space

SPACE_SERVERS = """
[[mcp_servers]]
name = "calc"
command = ["python", "tests/mcp_server.py"]
env = { GREETING = "hi", API_KEY = "secret" }
timeout = 15

[[mcp_servers]]
name = "web"
url = "http://127.0.0.1:8123/mcp"
"""


@pytest.fixture(autouse=True)
def loopback_allowed(settings):
    settings.MCP_ALLOW_HOSTS = ["127.0.0.1"]  # "web" is declared on loopback, refused by the hosted default


@pytest.fixture
def manifest(tmp_path, demo_manifest):
    dest = tmp_path / "team"
    shutil.copytree(demo_manifest, dest)
    with open(dest / "space.toml", "a") as f:
        f.write(SPACE_SERVERS)
    with open(dest / "members" / "scout" / "member.toml", "a") as f:
        f.write('\n[[mcp_servers]]\nname = "docs"\nurl = "https://docs.example/mcp"\n')
    return dest


def test_register_declares_the_spaces_and_the_members_servers(db, manifest):
    space = register(manifest)
    calc = McpServer.objects.get(space=space, member__isnull=True, name="calc")
    assert calc.transport == "stdio" and calc.command == ["python", "tests/mcp_server.py"] and calc.timeout == 15
    assert calc.env == {"GREETING": "hi", "API_KEY": "secret"} and calc.from_manifest
    assert McpServer.objects.get(space=space, name="web").url == "http://127.0.0.1:8123/mcp"
    docs = McpServer.objects.get(space=space, name="docs")
    assert docs.member.name == "scout" and docs.transport == "http"


def test_a_fresh_register_replaces_manifest_servers_and_keeps_console_ones(db, manifest):
    space = register(manifest)
    mcp_servers.add(space, mcp_servers.check({"name": "mine", "url": "http://h/mcp"}), actor="op")
    space_toml = manifest / "space.toml"
    space_toml.write_text(space_toml.read_text().replace('[[mcp_servers]]\nname = "web"\nurl = "http://127.0.0.1:8123/mcp"\n', ""))
    register(manifest)
    assert sorted(McpServer.objects.filter(space=space, member__isnull=True).values_list("name", flat=True)) == ["calc", "mine"]


@pytest.mark.parametrize("where, text, field", [
    ("space.toml", '\n[[mcp_servers]]\nname = "x"\ncommand = "not a list"\n', "mcp_servers.x.command"),
    ("space.toml", '\n[[mcp_servers]]\nname = "calc"\nurl = "http://h/mcp"\n', "mcp_servers.calc"),  # declared twice
    ("members/scout/member.toml", '\n[[mcp_servers]]\nname = "y"\nurl = "http://h/mcp"\ntimeout = 9999\n', "mcp_servers.y.timeout"),
    ("members/scout/member.toml", '\n[[mcp_servers]]\nname = "z"\ncommand = ["x"]\nenv = { "bad key" = "v" }\n', "mcp_servers.z.env.bad key"),
    ("space.toml", '\n[[mcp_servers]]\nname = "meta"\nurl = "http://169.254.169.254/latest"\n', "mcp_servers.meta.url"),  # SSRF
])
def test_a_bad_declaration_names_the_file_and_the_field_and_writes_nothing(db, manifest, where, text, field):
    with open(manifest / where, "a") as f:
        f.write(text)
    with pytest.raises(ManifestError) as caught:
        register(manifest)
    assert str(manifest / where) in str(caught.value) and caught.value.field == field
    assert not McpServer.objects.exists()
    assert not Space.objects.exists()
