"""The host side of the learning app: what it may mine (finished transcripts, approval denials
with a reason), where distilled notes go (member memory files), and which model its passes use.
learning never imports veronica; settings point it here (LEARNING_SOURCE / LEARNING_COMPLETE)."""
from __future__ import annotations

import os
import re
from typing import Iterable

from django.utils import timezone

from learning.sources import Correction, OutboxItem, SessionItem
from veronica import memory
from veronica.models import Approval, ApprovalStatus, Member, Message, Session

MAX_SESSIONS = 200
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
                yield SessionItem(key=f"session:{session.pk}", member_key=str(session.member_id),
                                  domains=list(session.member.rule_domains), text="\n".join(lines))

    def outbox_items(self) -> Iterable[OutboxItem]:
        edited = Message.objects.filter(recipient_name="operator", accepted_at__isnull=False).exclude(accepted_body="")
        for msg in edited.select_related("sender").order_by("id"):
            domains = list(msg.sender.rule_domains) if msg.sender_id else []
            yield OutboxItem(key=f"outbox:{msg.pk}", domains=domains, original=msg.body, edited=msg.accepted_body)

    def corrections(self) -> Iterable[Correction]:
        denied = Approval.objects.filter(status=ApprovalStatus.DENIED).exclude(reason="").select_related("member")
        for approval in denied.order_by("id"):
            yield Correction(key=f"approval:{approval.pk}", domains=list(approval.member.rule_domains),
                             text=f"approval denied: {approval.tool_name} {approval.tool_args}; reason: {approval.reason}")

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

    def routed_domains(self) -> set[str]:
        return {d for domains in Member.objects.filter(removed_at__isnull=True).values_list("rule_domains", flat=True) for d in domains}


def make_complete():
    """VERONICA_LEARNING_MODEL picks the passes' model (default: the offline heuristic)."""
    spec = os.environ.get("VERONICA_LEARNING_MODEL", "offline")
    if spec == "offline":
        from learning.offline import complete

        return complete
    from veronica.agent.providers import get_provider

    provider = get_provider(spec)

    def complete(system: str, prompt: str) -> str:
        return provider.complete(system, [{"role": "user", "content": prompt}], [], should_stop=lambda: False).text
    return complete


def auto_approve(domain: str) -> bool:
    """A domain's proposals apply without review only if every space routing it allows that."""
    # JSON containment lookups differ between SQLite and PostgreSQL; the member list is small.
    spaces = [m.space for m in Member.objects.filter(removed_at__isnull=True).select_related("space") if domain in m.rule_domains]
    return bool(spaces) and all(not s.rule_review_required for s in spaces)
