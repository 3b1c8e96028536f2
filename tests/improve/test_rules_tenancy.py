"""Rule domains belong to a space (issue 9 item 2): the hostile-tenant battery.

The owner of space A knows the domain names space B's members route ("conduct") and the ids of
B's rules and proposals (ids are sequential). A adds members naming B's domains through every door
(API, console, manifest) and then reads and writes through A's rules page with B's ids. Every check
compares what B's members carry in their prompts, and what B's owner sees, before and after; and
what A can see against B's secret texts. The battery only uses host interfaces (HTTP, the run's
prompt assembly, the host's learning source), so it runs unchanged against the code before the fix,
where it finds the leaks the issue describes.
"""
from __future__ import annotations

import json
import re
import shutil

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from learning import api as learning
from learning.models import Proposal, Rule
from tests.conftest import DEMO_MANIFEST, make_space
from veronica.swarm import access
from veronica.agent.prompt import rules_block
from veronica.engine import supervisor
from veronica.portable.manifest import register
from veronica.models import Approval, ApprovalStatus, Member, Space

B_USER_RULE = "Beta secret: never mention Project Nightjar to anyone."
B_DENIAL = "never push straight to the release branch; ask Beta's lead first"
B_DENIAL_2 = "always run the beta smoke suite before a merge"
B_TEXTS = (B_USER_RULE, "Project Nightjar", "release branch", "beta smoke suite")


class Battery:
    """Counts cross-space checks and the ones that leaked (the goal is 0)."""

    def __init__(self):
        self.checks: list[str] = []
        self.leaks: list[str] = []

    def check(self, name: str, leaked: bool) -> None:
        self.checks.append(name)
        if leaked:
            self.leaks.append(name)


def _client(user: User) -> Client:
    c = Client()
    c.force_login(user)
    return c


def _deny(space: Space, member: str, reason: str) -> None:
    m = Member.objects.get(space=space, name=member)
    Approval.objects.create(space=space, member=m, tool_name="run_command", tool_args={"command": "git push"},
                            status=ApprovalStatus.DENIED, reason=reason)


def _prompts(space: Space) -> dict[str, str | None]:
    learning.clear_cache()
    return {m.name: rules_block(m) for m in Member.objects.filter(space=space, removed_at__isnull=True).order_by("name")}


def _page(client: Client, space: Space) -> str:
    html = client.get(reverse("console:rules", args=[space.slug])).content.decode()
    main = html[html.index("<main>"):html.index("</main>")]  # what the page shows of the rules
    return re.sub(r'name="csrfmiddlewaretoken" value="[^"]*"', "", main)  # masked afresh on every render


def _proposal_states() -> dict[int, str]:
    return dict(Proposal.objects.values_list("pk", "status"))


@pytest.fixture
def tenants(db, tmp_path, settings):
    """Space B with user rules, a learned rule and two pending proposals in its 'conduct' domain;
    space A whose owner is the attacker (not staff)."""
    settings.LEARNING_AUTO_APPROVE = "veronica.swarm.learning_bridge.auto_approve"
    a, b = make_space(tmp_path, "alpha"), make_space(tmp_path, "beta")
    owner_a, owner_b = User.objects.create_user("owner-a"), User.objects.create_user("owner-b")
    access.grant(a, "owner-a", "owner", actor="test")
    access.grant(b, "owner-b", "owner", actor="test")
    Member.objects.filter(space=b, name__in=["boss", "w1"]).update(rule_domains=["conduct"])
    cb = _client(owner_b)
    cb.post(reverse("console:rules", args=[b.slug]), {"action": "add_rule", "domain": "conduct", "text": B_USER_RULE})
    _deny(b, "w1", B_DENIAL)
    learning.run_reflect()
    learning.run_learn()
    first = Proposal.objects.get(status="pending")
    cb.post(reverse("console:rules", args=[b.slug]), {"action": "approve", "proposal_id": first.pk})
    _deny(b, "boss", B_DENIAL_2)
    learning.run_reflect()
    learning.run_learn()
    state = {"prompts": _prompts(b), "page": _page(cb, b), "proposals": _proposal_states(),
             "rule_ids": list(Rule.objects.values_list("pk", flat=True)),
             "proposal_ids": list(Proposal.objects.values_list("pk", flat=True))}
    assert B_USER_RULE in state["prompts"]["w1"] and "release branch" in state["prompts"]["w1"]
    assert list(state["proposals"].values()).count("pending") == 1
    return a, b, _client(owner_a), cb, state


