"""The passes: reflect, learn, distill.

Each pass: takes the store's writer lock BEFORE reading the state it acts on (the ledgers, the
unconsumed reflections), calls the model with no transaction open, and commits each item's result
in one short fenced transaction (see learning.lock). Bad model output is recorded on the PassRun
and changes nothing; the item stays unmined and is retried by the next pass.

No pass writes user rules: this module has no code path to them (learn's ops address learned
rules only, and auto-approve goes through the same gate a person's approval does).
"""
from __future__ import annotations

import hashlib
import logging
import traceback
from datetime import timedelta
from typing import Callable, Iterable

from django.conf import settings
from django.db.models import Q
from django.utils import timezone
from django.utils.module_loading import import_string

from . import store
from .lock import LeaseLost, LockBusy, WriterLock
from .models import (
    MAX_ACTIVE_RULES_PER_DOMAIN,
    Domain,
    MinedItem,
    MinedKind,
    PassKind,
    PassRun,
    PassStatus,
    Proposal,
    Reflection,
)
from .ops import MAX_OPS_PER_PROPOSAL, GateError, OpError, apply_ops, canonicalize, norm_text, snapshot_diff
from .parsing import ParseError
from .prompts import (
    DISTILL_SYSTEM,
    LEARN_SYSTEM,
    REFLECT_SYSTEM,
    distill_prompt,
    learn_prompt,
    parse_distill,
    parse_learn_covering,
    parse_reflect,
    reflect_prompt,
)
from .sources import Complete, Source, get_complete, get_source

log = logging.getLogger("learning.passes")
Progress = Callable[[str], None] | None
MAX_ERRORS_KEPT = 50


def ledger_key(key: object) -> str:
    """Ledger keys fit in 255 characters; a longer key keeps a prefix and a hash of the whole."""
    text = str(key)
    if len(text) <= 255:
        return text
    return text[:190] + "#" + hashlib.sha256(text.encode()).hexdigest()


def default_domain() -> str:
    return getattr(settings, "LEARNING_DEFAULT_DOMAIN", "general")


def item_domains(domains: Iterable[str] | None, owner: str = "") -> list[Domain]:
    """The domains an item's lessons go to: the item owner's own domains it routes (created on
    first use) and the existing global domains it routes; the owner's default domain when none."""
    out: list[Domain] = []
    for ref in domains or ():
        try:
            d = store.domain_for(ref, owner)
        except store.RuleInputError:
            continue
        if d is not None and d not in out:
            out.append(d)
    return out or [store.domain_for(default_domain(), owner)]


def max_item_chars() -> int:
    return int(getattr(settings, "LEARNING_MAX_ITEM_CHARS", 20000))


class _Run:
    """Bookkeeping shared by the passes: PassRun row, progress, error list, the lock."""

    def __init__(self, kind: str, progress: Progress, wait: float | None, ttl: float | None):
        self.kind = kind
        self.progress_fn = progress
        self.wait = wait
        self.run = PassRun.objects.create(kind=kind, stats={})
        self.lock = WriterLock(ttl=ttl, label=f"learning {kind} run #{self.run.pk}")
        self.stats: dict[str, int] = {}
        self.errors: list[dict] = []

    def say(self, message: str) -> None:
        log.debug("%s: %s", self.kind, message)
        if self.progress_fn:
            self.progress_fn(message)

    def count(self, name: str, n: int = 1) -> None:
        self.stats[name] = self.stats.get(name, 0) + n

    def error(self, where: str, message: str) -> None:
        self.count("errors")
        if len(self.errors) < MAX_ERRORS_KEPT:
            self.errors.append({"item": where, "error": message[:1000]})
        self.say(f"error {where}: {message}")

    def finish(self, status: str) -> PassRun:
        self.run.status = status
        self.run.finished_at = timezone.now()
        self.run.stats = self.stats
        self.run.errors = self.errors
        self.run.save(update_fields=["status", "finished_at", "stats", "errors"])
        keep_days = int(getattr(settings, "LEARNING_PASSRUN_KEEP_DAYS", 30))
        if keep_days > 0:  # scheduled passes run every few minutes; keep the log bounded
            PassRun.objects.filter(finished_at__lt=self.run.finished_at - timedelta(days=keep_days)).delete()
        return self.run

    def execute(self, body: Callable[["_Run"], None]) -> PassRun:
        try:
            self.lock.acquire(self.wait)
        except LockBusy as exc:
            self.error("lock", str(exc))
            return self.finish(PassStatus.BUSY)
        self.say(f"took the writer lock ({self.lock.label})")
        try:
            body(self)
        except LeaseLost as exc:
            self.error("lock", str(exc))
            return self.finish(PassStatus.LOST)
        except Exception as exc:
            self.error("pass", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}")
            try:
                self.finish(PassStatus.CRASHED)
            finally:
                self._release()
            raise
        self._release()
        status = PassStatus.ERROR if self.stats.get("errors") else PassStatus.OK
        self.say(f"done: {self.stats or 'nothing to do'}")
        log.info("learning %s run #%s: %s", self.kind, self.run.pk, self.stats or "nothing to do")
        return self.finish(status)

    def _release(self) -> None:
        try:
            self.lock.release()
        except Exception:  # the lease expires on its own; never mask the pass's result
            log.exception("could not release the learning writer lock")

    def ask(self, complete: Complete, system: str, prompt: str, where: str) -> str | None:
        self.lock.renew()  # a long model call starts with a fresh lease
        try:
            return complete(system, prompt)
        except Exception as exc:  # provider down, timeout, ...: this item fails, the pass goes on
            self.error(where, f"model call failed: {type(exc).__name__}: {exc}")
            return None


