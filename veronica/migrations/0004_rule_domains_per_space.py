"""Give every learning rule domain to the space that routes it (issue 9: rules leaked between spaces).

learning's own migrations (0002-0004) turned each old domain string into an UNOWNED domain. Here the
host, which knows its spaces, hands them out. The rule, for a domain name N:

* routed by live members of exactly one space: the domain becomes that space's, with its rules,
  proposals and history (ids unchanged, so prompts and pending reviews carry on);
* routed by several spaces: each of them gets its own copy of the rules (user and learned, with
  strength and enabled), recorded as a "split" change in the copy's history. The shared original
  stays unowned with its whole history (staff see it in the admin), its rules removed by a recorded
  split change, so nobody reads or writes it any more. Its pending proposals are rejected (their ops
  name the original's rule ids) and their reflections go back to the queue, so the next learn pass
  proposes again, per space. Every prompt carries after the migration exactly what it carried before;
* routed by no live member: it stays unowned: no prompt reads it, staff see it in the admin.

Unconsumed reflections follow the space their item came from (sessions, outbox mail and approvals
name it); one from a space that does not route N, or of unknown origin where several spaces do,
stays with (or moves to) the unowned domain N, so no lesson crosses into another space's queue.
"""
from django.db import migrations
from django.utils import timezone

ACTOR = "migration (rule domains per space)"


def _key(space_id):
    return f"space:{space_id}"


def _routing(Member):
    routes = {}
    for space_id, refs in Member.objects.filter(removed_at__isnull=True).values_list("space_id", "rule_domains"):
        for ref in refs or ():
            if isinstance(ref, str) and ref.strip() and not ref.strip().lower().startswith("global:"):
                routes.setdefault(ref.strip().lower(), set()).add(space_id)
    return routes


def _origins(apps, keys):
    """Reflection item key -> the space it came from (None when unknown)."""
    ids = {"session": set(), "outbox": set(), "approval": set()}
    for key in keys:
        kind, _, pk = key.partition(":")
        if kind in ids and pk.isdigit():
            ids[kind].add(int(pk))
    found = {}
    Session, Message, Approval = (apps.get_model("veronica", m) for m in ("Session", "Message", "Approval"))
    for pk, sid in Session.objects.filter(pk__in=ids["session"]).values_list("pk", "member__space_id"):
        found[f"session:{pk}"] = sid
    for pk, sid in Message.objects.filter(pk__in=ids["outbox"]).values_list("pk", "space_id"):
        found[f"outbox:{pk}"] = sid
    for pk, sid in Approval.objects.filter(pk__in=ids["approval"]).values_list("pk", "space_id"):
        found[f"approval:{pk}"] = sid
    return {key: found.get(key) for key in keys}


def _snap(rules, label=None):
    out = []
    for r in rules:
        item = {"id": r.pk, "text": r.text, "strength": r.strength, "enabled": r.enabled}
        if label is not None:
            item["domain_id"], item["domain"] = r.domain_id, label
        out.append(item)
    return out


def _diff(before, after):
    return ([{"sign": "-", "ref": f"#{r['id']}", "text": r["text"]} for r in before]
            + [{"sign": "+", "ref": f"#{r['id']}", "text": r["text"]} for r in after])


