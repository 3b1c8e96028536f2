"""The host side of the learning app: what it may mine (finished transcripts, approval denials
with a reason) and where distilled notes go (member memory files). learning never imports veronica;
settings point it here (LEARNING_SOURCE, LEARNING_AUTO_APPROVE; the passes' model, LEARNING_COMPLETE, is
veronica.agent.learning_model: it builds a provider, and the swarm verbs sit below the agent runtime).

Tenancy: every space is one learning owner, "space:<id>". A member's `rule_domains` names are
resolved in its own space's namespace (plus global:<name> for a global domain staff made), so the
same name in two spaces is two domains, and no name reaches another space's rules."""
from __future__ import annotations

import re
from typing import Iterable

from django.db.models import CharField, Exists, OuterRef, Value
from django.db.models.functions import Cast, Concat
from django.utils import timezone

from learning.sources import Correction, OutboxItem, SessionItem
from veronica.swarm import memory
from veronica.plumbing.errors import VeronicaError
from veronica.models import Approval, ApprovalStatus, Member, Message, Session, Space

MAX_SESSIONS = 200
OWNER_PREFIX = "space:"
SESSION_KEY = "session:"  # + the Session pk: the key learning's ledgers record a session under


def owner_key(space_or_id) -> str:
    """The learning owner of a space (learning treats it as an opaque string)."""
    return f"{OWNER_PREFIX}{getattr(space_or_id, 'pk', space_or_id)}"


def space_id_of(owner: str) -> int | None:
    if isinstance(owner, str) and owner.startswith(OWNER_PREFIX) and owner[len(OWNER_PREFIX):].isdigit():
        return int(owner[len(OWNER_PREFIX):])
    return None


def clean_rule_domains(refs: object) -> list[str]:
    """A member's rule domains as given by a person (API, console, admin, manifest): a list of
    domain names (this space's own) and global:<name> references to global domains that exist.
    Raises VeronicaError naming the field."""
    from learning import api as learning

    if refs is None:
        return []
    if not isinstance(refs, (list, tuple)):
        raise VeronicaError("rule_domains must be a list of strings", field="rule_domains")
    out: list[str] = []
    for ref in refs:
        if not isinstance(ref, str):
            raise VeronicaError("rule_domains must be a list of strings", field="rule_domains")
        if not ref.strip():
            continue
        try:
            is_global, name = learning.clean_ref(ref)
        except learning.RuleInputError as exc:
            raise VeronicaError(f"rule_domains: {exc.message}", field="rule_domains") from None
        if is_global and learning.domain_for(ref, create=False) is None:
            raise VeronicaError(f"rule_domains: there is no global domain '{name}' (staff create global domains in the "
                                "admin); a plain name is this space's own domain", field="rule_domains")
        value = f"{learning.GLOBAL_PREFIX}{name}" if is_global else name
        if value not in out:
            out.append(value)
    return out


def session_distilled() -> Exists:
    """For a Session queryset: learning's distill pass has taken this session's notes."""
    from learning.models import MinedItem, MinedKind

    key = Concat(Value(SESSION_KEY), Cast(OuterRef("pk"), CharField()))
    return Exists(MinedItem.objects.filter(kind=MinedKind.DISTILLED, key=key))


def member_rules_block(member: Member) -> str | None:
    """The rules block of one member's run: its own space's routed domains plus routed globals."""
    from learning.api import prompt_block

    return prompt_block(list(member.rule_domains or ()), owner=owner_key(member.space_id))
SESSION_NOTE = re.compile(r"^session[-_]")


class VeronicaSource:
    def sessions(self) -> Iterable[SessionItem]:
        ended = Session.objects.filter(ended_at__isnull=False).select_related("member").order_by("-ended_at")[:MAX_SESSIONS]
        for session in ended:
            lines = []
            for turn in session.turns.order_by("seq"):
                calls = ", ".join(c["name"] for c in turn.tool_calls or [])
                lines.append(f"[{turn.role}{' ' + turn.tool_name if turn.tool_name else ''}] {turn.content[:1500]}"
                             + (f" (calls: {calls})" if calls else ""))
            if lines:
                yield SessionItem(key=f"{SESSION_KEY}{session.pk}", member_key=str(session.member_id),
                                  domains=list(session.member.rule_domains), text="\n".join(lines),
                                  owner=owner_key(session.member.space_id))

    def outbox_items(self) -> Iterable[OutboxItem]:
        edited = Message.objects.filter(recipient_name="operator", accepted_at__isnull=False).exclude(accepted_body="")
        for msg in edited.select_related("sender").order_by("id"):
            domains = list(msg.sender.rule_domains) if msg.sender_id else []
            yield OutboxItem(key=f"outbox:{msg.pk}", domains=domains, original=msg.body, edited=msg.accepted_body,
                             owner=owner_key(msg.space_id))

    def corrections(self) -> Iterable[Correction]:
        denied = Approval.objects.filter(status=ApprovalStatus.DENIED).exclude(reason="").select_related("member")
        for approval in denied.order_by("id"):
            yield Correction(key=f"approval:{approval.pk}", domains=list(approval.member.rule_domains),
                             text=f"approval denied: {approval.tool_name} {approval.tool_args}; reason: {approval.reason}",
                             owner=owner_key(approval.member.space_id))

    def write_memory(self, member_key: str, name: str, content: str) -> None:
        """A note lands as a dated section of a readable topic file `<name>.md` (through the memory
        verb and its caps); a note named only after its session goes to one `session-notes.md`."""
        member = Member.objects.get(pk=int(member_key))
        topic = "session-notes" if SESSION_NOTE.match(name) else name
        stamp = timezone.now().strftime("%Y-%m-%d %H:%M UTC")
        first, _, rest = content.strip().partition("\n")
        heading, body = (first.lstrip("#").strip(), rest.strip()) if first.startswith("#") else (name, content.strip())
        section = f"## {heading} ({stamp})\n\n{body}"
        memory.append_note(member, topic, section, title=f"{topic.replace('-', ' ').capitalize()} (distilled by learning)",
                           actor="learning")

    def routed_domains(self) -> set[tuple[str, str]]:
        rows = Member.objects.filter(removed_at__isnull=True).values_list("space_id", "rule_domains")
        return {(owner_key(space_id), d) for space_id, domains in rows for d in domains or ()}


def auto_approve(domain) -> bool:
    """A space's own domain applies proposals without review when that space does not require
    review. Global and unowned domains always wait for a person (staff): they are nobody's to waive."""
    if getattr(domain, "is_global", True):
        return False
    space_id = space_id_of(getattr(domain, "owner", ""))
    if space_id is None:
        return False
    return Space.objects.filter(pk=space_id, rule_review_required=False).exists()
