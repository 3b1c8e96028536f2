"""A hostile tenant against the doors added last: per-space secrets, the A2A settings, provider limits
and the audit trail. Each case is an attack that worked before its fix (the SSO ones are in
tests/oidc/test_sso_hostile.py, next to the provider they need)."""
from __future__ import annotations

import shutil
import subprocess

import pytest
from cryptography.fernet import Fernet
from django.test import Client

from veronica.agent import transcript
from veronica.agent.loop import run_tool
from veronica.agent.providers import limit_config, limits
from veronica.agent.tools import ToolContext, sandbox, tools_for
from veronica.agent.tools import workspace
from veronica.engine import supervisor
from veronica.models import A2AConfig, AuditRow, Event, McpServer
from veronica.portable import archive as portable
from veronica.swarm import a2a_settings, access, audit, events, mcp_servers, secrets

KEY = Fernet.generate_key().decode()


@pytest.fixture(autouse=True)
def keyed(settings):
    settings.SECRETS_KEYS = [KEY]


def bearer(user) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {access.create_token(user, 'attack')[1]}"}


# --- secrets: a variable meant for the command reached the launcher on the host ------------------------

def test_a_secret_for_commands_reaches_the_command_but_never_the_launcher_on_the_host(world, settings, monkeypatch):
    """run_command's secrets were the environment of the whole launch chain: the pids cgroup's /bin/sh,
    prlimit and bwrap run on the host, outside the sandbox, with the workspace as their cwd. A secret
    named PATH or LD_PRELOAD ("./hook.so") made the host run a workspace file. Now the launcher gets
    the sandbox's own PATH / HOME / LANG and the secrets under inert names only."""
    settings.COMMAND_SANDBOX = "none"  # the launcher is then the command's own shell: any host runs this
    space, w1 = world.space, supervisor.get_member(world.space, "w1")
    secrets.set_secret(space, "PATH", "bin:/usr/bin:/bin", in_commands=True, actor="attacker")
    secrets.set_secret(space, "LD_PRELOAD", "./hook.so", in_commands=True, actor="attacker")
    secrets.set_secret(space, "DEPLOY_TOKEN", "deploy-tok-4242-xyz", in_commands=True, actor="attacker")
    launched = []
    real_run = workspace.run
    monkeypatch.setattr(workspace, "run", lambda argv, **kw: launched.append(kw["env"]) or real_run(argv, **kw))
    out = run_tool(tools_for(w1)["run_command"], ToolContext(member=w1, space=space),
                   {"command": 'echo "path=$PATH preload=${LD_PRELOAD:-none} len=${#DEPLOY_TOKEN}"'})
    env = launched[0]
    assert env["PATH"] == "/usr/local/bin:/usr/bin:/bin" and "LD_PRELOAD" not in env and "DEPLOY_TOKEN" not in env
    assert set(env) - {"PATH", "HOME", "LANG"} <= {f"{sandbox.CARRIED}{i}" for i in range(3)}
    # the command itself still has them, under their own names (and masked in what it prints)
    assert "path=[secret PATH] preload=[secret LD_PRELOAD] len=19" in out


@pytest.mark.skipif(not (shutil.which("bwrap") and shutil.which("prlimit") and shutil.which("cc")),
                    reason="needs bubblewrap, prlimit and a C compiler")
def test_an_ld_preload_secret_runs_nothing_on_the_host_outside_the_sandbox(world, settings, tmp_path):
    """The real escape: a shared object the tenant left in its workspace, preloaded by a secret marked
    in_commands. Its constructor writes a file at a host path the sandbox cannot see: it exists only
    if host-side code (the launcher) loaded it."""
    settings.COMMAND_SANDBOX = "bwrap"
    space, w1 = world.space, supervisor.get_member(world.space, "w1")
    escaped = tmp_path / "outside" / "escaped"
    escaped.parent.mkdir()
    source = tmp_path / "hook.c"
    source.write_text('#include <stdio.h>\n__attribute__((constructor)) static void hook(void) {\n'
                      f'  FILE *f = fopen("{escaped}", "a"); if (f) {{ fputs("ran on the host\\n", f); fclose(f); }}\n}}\n')
    subprocess.run(["cc", "-shared", "-fPIC", "-o", f"{space.workdir}/hook.so", str(source)], check=True, timeout=60)
    secrets.set_secret(space, "LD_PRELOAD", "./hook.so", in_commands=True, actor="attacker")
    out = run_tool(tools_for(w1)["run_command"], ToolContext(member=w1, space=space), {"command": "echo inside"})
    assert "inside" in out
    assert not escaped.exists(), "a workspace file ran on the host, outside bubblewrap"