def _b_unchanged(b: Space, cb: Client, state: dict) -> bool:
    return (_prompts(b) == state["prompts"] and _page(cb, b) == state["page"]
            and {k: v for k, v in _proposal_states().items() if k in state["proposals"]} == state["proposals"])


def _shows_b(text: str | None) -> bool:
    return bool(text) and any(t in text for t in B_TEXTS)


def test_hostile_tenant_battery_reaches_nothing_of_another_space(tenants, tmp_path):
    a, b, ca, cb, state = tenants
    battery = Battery()
    rules_a = reverse("console:rules", args=[a.slug])

    # 1. every door to add a member that routes B's domain name
    r = ca.post(f"/api/spaces/{a.slug}/members/", data=json.dumps({"name": "spy", "rule_domains": ["conduct"]}),
                content_type="application/json")
    assert r.status_code == 201, r.content
    ca.post(reverse("console:manage", args=[a.slug]), {"action": "add_member", "name": "spy2", "rule_domains": "conduct"})
    Member.objects.filter(space=a, name="w1").update(rule_domains=["conduct"])  # a member edit (admin / shell)
    for name in ("spy", "spy2", "w1"):
        member = Member.objects.filter(space=a, name=name).first()
        battery.check(f"prompt of A's {name} routing 'conduct'", member is None or _shows_b(rules_block(member)))
    battery.check("A's rules page shows B's rules", _shows_b(_page(ca, a)))
    battery.check("B unchanged after A routed its domain name", not _b_unchanged(b, cb, state))

    # 2. A's rules page with B's ids
    for rule_id in state["rule_ids"]:
        for action, extra in (("edit_rule", {"text": "Rewritten by A."}), ("remove_rule", {}), ("toggle_learned", {})):
            ca.post(rules_a, {"action": action, "rule_id": rule_id, **extra})
            battery.check(f"{action} on B's rule #{rule_id} from A's page", not _b_unchanged(b, cb, state))
    for proposal_id in state["proposal_ids"]:
        for action in ("approve", "reject"):
            ca.post(rules_a, {"action": action, "proposal_id": proposal_id, "reason": "A says no"})
            battery.check(f"{action} B's proposal #{proposal_id} from A's page", not _b_unchanged(b, cb, state))
    ca.post(rules_a, {"action": "add_rule", "domain": "conduct", "text": "Alpha's own conduct rule."})
    battery.check("A's add_rule to 'conduct' reaches B", not _b_unchanged(b, cb, state))
    battery.check("A's add_rule to 'conduct' lands in A", "Alpha's own conduct rule." not in (_prompts(a)["w1"] or ""))
    battery.check("A's page after its writes shows B's rules", _shows_b(_page(ca, a)))

    # 3. B's own pages and API from A's owner
    battery.check("GET B's rules page as A's owner", ca.get(reverse("console:rules", args=[b.slug])).status_code != 404)
    battery.check("POST B's rules page as A's owner", ca.post(reverse("console:rules", args=[b.slug]), {
        "action": "edit_rule", "rule_id": state["rule_ids"][0], "text": "x"}).status_code != 404 or not _b_unchanged(b, cb, state))
    battery.check("B's member via API as A's owner", ca.get(f"/api/spaces/{b.slug}/members/w1/").status_code != 404)

    # 4. A learns from its own work: the lesson stays in A, B's queue and rules untouched
    _deny(a, "spy", "never delete the alpha fixtures")
    learning.run_reflect()
    learning.run_learn()
    mine = [p for p in Proposal.objects.filter(status="pending") if p.pk not in state["proposals"]]
    for p in mine:
        ca.post(rules_a, {"action": "approve", "proposal_id": p.pk})
    battery.check("A's learn pass and approval change B", not _b_unchanged(b, cb, state))
    battery.check("A's lesson reaches B's prompts", any("alpha fixtures" in (t or "") for t in _prompts(b).values()))

    # 5. a manifest registered for A that names B's domain
    root = tmp_path / "gamma"
    shutil.copytree(DEMO_MANIFEST, root)
    (root / "space.toml").write_text((root / "space.toml").read_text().replace('slug = "demo"', 'slug = "gamma"'))
    gamma = register(root)
    battery.check("a manifest space routing 'conduct' reads B", any(_shows_b(t) for t in _prompts(gamma).values()))
    battery.check("B unchanged at the end", not _b_unchanged(b, cb, state))

    print(f"\ncross-space checks: {len(battery.checks)}, leaked: {len(battery.leaks)}")
    assert battery.leaks == [], f"{len(battery.leaks)} of {len(battery.checks)} cross-space checks leaked: {battery.leaks}"