# --- reflect --------------------------------------------------------------------------------------

def run_reflect(source: Source | None = None, complete: Complete | None = None, progress: Progress = None, *,
                wait: float | None = None, lock_ttl: float | None = None) -> PassRun:
    """Turn unmined sessions, outbox edits and corrections into reflections."""
    source = source if source is not None else get_source()
    complete = complete if complete is not None else get_complete()

    def body(r: _Run) -> None:
        feeds = (
            (MinedKind.SESSION, source.sessions),
            (MinedKind.OUTBOX, source.outbox_items),
            (MinedKind.CORRECTION, source.corrections),
        )
        for kind, feed in feeds:
            # Read this ledger now that we hold the lock: the read is where the race lives.
            mined = set(MinedItem.objects.filter(kind=kind).values_list("key", flat=True))
            for item in feed():
                key = ledger_key(item.key)
                if key in mined:
                    continue
                mined.add(key)
                where = f"{kind}:{key}"
                targets = item_domains(getattr(item, "domains", None), str(getattr(item, "owner", "") or ""))
                by_ref = {d.ref: d for d in targets}
                domains = list(by_ref)
                if kind == MinedKind.OUTBOX:
                    prompt = reflect_prompt(kind, key, domains, original=str(item.original or ""),
                                            edited=str(item.edited or ""),
                                            max_chars=max_item_chars())
                else:
                    prompt = reflect_prompt(kind, key, domains, member=str(getattr(item, "member_key", "") or ""),
                                            text=str(item.text or ""), max_chars=max_item_chars())
                raw = r.ask(complete, REFLECT_SYSTEM, prompt, where)
                if raw is None:
                    continue
                try:
                    lessons = parse_reflect(raw, domains)
                except ParseError as exc:
                    r.error(where, f"bad model output: {exc}")
                    continue
                with r.lock.fence():
                    MinedItem.objects.create(kind=kind, key=key, pass_run=r.run)
                    Reflection.objects.bulk_create([
                        Reflection(kind=kind, item_key=key, member_key=str(getattr(item, "member_key", "") or "")[:150],
                                   domain=by_ref[domain], text=text, pass_run=r.run)
                        for domain, text in lessons
                    ])
                r.count(f"mined_{kind}")
                r.count("reflections", len(lessons))
                r.say(f"mined {where}: {len(lessons)} lesson(s)")

    return _Run(PassKind.REFLECT, progress, wait, lock_ttl).execute(body)


# --- learn ----------------------------------------------------------------------------------------

def _auto_approve_for(auto_approve, domain: Domain) -> bool:
    if callable(auto_approve):
        return bool(auto_approve(domain))
    if isinstance(auto_approve, str):
        return bool(import_string(auto_approve)(domain))
    return bool(auto_approve)


