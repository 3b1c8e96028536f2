"""Member memory from the operator's side: the console panel's forms (through the API with CSRF),
the API with its limits and roles, and the admin (through the same verb and caps)."""
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from tests.console.helpers import call
from veronica.swarm import memory
from veronica.engine import supervisor
from veronica.models import Event, MemoryFile


def csrf_client(world, user):
    client = world.client(user, csrf=True)
    client.get("/")
    return client, client.cookies["csrftoken"].value


def test_the_memory_panel_is_editable_for_operators_only(world):
    w1 = supervisor.get_member(world.space, "w1")
    memory.write(w1, "MEMORY.md", "# Index\n- **bold** fact", actor="test")
    panel = reverse("console:member-panel", args=["alpha", "w1", "memory"])
    html = world.client(world.operator).get(panel).content.decode()
    assert 'data-url="/api/spaces/alpha/members/w1/memory/MEMORY.md/" data-method="PUT"' in html
    assert 'data-url="/api/spaces/alpha/members/w1/memory/" data-method="POST"' in html and "<strong>bold</strong>" in html
    viewer_html = world.client(world.viewer).get(panel).content.decode()
    assert "<strong>bold</strong>" in viewer_html and "data-api-form" not in viewer_html


def test_the_panels_forms_create_edit_and_delete_through_the_api_with_csrf(world):
    op, token = csrf_client(world, world.operator)
    base = "/api/spaces/alpha/members/w1/memory/"
    assert op.post(base, data='{"name": "x.md", "content": "no token"}', content_type="application/json").status_code == 403
    created = op.post(base, data='{"name": "runbook", "content": "# Runbook\\nrestart with make"}',
                      content_type="application/json", HTTP_X_CSRFTOKEN=token)
    assert created.status_code == 201 and created.json()["name"] == "runbook.md"
    edited = op.put(base + "runbook.md/", data='{"content": "# Runbook\\nrestart with systemctl"}',
                    content_type="application/json", HTTP_X_CSRFTOKEN=token)
    assert edited.status_code == 200 and "systemctl" in MemoryFile.objects.get(name="runbook.md").content
    assert Event.objects.filter(kind="memory.written", payload__member_name="w1").count() == 2
    listing = op.get(base).json()
    assert [f["name"] for f in listing["memory"]] == ["runbook.md"] and listing["limits"]["file_chars"] == 16000
    assert op.delete(base + "runbook.md/", HTTP_X_CSRFTOKEN=token).json() == {"name": "runbook.md", "deleted": True}
    assert not MemoryFile.objects.exists()
    assert op.get(base + "runbook.md/").status_code == 404


def test_the_api_names_the_limit_and_refuses_viewers(world, settings):
    settings.MEMORY_FILE_CHARS = 100
    op = world.client(world.operator)
    too_big = call(op, "POST", "/api/spaces/alpha/members/w1/memory/", {"name": "a.md", "content": "x" * 101})
    assert too_big.status_code == 400 and too_big.json() == {
        "error": "content is 101 characters; the limit per memory file is 100", "field": "content"}
    bad_name = call(op, "PUT", "/api/spaces/alpha/members/w1/memory/..secret/", {"content": "x"})
    assert bad_name.status_code == 400 and bad_name.json()["field"] == "name"
    assert call(world.client(world.viewer), "POST", "/api/spaces/alpha/members/w1/memory/",
                {"name": "a.md", "content": "x"}).status_code == 403
    assert call(world.client(world.stranger), "GET", "/api/spaces/alpha/members/w1/memory/").status_code == 404
    assert not MemoryFile.objects.exists()


def test_the_admin_edits_memory_through_the_verb_and_its_caps(world, settings):
    root = User.objects.create_superuser("root", "r@example.com", "pw")
    admin = Client()
    admin.force_login(root)
    w1 = supervisor.get_member(world.space, "w1")
    added = admin.post(reverse("admin:veronica_memoryfile_add"), {"member": w1.pk, "name": "ops", "content": "# Ops\nbe careful"})
    assert added.status_code == 302
    row = MemoryFile.objects.get(member=w1)
    assert row.name == "ops.md" and Event.objects.filter(kind="memory.written", payload__by="admin:root").exists()
    settings.MEMORY_FILE_CHARS = 100
    refused = admin.post(reverse("admin:veronica_memoryfile_change", args=[row.pk]),
                         {"member": w1.pk, "name": "ops.md", "content": "y" * 101})
    assert refused.status_code == 200 and b"the limit per memory file is 100" in refused.content
    assert MemoryFile.objects.get(pk=row.pk).content == "# Ops\nbe careful"
    page = admin.get(reverse("admin:veronica_memoryfile_changelist")).content.decode()
    assert "ops.md" in page