def test_two_spaces_from_one_manifest_edit_conduct_independently(db, tmp_path, django_user_model):
    roots = []
    for slug in ("red", "blue"):
        root = tmp_path / slug
        shutil.copytree(DEMO_MANIFEST, root)
        (root / "space.toml").write_text((root / "space.toml").read_text().replace('slug = "demo"', f'slug = "{slug}"'))
        roots.append(root)
    red, blue = (register(r) for r in roots)
    owners = {}
    for space in (red, blue):
        owners[space.slug] = django_user_model.objects.create_user(f"owner-{space.slug}")
        access.grant(space, f"owner-{space.slug}", "owner", actor="test")
    _client(owners["red"]).post(reverse("console:rules", args=["red"]), {"action": "add_rule", "domain": "conduct", "text": "Red: cite sources."})
    _client(owners["blue"]).post(reverse("console:rules", args=["blue"]), {"action": "add_rule", "domain": "conduct", "text": "Blue: be brief."})
    red_prompts, blue_prompts = _prompts(red), _prompts(blue)
    assert red_prompts and all("Red: cite sources." in t and "Blue" not in t for t in red_prompts.values())
    assert blue_prompts and all("Blue: be brief." in t and "Red" not in t for t in blue_prompts.values())
    red_rule = Rule.objects.get(text="Red: cite sources.")
    _client(owners["red"]).post(reverse("console:rules", args=["red"]), {"action": "edit_rule", "rule_id": red_rule.pk, "text": "Red: cite two sources."})
    assert all("Red: cite two sources." in t for t in _prompts(red).values())
    assert _prompts(blue) == blue_prompts  # red's edit leaves blue's team alone
    blue_rule = Rule.objects.get(text="Blue: be brief.")
    _client(owners["red"]).post(reverse("console:rules", args=["red"]), {"action": "remove_rule", "rule_id": blue_rule.pk})
    assert Rule.objects.filter(pk=blue_rule.pk).exists()
    assert red_rule.domain_id != blue_rule.domain_id and red_rule.domain.name == blue_rule.domain.name == "conduct"


def test_a_global_domain_is_made_by_staff_shared_and_only_staff_edit_it(db, tmp_path, django_user_model):
    a, b = make_space(tmp_path, "alpha"), make_space(tmp_path, "beta")
    staff = django_user_model.objects.create_user("staff", is_staff=True, is_superuser=True)
    owner_a = django_user_model.objects.create_user("owner-a")
    access.grant(a, "owner-a", "owner", actor="test")
    # before staff make it, nobody can route a global domain: the error names the field
    refused = _client(owner_a).post(f"/api/spaces/{a.slug}/members/", content_type="application/json",
                                    data=json.dumps({"name": "early", "rule_domains": ["global:house-style"]}))
    assert refused.status_code == 400 and refused.json()["field"] == "rule_domains"
    assert "no global domain 'house-style'" in refused.json()["error"]
    admin = _client(staff)
    assert admin.post(reverse("admin:learning_domain_add"), {"name": "house-style", "is_global": "on"}).status_code == 302
    shared = learning.Domain.objects.get(is_global=True)
    admin.post(reverse("admin:learning_rule_add"), {"domain": shared.pk, "text": "Write dates as YYYY-MM-DD."})
    for space in (a, b):
        supervisor.add_member(space, "writer", rule_domains=["global:house-style", "conduct"], actor="test")
    for space in (a, b):
        writer = Member.objects.get(space=space, name="writer")
        assert "(global:house-style) Write dates as YYYY-MM-DD." in rules_block(writer)
    # a space's own domain of the same name is its own, not the global one
    supervisor.add_member(a, "local", rule_domains=["house-style"], actor="test")
    assert rules_block(Member.objects.get(space=a, name="local")) is None

    page = _page(_client(owner_a), a)
    assert "global (shared, staff-managed)" in page and "Write dates as YYYY-MM-DD." in page
    assert "read-only here" in page
    rule = Rule.objects.get(domain=shared)
    ca = _client(owner_a)
    ca.post(reverse("console:rules", args=[a.slug]), {"action": "edit_rule", "rule_id": rule.pk, "text": "Owner A rewrote it."})
    ca.post(reverse("console:rules", args=[a.slug]), {"action": "remove_rule", "rule_id": rule.pk})
    ca.post(reverse("console:rules", args=[a.slug]), {"action": "add_rule", "domain": "global:house-style", "text": "A adds."})
    assert list(Rule.objects.filter(domain=shared).values_list("text", flat=True)) == ["Write dates as YYYY-MM-DD."]
    # staff may edit it from a space's page too (staff own every space)
    _client(staff).post(reverse("console:rules", args=[a.slug]), {"action": "edit_rule", "rule_id": rule.pk, "text": "Write dates in ISO 8601."})
    assert "Write dates in ISO 8601." in rules_block(Member.objects.get(space=b, name="writer"))