def split_rule_domains(apps, schema_editor=None) -> dict:
    """The data step (also called directly by its test). Returns what it did, by domain name."""
    Domain, Rule, Proposal, Reflection, RuleChange = (
        apps.get_model("learning", m) for m in ("Domain", "Rule", "Proposal", "Reflection", "RuleChange"))
    Member, Space = apps.get_model("veronica", "Member"), apps.get_model("veronica", "Space")
    routes = _routing(Member)
    names = dict(Space.objects.values_list("pk", "name"))
    report = {}
    for shared in Domain.objects.filter(owner="", is_global=False).order_by("name"):
        spaces = sorted(routes.get(shared.name, ()))
        if not spaces:
            report[shared.name] = "unowned"
            continue
        pending = Reflection.objects.filter(domain=shared, consumed_at__isnull=True)
        origin = _origins(apps, set(pending.values_list("item_key", flat=True)))
        listed = ", ".join(f"{names.get(s, '?')} (#{s})" for s in spaces)
        if len(spaces) == 1:
            owner = spaces[0]
            shared.owner = _key(owner)
            shared.note = (shared.note + "\n" if shared.note else "") + f"given to space {listed}, the only space routing it"
            shared.save(update_fields=["owner", "note"])
            strays = [k for k, s in origin.items() if s is not None and s != owner]
            if strays:  # lessons from a space that no longer routes it: not this space's to learn from
                archive, _ = Domain.objects.get_or_create(owner="", is_global=False, name=shared.name, defaults={
                    "note": f"reflections from other spaces, set aside when {shared.name!r} went to space #{owner}",
                    "created_by": ACTOR})
                pending.filter(item_key__in=strays).update(domain=archive)
            report[shared.name] = f"space:{owner}"
            continue
        # several spaces: a copy each; the original keeps the history and no rules
        now = timezone.now()
        for proposal in Proposal.objects.filter(domain=shared, status="pending"):
            proposal.status, proposal.decided_by, proposal.decided_at = "rejected", ACTOR, now
            proposal.reason = f"the shared domain was split between spaces {listed}; the next learn pass proposes again"
            proposal.save(update_fields=["status", "decided_by", "decided_at", "reason"])
            Reflection.objects.filter(proposal=proposal).update(consumed_at=None, proposal=None)
        pending = Reflection.objects.filter(domain=shared, consumed_at__isnull=True)
        origin = _origins(apps, set(pending.values_list("item_key", flat=True)))
        originals = list(Rule.objects.filter(domain=shared).order_by("id"))
        for space_id in spaces:
            copy = Domain.objects.create(
                owner=_key(space_id), name=shared.name, created_by=ACTOR,
                note=(f"copied from the domain {shared.name!r} (#{shared.pk}) that spaces {listed} shared; "
                      f"its earlier history stays with unowned/{shared.name} (#{shared.pk})"))
            label = f"space:{space_id}/{shared.name}"
            for source in ("user", "learned"):
                rows = [Rule.objects.create(domain=copy, source=source, text=r.text, enabled=r.enabled, strength=r.strength,
                                            created_by=r.created_by, updated_by=r.updated_by)
                        for r in originals if r.source == source]
                if rows:
                    after = _snap(rows, label if source == "user" else None)
                    RuleChange.objects.create(actor=ACTOR, domain=copy, source=source, action="split", before=[],
                                              after=after, diff=_diff([], after),
                                              summary=f"copied {len(rows)} {source} rule(s) from shared #{shared.pk}")
            pending.filter(item_key__in=[k for k, s in origin.items() if s == space_id]).update(domain=copy)
        for source in ("user", "learned"):
            rows = [r for r in originals if r.source == source]
            if rows:
                before = _snap(rows, f"unowned/{shared.name}" if source == "user" else None)
                RuleChange.objects.create(actor=ACTOR, domain=shared, source=source, action="split", before=before,
                                          after=[], diff=_diff(before, []),
                                          summary=f"split into a copy per space: {listed}"[:300])
        Rule.objects.filter(domain=shared).delete()
        shared.note = (shared.note + "\n" if shared.note else "") + f"split into a copy per space: {listed}"
        shared.save(update_fields=["note"])
        report[shared.name] = "split:" + ",".join(_key(s) for s in spaces)
    return report


def forwards(apps, schema_editor):
    import secrets

    split_rule_domains(apps, schema_editor)
    # any process still caching prompt blocks re-reads them (learning.store keys its cache on this)
    apps.get_model("learning", "StoreState").objects.filter(pk=1).update(stamp=secrets.randbits(62) + 1)


class Migration(migrations.Migration):

    dependencies = [
        ("veronica", "0003_operator_accepts_mail"),
        ("learning", "0004_domain_required"),
    ]

    operations = [
        migrations.RunPython(forwards, migrations.RunPython.noop),
    ]
