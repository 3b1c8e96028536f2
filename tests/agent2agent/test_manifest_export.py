"""[a2a] in space.toml: registered through the same verbs as the console and API, exported with the
remote tokens scrubbed and no caller credential anywhere, refused with the file and the field."""
import shutil
import tomllib

import pytest

from veronica.swarm import a2a_settings
from veronica.portable.manifest import ManifestError, register
from veronica.models import A2AConfig, A2ARemote
from veronica.portable.archive import export_files

A2A_TABLE = """
[a2a]
enabled = true
members = ["scout"]
remotes = [{ name = "peer", card_url = "http://127.0.0.1:9/.well-known/agent-card.json", token = "s3cret", timeout = 30 }]
"""


@pytest.fixture(autouse=True)
def loopback_allowed(settings):
    settings.A2A_ALLOW_HOSTS = ["127.0.0.1"]


@pytest.fixture
def manifest(tmp_path, demo_manifest):
    dest = tmp_path / "team"
    shutil.copytree(demo_manifest, dest)
    with open(dest / "space.toml", "a") as f:
        f.write(A2A_TABLE)
    return dest


def test_register_sets_serving_members_and_remotes_and_export_scrubs_the_secrets(db, manifest):
    space = register(manifest)
    cfg = A2AConfig.objects.get(space=space)
    assert cfg.enabled and cfg.members == ["scout"]
    remote = A2ARemote.objects.get(space=space)
    assert remote.token == "s3cret" and remote.from_manifest and remote.timeout == 30 and remote.endpoint == ""
    _, key = a2a_settings.create_credential(space, "caller", "operator", actor="test")
    files = export_files(space)
    text = "".join(files.values())
    assert "s3cret" not in text and key not in text and "caller" not in text
    table = tomllib.loads(files["space.toml"])["a2a"]
    assert table == {"enabled": True, "members": ["scout"], "remotes": [
        {"name": "peer", "card_url": "http://127.0.0.1:9/.well-known/agent-card.json", "timeout": 30, "token": ""}]}
    # the exported manifest registers again; its empty token keeps the stored one
    (manifest / "space.toml").write_text(files["space.toml"])
    register(manifest)
    assert A2ARemote.objects.get(space=space).token == "s3cret"


def test_a_token_given_as_a_secret_reference_travels_as_the_reference(db, manifest):
    text = (manifest / "space.toml").read_text().replace('token = "s3cret"', 'token = "${secret:PEER_TOKEN}"')
    (manifest / "space.toml").write_text(text)
    space = register(manifest)
    assert A2ARemote.objects.get(space=space).token == "${secret:PEER_TOKEN}"  # no value stored with the remote
    assert a2a_settings.status(space)["remotes"][0]["token_secret"] == "PEER_TOKEN"
    table = tomllib.loads(export_files(space)["space.toml"])["a2a"]
    assert table["remotes"][0]["token"] == "${secret:PEER_TOKEN}"  # a reference is no secret: it is exported


@pytest.mark.parametrize("text, field", [
    ('\n[a2a]\nremotes = [{ name = "x", card_url = "http://h/", token = "Bearer ${secret:X}" }]\n', "a2a.remotes.x.token"),
    ('\n[a2a]\nenabled = "yes"\n', "a2a.enabled"),
    ('\n[a2a]\nport = 1\n', "a2a.port"),
    ('\n[a2a]\nremotes = [{ name = "Bad Name", card_url = "http://h/" }]\n', "a2a.remotes.name"),
    ('\n[a2a]\nremotes = [{ name = "x", card_url = "ftp://h/" }]\n', "a2a.remotes.x.card_url"),
    ('\n[a2a]\nmembers = ["nobody"]\n', "a2a.members"),
])
def test_a_bad_a2a_table_names_the_file_and_the_field_and_registers_nothing(db, tmp_path, demo_manifest, text, field):
    dest = tmp_path / "bad"
    shutil.copytree(demo_manifest, dest)
    with open(dest / "space.toml", "a") as f:
        f.write(text)
    with pytest.raises(ManifestError) as caught:
        register(dest)
    assert caught.value.field == field and "space.toml" in str(caught.value)
    assert not A2AConfig.objects.exists() and not A2ARemote.objects.exists()