def test_prompts_carry_only_own_and_global_rules(db, tmp_path):
    a, b = make_space(tmp_path, "alpha"), make_space(tmp_path, "beta")
    shared = learning.Domain.objects.create(name="house", is_global=True, created_by="staff")
    learning.add_user_rule(shared, "Global rule.", actor="staff")
    for space, text in ((a, "Alpha rule."), (b, "Beta rule.")):
        learning.add_user_rule("conduct", text, actor="owner", owner=f"space:{space.pk}")
    learning.add_user_rule("conduct", "Unowned rule.", actor="staff")  # a migration leftover: nobody reads it
    for space in (a, b):
        Member.objects.filter(space=space, name="w1").update(rule_domains=["conduct", "global:house"])
    block_a, block_b = (rules_block(Member.objects.get(space=s, name="w1")) for s in (a, b))
    assert "Alpha rule." in block_a and "Global rule." in block_a and "Beta rule." not in block_a
    assert "Beta rule." in block_b and "Global rule." in block_b and "Alpha rule." not in block_b
    assert "Unowned rule." not in block_a + block_b
    assert block_a.index("Alpha rule.") < block_a.index("Global rule.")  # the member's order: conduct first


def test_auto_approve_follows_the_owning_space_only(db, tmp_path):
    from veronica.swarm.learning_bridge import auto_approve

    a, b = make_space(tmp_path, "alpha"), make_space(tmp_path, "beta")
    Space.objects.filter(pk=a.pk).update(rule_review_required=False)
    own_a, own_b = (learning.domain_for("conduct", f"space:{s.pk}") for s in (a, b))
    shared = learning.Domain.objects.create(name="house", is_global=True)
    assert auto_approve(own_a) is True
    assert auto_approve(own_b) is False  # B requires review, whatever A allows for its "conduct"
    assert auto_approve(shared) is False and auto_approve(learning.domain_for("conduct")) is False


def test_the_host_source_tags_items_with_their_space_and_routes_per_space(db, tmp_path):
    from veronica.swarm.learning_bridge import VeronicaSource

    a, b = make_space(tmp_path, "alpha"), make_space(tmp_path, "beta")
    Member.objects.filter(space__in=[a, b], name="w1").update(rule_domains=["conduct"])
    _deny(a, "w1", "never do A things")
    _deny(b, "w1", "never do B things")
    items = {c.text.rsplit(": ", 1)[-1]: c.owner for c in VeronicaSource().corrections()}
    assert items == {"never do A things": f"space:{a.pk}", "never do B things": f"space:{b.pk}"}
    assert {(f"space:{a.pk}", "conduct"), (f"space:{b.pk}", "conduct")} <= VeronicaSource().routed_domains()


