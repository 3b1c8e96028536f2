"""What the host hands the learning app: a Source of items to mine, and a `complete` callable.

`learning` never imports the host. Every item carries `owner`, the host's opaque key for the tenant
it came from: its lessons go to that owner's domains (and to global domains it routes), never to
another owner's. The host points two settings at its own code:

* LEARNING_SOURCE   dotted path to a class or zero-argument factory returning a `Source`
                    (unset: an EmptySource, so passes find nothing to do);
* LEARNING_COMPLETE dotted path to a zero-argument factory returning `complete(system, prompt) -> str`
                    (unset: learning.offline.make_complete, the deterministic offline provider).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol, runtime_checkable

from django.conf import settings
from django.utils.module_loading import import_string

Complete = Callable[[str, str], str]


@dataclass(frozen=True)
class SessionItem:
    key: str  # unique per session (the reflect ledger and the distill ledger are keyed on it)
    member_key: str  # passed back to Source.write_memory by distill
    domains: list[str]  # the member's routed rule domains
    text: str  # the transcript, rendered as text
    owner: str = ""  # whose domains `domains` names (the host's opaque key, e.g. "space:12")


@dataclass(frozen=True)
class OutboxItem:
    key: str  # unique per outbox item
    domains: list[str]
    original: str  # what the member wrote
    edited: str  # what the operator accepted after editing
    owner: str = ""


@dataclass(frozen=True)
class Correction:
    key: str  # unique PER CORRECTION (a second correction of the same thing is a new key)
    domains: list[str]
    text: str  # e.g. "approval denied: run_command rm -rf build/; reason: ..."
    owner: str = ""


@runtime_checkable
class Source(Protocol):
    def sessions(self) -> Iterable[SessionItem]:
        """Finished sessions that may be mined (reflect) and distilled (distill)."""

    def outbox_items(self) -> Iterable[OutboxItem]:
        """Messages to the operator that the operator edited before accepting."""

    def corrections(self) -> Iterable[Correction]:
        """Approval denials with a reason, and operator corrections."""

    def write_memory(self, member_key: str, name: str, content: str) -> None:
        """Write (create or replace) one memory file of a member. Called by distill."""

    def routed_domains(self) -> set[tuple[str, str]]:
        """(owner, reference) pairs routed to at least one member (for the start-up check); a
        reference is a bare name in that owner's namespace or global:<name>. A bare string
        stands for ("", string)."""


class EmptySource:
    """The default when LEARNING_SOURCE is unset: nothing to mine, nowhere to write."""

    def sessions(self):
        return []

    def outbox_items(self):
        return []

    def corrections(self):
        return []

    def write_memory(self, member_key, name, content):
        raise RuntimeError("learning has no source configured (set LEARNING_SOURCE) to write memory to")

    def routed_domains(self):
        return set()


@dataclass
class StaticSource:
    """An in-memory source: for tests, the demo, and hosts that collect items themselves."""

    session_items: list[SessionItem] = field(default_factory=list)
    outbox: list[OutboxItem] = field(default_factory=list)
    correction_items: list[Correction] = field(default_factory=list)
    routed: set[str] = field(default_factory=set)
    memory: dict[tuple[str, str], str] = field(default_factory=dict)

    def sessions(self):
        return list(self.session_items)

    def outbox_items(self):
        return list(self.outbox)

    def corrections(self):
        return list(self.correction_items)

    def write_memory(self, member_key, name, content):
        self.memory[(member_key, name)] = content

    def routed_domains(self):
        return set(self.routed)


def get_source() -> Source:
    path = getattr(settings, "LEARNING_SOURCE", None)
    if not path:
        return EmptySource()
    factory = import_string(path) if isinstance(path, str) else path
    return factory()


def get_complete() -> Complete:
    path = getattr(settings, "LEARNING_COMPLETE", None) or "learning.offline.make_complete"
    factory = import_string(path) if isinstance(path, str) else path
    fn = factory()
    if not callable(fn):
        raise TypeError(f"LEARNING_COMPLETE factory {path!r} returned {type(fn).__name__}, not a callable")
    return fn
