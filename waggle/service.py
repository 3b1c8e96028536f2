"""The interface the host calls. Plain strings, dicts and callables in; nothing from the host is
imported. Everything on a member's path (``observe``, ``follow``) is best effort: an error is
logged and swallowed, never raised into the turn.

Keys: ``space_key`` is the host's space id as a string, ``session_key`` the member-session id,
``member_key`` the member. Space-scoped waggles are only ever seen by their own space; ``global``
waggles (promoted by curation) are seen by every space.

A facade: each verb lives in its own module, and the host's callers keep reading them here.

* waggle.recording — the per-session rings, ``observe``, ``pinned``, ``read_ahead``
* waggle.sweeping  — mining a space's calls and promoting a route (``sweep``, ``promotable``)
* waggle.following — replaying a matching waggle (``follow``), hearing an inbound message (``inbound``), ``ready``
* waggle.judging   — whether a replay was used (``judge_reply``, ``end_run``, ``settle``)
* waggle.listing   — the waggles a space sees, ``run_waggle``, ``saved_tokens_per_day``
* waggle.curation  — the periodic pass (``curate``)
* waggle.common    — the logger, ``ExecFn`` and ``WaggleError`` they share
"""
from __future__ import annotations

from waggle.common import ExecFn, WaggleError
from waggle.config import WaggleConfig
from waggle.curation import CurateSummary, curate
from waggle.following import follow, inbound, ready
from waggle.judging import end_run, judge_reply, settle
from waggle.listing import list_waggles, run_waggle, saved_tokens_per_day
from waggle.recording import observe, pinned, read_ahead
from waggle.sweeping import promotable, sweep

__all__ = [
    "ExecFn", "WaggleConfig", "WaggleError", "CurateSummary", "observe", "follow", "inbound", "ready", "judge_reply",
    "end_run",
    "settle",
    "list_waggles", "run_waggle", "curate", "saved_tokens_per_day", "sweep", "pinned", "promotable",
    "read_ahead",
]