def test_the_start_up_check_counts_routing_per_space(db, tmp_path, settings):
    from learning.checks import check_rule_domains

    settings.LEARNING_SOURCE = "veronica.swarm.learning_bridge.VeronicaSource"
    a, b = make_space(tmp_path, "alpha"), make_space(tmp_path, "beta")
    Member.objects.filter(space=a, name="w1").update(rule_domains=["conduct"])
    learning.add_user_rule("conduct", "A's rule.", actor="o", owner=f"space:{a.pk}")
    learning.add_user_rule("conduct", "B's rule.", actor="o", owner=f"space:{b.pk}")
    # B's "conduct" holds rules that no member of B routes: A routing the same name does not count
    assert [(w.id, w.obj) for w in check_rule_domains()] == [("learning.W001", f"learning domain space:{b.pk}/conduct")]


def test_member_rule_domains_are_validated_at_every_door(db, tmp_path, django_user_model):
    a = make_space(tmp_path, "alpha")
    owner = django_user_model.objects.create_user("owner-a")
    access.grant(a, "owner-a", "owner", actor="test")
    bad = _client(owner).post(f"/api/spaces/{a.slug}/members/", content_type="application/json",
                              data=json.dumps({"name": "x", "rule_domains": ["Not A Domain!"]}))
    assert bad.status_code == 400 and bad.json()["field"] == "rule_domains"
    assert not Member.objects.filter(space=a, name="x").exists()
    root = tmp_path / "delta"
    shutil.copytree(DEMO_MANIFEST, root)
    toml = root / "members" / "scout" / "member.toml"
    toml.write_text(toml.read_text().replace('"exploration"', '"global:nowhere"'))
    from veronica.portable.manifest import ManifestError

    with pytest.raises(ManifestError) as exc:
        register(root)
    assert "rule_domains" in str(exc.value) and "member.toml" in str(exc.value)


def test_the_admin_routes_a_members_domains_in_its_own_space(tenants, django_user_model):
    import json as _json

    from django.forms.models import model_to_dict

    from veronica.admin import MemberAdminForm

    a, b, _, cb, state = tenants
    root = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    admin = _client(root)
    response = admin.post(reverse("admin:veronica_member_add"), {
        "space": a.pk, "name": "adminspy", "role": "worker", "model": "offline", "permission_mode": "bypass",
        "max_iterations": 24, "rule_domains": '["conduct"]'})
    assert response.status_code == 302, response.content.decode()[:1500]
    assert rules_block(Member.objects.get(space=a, name="adminspy")) is None  # A's conduct: empty, not B's
    bad = admin.post(reverse("admin:veronica_member_add"), {
        "space": a.pk, "name": "adminspy2", "role": "worker", "model": "offline", "permission_mode": "bypass",
        "max_iterations": 24, "rule_domains": '["global:nowhere"]'})
    assert bad.status_code == 200 and b"no global domain" in bad.content
    member = Member.objects.get(space=a, name="w2")
    data = {k: v for k, v in model_to_dict(member).items() if v is not None}
    data.update(rule_domains=_json.dumps(["global:nowhere"]))
    form = MemberAdminForm(data=data, instance=member)
    assert not form.is_valid() and "rule_domains" in form.errors
    assert _b_unchanged(b, cb, state)


def test_rules_page_and_domain_admin_queries_do_not_grow_with_rows(db, tmp_path, django_user_model,
                                                                  django_assert_max_num_queries):
    a = make_space(tmp_path, "alpha")
    owner = django_user_model.objects.create_user("owner-a")
    root = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    access.grant(a, "owner-a", "owner", actor="test")
    Member.objects.filter(space=a, name="w1").update(rule_domains=["d0"])
    learning.add_user_rule("d0", "First.", actor="o", owner=f"space:{a.pk}")
    page, domains = _client(owner), _client(root)

    def counts():
        with django_assert_max_num_queries(100) as ctx:
            assert page.get(reverse("console:rules", args=[a.slug])).status_code == 200
        n_page = len(ctx.captured_queries)
        with django_assert_max_num_queries(100) as ctx:
            assert domains.get(reverse("admin:learning_domain_changelist")).status_code == 200
        return n_page, len(ctx.captured_queries)

    counts()  # warm the session and content types
    before = counts()
    names = [f"d{i}" for i in range(1, 8)]
    Member.objects.filter(space=a, name="w1").update(rule_domains=["d0", *names])
    for name in names:
        for j in range(3):
            learning.add_user_rule(name, f"Rule {j} of {name}.", actor="o", owner=f"space:{a.pk}")
    assert counts() == before
