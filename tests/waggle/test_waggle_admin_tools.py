"""Admin pages (stats annotated without N+1, readable route/script, actions, read-only ledger),
the member tool specs, and the import rule (waggle never imports the host)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from waggle import tools
from waggle.models import LedgerEntry, Waggle
from waggle.route import Route, Step, render_script
from waggle_helpers import FakeExec

WAGGLE_DIR = Path(__file__).resolve().parents[2] / "waggle"


def make(i: int, space: str = "1", scope: str = "space") -> Waggle:
    r = Route(steps=(Step("list_dir", binds=(("path", "path"),)), Step("grep", literals=(("pattern", f"p{i}"),),
                                                                         binds=(("path", "path"),))),
              params=("path",))
    r = Route(steps=r.steps, params=r.params, name=r.stable_name(), scope=scope)
    w = Waggle.objects.create(name=r.name, scope=scope, space_key=space if scope == "space" else "",
                              route=r.to_json(), script=render_script(r), length=2)
    LedgerEntry.objects.create(name=w.name, scope=scope, store_key=w.space_key, space_key="1", steps=1,
                               yield_tokens=10 * i)
    LedgerEntry.objects.create(name=w.name, scope=scope, store_key=w.space_key, space_key="1", fail=True)
    return w


@pytest.mark.django_db
def test_changelist_shows_stats_without_n_plus_1(admin_client):
    url = reverse("admin:waggle_waggle_changelist")
    make(1)
    with CaptureQueriesContext(connection) as few:
        assert admin_client.get(url).status_code == 200
    for i in range(2, 12):
        make(i, space=str(i % 3))
    make(99, scope="global")
    with CaptureQueriesContext(connection) as many:
        resp = admin_client.get(url)
    assert resp.status_code == 200
    assert len(many) == len(few)  # query count does not grow with the number of waggles
    body = resp.content.decode()
    assert "tokens saved (estimate)" in body.lower()
    assert ">990<" in body  # the annotated estimated yield of the global one
    # library per space and global
    resp = admin_client.get(url, {"library": "__global__"})
    assert resp.context["cl"].result_count == 1
    resp = admin_client.get(url, {"library": "2"})
    assert resp.context["cl"].result_count == len([i for i in range(2, 12) if i % 3 == 2])


@pytest.mark.django_db
def test_change_page_shows_readable_route_and_script(admin_client):
    w = make(3)
    body = admin_client.get(reverse("admin:waggle_waggle_change", args=[w.pk])).content.decode()
    assert "1. list_dir(path={path})" in body
    assert "# waggle " + w.name in body
    assert "1 uses, 1 failures, ~30 tokens saved (estimate)" in body


@pytest.mark.django_db
def test_enable_disable_actions(admin_client):
    a, b = make(1), make(2)
    url = reverse("admin:waggle_waggle_changelist")
    admin_client.post(url, {"action": "disable", "_selected_action": [a.pk, b.pk]})
    assert set(Waggle.objects.values_list("disabled", flat=True)) == {True}
    admin_client.post(url, {"action": "enable", "_selected_action": [a.pk]})
    assert Waggle.objects.get(pk=a.pk).disabled is False and Waggle.objects.get(pk=b.pk).disabled is True


@pytest.mark.django_db
def test_ledger_is_read_only(admin_client):
    make(1)
    entry = LedgerEntry.objects.first()
    assert admin_client.get(reverse("admin:waggle_ledgerentry_changelist")).status_code == 200
    assert admin_client.get(reverse("admin:waggle_ledgerentry_add")).status_code == 403
    page = admin_client.get(reverse("admin:waggle_ledgerentry_change", args=[entry.pk]))
    assert page.status_code == 200 and b'name="_save"' not in page.content
    assert admin_client.post(reverse("admin:waggle_ledgerentry_delete", args=[entry.pk]), {"post": "yes"}).status_code == 403
    assert LedgerEntry.objects.filter(pk=entry.pk).exists()


# --- member tools -------------------------------------------------------------------------------
def test_tool_specs_are_plain_read_only_dicts():
    names = [t["name"] for t in tools.TOOL_SPECS]
    assert names == ["waggle_list", "waggle_run"]
    for spec in tools.TOOL_SPECS:
        assert spec["mutates"] is False and spec["parameters"]["type"] == "object" and spec["description"]
    assert tools.WAGGLE_RUN["parameters"]["required"] == ["name"]


@pytest.mark.django_db
def test_tool_handlers():
    w = make(1)
    listing = tools.handle_waggle_list("1")
    assert w.name in listing and "(estimate)" in listing and "1. list_dir(path={path})" in listing
    assert "No waggles yet" in tools.handle_waggle_list("nowhere")
    exe = FakeExec()
    out = tools.handle_waggle_run("1", {"name": w.name, "params": '{"path": "src"}'}, exe)
    assert out.startswith("[waggle: ran waggle") and exe.calls[0] == ("list_dir", {"path": "src"})
    from waggle.service import WaggleError

    with pytest.raises(WaggleError):
        tools.handle_waggle_run("1", {"name": ""}, exe)
    with pytest.raises(WaggleError):
        tools.handle_waggle_run("1", {"name": w.name, "params": "[1,"}, exe)


# --- import rule ----------------------------------------------------------------------------------
def test_waggle_never_imports_the_host():
    offenders = []
    for path in WAGGLE_DIR.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mods = [node.module or ""]
            else:
                continue
            for mod in mods:
                if mod.split(".")[0] in {"veronica", "learning"}:
                    offenders.append(f"{path.name}: {mod}")
    assert offenders == []


def test_pure_modules_need_neither_django_nor_the_host():
    code = ("import sys; import waggle.miner, waggle.replay, waggle.route, waggle.recorder, waggle.trace; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('django', 'veronica', 'learning')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], cwd=WAGGLE_DIR.parent, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stdout + res.stderr