def test_an_mcp_servers_env_is_the_servers_not_the_launchers(world, settings):
    """The same door through an MCP stdio server's env (a manifest, an archive or the Manage page can
    set it): LD_PRELOAD there reached the host-side launcher too."""
    from veronica.agent.tools.mcp import spec_of

    settings.COMMAND_SANDBOX = "bwrap"
    cfg = mcp_servers.check({"name": "calc", "command": ["calc-server"], "env": {"LD_PRELOAD": "./hook.so", "PATH": "bin"}})
    server = mcp_servers.add(world.space, cfg, actor="attacker")
    spec = spec_of(McpServer.objects.get(pk=server.pk), world.space.workdir)
    env = dict(spec.env)
    assert "LD_PRELOAD" not in env and env["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    assert spec.argv[-1] == "calc-server" and 'export LD_PRELOAD="$' in spec.argv[-3]


# --- secrets: one space's value masked another space's text ------------------------------------------------

def test_another_spaces_secret_never_rewrites_this_spaces_events_or_transcripts(world):
    """The mask was one list for the process: beta's owner set a secret whose value is a word alpha
    uses ("verifying", a task status) and alpha's events and transcripts were stored with
    "[secret STATUS_WORD]" instead, which also told alpha beta's secret's name and value."""
    secrets.set_secret(world.other, "STATUS_WORD", "verifying", actor="attacker")
    alpha_event = events.emit(world.space.pk, "task.status", task=1, to="verifying")
    assert Event.objects.get(pk=alpha_event.pk).payload["to"] == "verifying"
    w1 = supervisor.get_member(world.space, "w1")
    turn = transcript.append(transcript.open_session(w1), "user", "the task is verifying now")
    assert turn.content == "the task is verifying now"
    # beta's own text is still masked
    beta_event = events.emit(world.other.pk, "note", text="status: verifying")
    assert Event.objects.get(pk=beta_event.pk).payload["text"] == "status: [secret STATUS_WORD]"


# --- A2A: a card URL's credential, and a half-written settings POST -----------------------------------------

CARD = "https://bot:pa55word-77@8.8.8.8/agent/card.json?key=k3y-s3cret-99"


def test_a_card_urls_credential_reaches_no_viewer_event_or_export(world):
    cfg = a2a_settings.check_remote({"name": "peer", "card_url": CARD, "token": "bearer-tok-123"})
    a2a_settings.add_remote(world.space, cfg, actor="owner", fetch_card=False)
    viewer = Client()
    shown = viewer.get("/api/spaces/alpha/a2a/", **bearer(world.viewer)).content.decode()
    timeline = viewer.get("/api/spaces/alpha/events/", **bearer(world.viewer)).content.decode()
    exported = "".join(portable.export_files(world.space).values())
    for where, text in (("the settings API", shown), ("the events API", timeline), ("the export", exported)):
        assert "pa55word-77" not in text and "k3y-s3cret-99" not in text and "bearer-tok-123" not in text, where
    assert "https://8.8.8.8/agent/card.json" in shown and "https://8.8.8.8/agent/card.json" in exported


def test_a_refused_members_list_leaves_serving_as_it_was(world):
    """POST {"enabled": true, "members": ["ghost"]} answered 400 but had turned serving on (and
    written its audit row): the two changes were two transactions."""
    owner = bearer(world.owner)
    refused = Client().post("/api/spaces/alpha/a2a/", {"enabled": True, "members": ["ghost"]},
                            content_type="application/json", **owner)
    assert refused.status_code == 400 and refused.json()["field"] == "a2a.members"
    assert not A2AConfig.objects.filter(space=world.space, enabled=True).exists()
    assert not AuditRow.objects.filter(action__startswith="a2a.").exists()
    typo = Client().post("/api/spaces/alpha/a2a/", {"enabeld": True}, content_type="application/json", **owner)
    assert typo.status_code == 400 and typo.json()["field"] == "enabeld"


def test_the_manifests_a2a_audit_row_never_holds_a_remote_token(world):
    table = a2a_settings.check_manifest_table({"remotes": [{"name": "peer", "card_url": CARD, "token": "bearer-tok-123"}]})
    with audit.acting(audit.command_actor()):
        a2a_settings.apply_manifest(world.space, table, actor="attacker")
    row = AuditRow.objects.get(action="a2a.manifest")
    assert "bearer-tok-123" not in str(row.after) and "pa55word-77" not in str(row.after)
    assert row.after["remotes"][0]["bearer_set"] is True


# --- provider limits: a model spec written differently slipped past its model's limit -----------------------

def test_a_spaced_model_spec_takes_its_models_limit(world):
    """"anthropic: claude-x" calls the vendor's claude-x, as "anthropic:claude-x" does, but missed the
    deployment's per-model limit keyed by the latter: a member could spend past it for everyone."""
    config = limit_config.parse('["anthropic:claude-x"]\nrpm = 5\n')
    with limits.overridden(config):
        for spec in ("anthropic:claude-x", "anthropic: claude-x", "anthropic:claude-x ", "anthropic :claude-x"):
            assert [limit.key for limit in limits.configured(spec, "")] == ["anthropic:claude-x"], spec
    member = supervisor.get_member(world.space, "w1")
    edited = Client().patch("/api/spaces/alpha/members/w1/", {"model": "anthropic: claude-x"}, content_type="application/json",
                            **bearer(world.owner))
    assert edited.status_code == 200
    member.refresh_from_db()
    with limits.overridden(config):
        assert limits.configured(member.model, "")


# --- tried and held: another space's tenant, a lower role, no login, no CSRF token ---------------------------

DOORS = [  # (method, path, body): alpha's secrets, audit and A2A doors
    ("get", "/api/spaces/alpha/secrets/", None),
    ("post", "/api/spaces/alpha/secrets/", {"name": "STOLEN", "value": "attacker-value-1"}),
    ("post", "/api/spaces/alpha/members/w1/secrets/", {"name": "STOLEN", "value": "attacker-value-1"}),
    ("delete", "/api/spaces/alpha/secrets/KEPT/", None),
    ("post", "/api/spaces/alpha/a2a/", {"enabled": True}),
    ("post", "/api/spaces/alpha/a2a/credentials/", {"name": "mine", "role": "operator"}),
    ("post", "/api/spaces/alpha/a2a/remotes/", {"name": "evil", "card_url": "http://169.254.169.254/latest/"}),
]
PAGES = [("get", "/spaces/alpha/secrets/", None), ("post", "/spaces/alpha/secrets/", {"action": "set", "name": "STOLEN", "value": "attacker-value-1"}),
         ("get", "/spaces/alpha/audit/", None), ("get", "/spaces/alpha/audit/?format=jsonl", None)]


def _call(client: Client, method: str, path: str, body, **extra):
    if body is None:
        return getattr(client, method)(path, **extra)
    if path.startswith("/api/"):
        return getattr(client, method)(path, body, content_type="application/json", **extra)
    return getattr(client, method)(path, body, **extra)


def _nothing_written(world) -> None:
    from veronica.models import A2ACredential, A2ARemote, Secret

    assert list(Secret.objects.values_list("name", flat=True)) == ["KEPT"]
    assert not A2ARemote.objects.exists() and not A2ACredential.objects.exists()
    assert not A2AConfig.objects.filter(enabled=True).exists()


@pytest.mark.parametrize("who, api_status, page_status", [
    ("stranger", 404, 404), ("stranger-token", 404, None), ("viewer", 403, 403), ("operator", 403, 403), ("anonymous", 401, 302)])
def test_no_one_but_an_owner_reads_or_sets_secrets_a2a_or_the_audit(world, who, api_status, page_status):
    secrets.set_secret(world.space, "KEPT", "kept-value-123", actor="owner")
    user = {"stranger": world.stranger, "stranger-token": world.stranger, "viewer": world.viewer,
            "operator": world.operator, "anonymous": None}[who]
    token = bearer(world.stranger) if who == "stranger-token" else {}
    client = Client()
    if user is not None and not token:
        client.force_login(user)
    for method, path, body in DOORS:
        answer = _call(client, method, path, body, **token)
        assert answer.status_code == api_status, (method, path)
        assert "kept-value-123" not in answer.content.decode()
    for method, path, body in PAGES if page_status else []:
        answer = _call(client, method, path, body)
        assert answer.status_code == page_status, (method, path)
    _nothing_written(world)


def test_an_owners_session_without_a_csrf_token_changes_nothing(world):
    secrets.set_secret(world.space, "KEPT", "kept-value-123", actor="owner")
    client = world.client(world.owner, csrf=True)
    for method, path, body in [d for d in DOORS if d[0] != "get"] + [p for p in PAGES if p[0] == "post"]:
        assert _call(client, method, path, body).status_code == 403, (method, path)
    _nothing_written(world)


def test_an_owner_cannot_reach_the_host_through_a_remote_agent(world, settings):
    """The A2A door's SSRF guard (hosted: nothing internal) on a card URL, an IPv6 form of the
    metadata address, a non-HTTP scheme and a name that resolves to loopback; nothing is saved."""
    from veronica.models import A2ARemote

    settings.A2A_ALLOW_HOSTS = []
    owner = bearer(world.owner)
    for url in ("http://169.254.169.254/latest/meta-data/", "http://[::ffff:169.254.169.254]/", "http://127.0.0.1:8000/",
                "http://localhost/", "file:///etc/passwd", "http://2130706433/"):
        answer = Client().post("/api/spaces/alpha/a2a/remotes/", {"name": "evil", "card_url": url},
                               content_type="application/json", **owner)
        assert answer.status_code == 400 and answer.json()["field"] == "a2a.remotes.evil.card_url", url
    assert not A2ARemote.objects.exists()


@pytest.mark.parametrize("method, path, body, field", [
    ("post", "/api/spaces/alpha/secrets/", {"name": "A" * 65, "value": "abcdefghij"}, "name"),
    ("post", "/api/spaces/alpha/secrets/", {"name": "OK_NAME", "value": "x" * 8001}, "value"),
    ("post", "/api/spaces/alpha/secrets/", {"name": "OK_NAME", "value": "short"}, "value"),
    ("post", "/api/spaces/alpha/secrets/", {"name": "OK_NAME", "value": "two\nlines-here"}, "value"),
    ("post", "/api/spaces/alpha/secrets/", {"name": 5, "value": "abcdefghij"}, "name"),
    ("post", "/api/spaces/alpha/secrets/", {"name": "OK_NAME", "value": "abcdefghij", "in_commands": "yes"}, "in_commands"),
    ("post", "/api/spaces/alpha/members/ghost/secrets/", {"name": "OK_NAME", "value": "abcdefghij"}, "member"),
    ("post", "/api/spaces/alpha/a2a/remotes/", {"name": "x", "card_url": "http://8.8.8.8/" + "a" * 3000}, "a2a.remotes.x.card_url"),
    ("post", "/api/spaces/alpha/a2a/remotes/", {"name": "x", "card_url": "http://8.8.8.8/", "token": "t" * 501}, "a2a.remotes.x.token"),
    ("post", "/api/spaces/alpha/a2a/remotes/", {"name": "x", "card_url": "http://8.8.8.8/", "headers": {}}, "a2a.remotes.headers"),
    ("post", "/api/spaces/alpha/a2a/credentials/", {"name": "Bad Name", "role": "operator"}, "name"),
    ("post", "/api/spaces/alpha/a2a/credentials/", {"name": "partner", "role": "owner"}, "role"),
    ("post", "/api/spaces/alpha/a2a/", {"members": "w1"}, "a2a.members"),
    ("post", "/api/spaces/alpha/a2a/", {"enabled": "yes"}, "enabled"),
    ("patch", "/api/spaces/alpha/members/w1/", {"fallback": ["openai:a", "openai:b", "openai:c", "openai:d", "openai:e"]}, "fallback"),
    ("patch", "/api/spaces/alpha/members/w1/", {"fallback": [1]}, "fallback"),
    ("patch", "/api/spaces/alpha/members/w1/", {"fallback": ["openai:" + "m" * 200]}, "fallback"),
    ("patch", "/api/spaces/alpha/members/w1/", {"fallback": ["http://169.254.169.254/v1"]}, "fallback"),
])
def test_bad_input_to_the_new_doors_is_a_400_naming_the_field_and_writes_nothing(world, method, path, body, field):
    from veronica.models import A2ACredential, A2ARemote, Secret

    before = list(world.space.members.values_list("name", "model", "fallback").order_by("name"))
    answer = _call(Client(), method, path, body, **bearer(world.owner))
    assert answer.status_code in (400, 404) and answer.json().get("field") == field, answer.content
    assert not Secret.objects.exists() and not A2ARemote.objects.exists() and not A2ACredential.objects.exists()
    assert not A2AConfig.objects.filter(enabled=True).exists() and not A2AConfig.objects.exclude(members=[]).exists()
    assert list(world.space.members.values_list("name", "model", "fallback").order_by("name")) == before