def run_learn(domain=None, complete: Complete | None = None, auto_approve=False,
              progress: Progress = None, *, wait: float | None = None, lock_ttl: float | None = None) -> PassRun:
    """Consolidate unconsumed reflections into a Proposal of ops per domain. `domain`: only this
    Domain, or only the domains a reference names (a bare name: that name in every owner's
    namespace). `auto_approve`: a bool, or a callable(Domain) -> bool; an auto-approved proposal
    passes the same gate as a person's."""
    complete = complete if complete is not None else get_complete()
    if isinstance(domain, Domain):
        only = Q(domain_id=domain.pk)
    elif domain:
        is_global, name = store.clean_ref(domain)
        only = Q(domain__name=name, domain__is_global=is_global)
    else:
        only = Q()

    def body(r: _Run) -> None:
        pending = Reflection.objects.filter(only, consumed_at__isnull=True)
        ids = sorted(set(pending.values_list("domain_id", flat=True)))
        for d in Domain.objects.filter(pk__in=ids).order_by("id"):
            reflections = list(Reflection.objects.filter(consumed_at__isnull=True, domain=d).order_by("id")[:100])
            if not reflections:
                continue
            base = store.learned_snapshot(d)
            users = store.user_snapshot(d)
            prompt = learn_prompt(d.name, users, base, [{"kind": x.kind, "text": x.text} for x in reflections],
                                  max_active=MAX_ACTIVE_RULES_PER_DOMAIN)
            raw = r.ask(complete, LEARN_SYSTEM, prompt, f"domain:{d}")
            if raw is None:
                continue
            try:
                ops, rationale, covered = parse_learn_covering(raw)
                ops = canonicalize(ops, base, [u["text"] for u in users])
                result = apply_ops(base, ops, max_active=MAX_ACTIVE_RULES_PER_DOMAIN)
            except GateError as exc:
                r.count("gate_refusals")
                r.error(f"domain:{d}", f"refused by the gate: {exc}")
                continue
            except (ParseError, OpError) as exc:
                r.error(f"domain:{d}", f"bad model output: {exc}")
                continue
            ids = [x.pk for i, x in enumerate(reflections) if _covers(covered, ops, i, x.text)]
            left = len(reflections) - len(ids)
            if left:
                r.count("reflections_waiting", left)
            with r.lock.fence():
                now = timezone.now()
                if not ops:
                    Reflection.objects.filter(pk__in=ids).update(consumed_at=now)
                    r.count("no_change")
                    r.say(f"{d}: reflections already covered; nothing to propose")
                    continue
                proposal = Proposal.objects.create(
                    domain=d, ops=ops, base=base, diff=snapshot_diff(base, result), rationale=rationale,
                    pass_run=r.run,
                )
                Reflection.objects.filter(pk__in=ids).update(consumed_at=now, proposal=proposal)
            r.count("proposals")
            r.say(f"{d}: proposal #{proposal.pk} with {len(ops)} op(s)")
            if _auto_approve_for(auto_approve, d):
                from .people import ReviewError, approve_proposal  # learned rules only, same gate

                try:
                    approve_proposal(proposal.pk, actor="auto-approve (learn pass)")
                    Proposal.objects.filter(pk=proposal.pk).update(auto_approved=True)
                    r.count("auto_approved")
                    r.say(f"{d}: proposal #{proposal.pk} auto-approved")
                except ReviewError as exc:
                    r.error(f"domain:{d}", f"auto-approve refused, left for review: {exc}")

    return _Run(PassKind.LEARN, progress, wait, lock_ttl).execute(body)


def _covers(covered: set[int] | None, ops: list[dict], index: int, text: str) -> bool:
    """Whether the answer covers this reflection, so it is consumed: cited by the answer, or (an
    answer that cites nothing) the proposal had room for every lesson, or an op carries its text."""
    if covered is not None:
        return index in covered
    if len(ops) < MAX_OPS_PER_PROPOSAL:
        return True
    return any(norm_text(op.get("text", "")) == norm_text(text) for op in ops)


# --- distill --------------------------------------------------------------------------------------

def run_distill(source: Source | None = None, complete: Complete | None = None, progress: Progress = None, *,
                wait: float | None = None, lock_ttl: float | None = None) -> PassRun:
    """Turn each undistilled session into durable notes in the member's memory (source.write_memory)."""
    source = source if source is not None else get_source()
    complete = complete if complete is not None else get_complete()

    def body(r: _Run) -> None:
        done = set(MinedItem.objects.filter(kind=MinedKind.DISTILLED).values_list("key", flat=True))
        for item in source.sessions():
            key = ledger_key(item.key)
            if key in done:
                continue
            done.add(key)
            where = f"session:{key}"
            prompt = distill_prompt(key, str(item.member_key or ""), str(item.text or ""), max_chars=max_item_chars())
            raw = r.ask(complete, DISTILL_SYSTEM, prompt, where)
            if raw is None:
                continue
            try:
                notes = parse_distill(raw)
            except ParseError as exc:
                r.error(where, f"bad model output: {exc}")
                continue
            try:
                # One transaction: when the host's memory lives in the same database, the notes and
                # the ledger mark commit together; if write_memory fails, the item stays undistilled.
                with r.lock.fence():
                    for name, content in notes:
                        source.write_memory(item.member_key, name, content)
                    MinedItem.objects.create(kind=MinedKind.DISTILLED, key=key, pass_run=r.run)
            except LeaseLost:
                raise
            except Exception as exc:
                r.error(where, f"write_memory failed: {type(exc).__name__}: {exc}")
                continue
            r.count("distilled")
            r.count("notes", len(notes))
            r.say(f"distilled {where}: {len(notes)} note(s)")

    return _Run(PassKind.DISTILL, progress, wait, lock_ttl).execute(body)
