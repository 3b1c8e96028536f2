"""Provider limits: every model call to a limited endpoint (or model) first takes its place in a
queue shared by every worker on every host, then a concurrency slot and its share of the request /
token budgets, so fifty members waking at once queue fairly (first come, first served) instead of
sending fifty calls into a 429 storm. Redis holds the state in hosted mode (limiter_redis), the
database in embedded mode (limiter_db); configuration in limit_config (VERONICA_PROVIDER_LIMITS).

* A slot is a lease: the caller renews it while the call runs (from `should_stop`, which the SDK
  wrapper polls on the caller's thread); a killed worker's slot frees itself at expiry.
* Waiting holds no transaction and stays cancellable (suspend / remove / lease lost); threads of one
  process waiting on the same limit are woken at once when a slot is released here.
* A 429 / 529 the vendor still sends (another client sharing the key) pauses the limit for its
  Retry-After, for every caller, instead of each one finding out by itself.
* The token estimate (characters / 4) is debited before the call and corrected by its usage after.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from contextlib import contextmanager

from django.conf import settings

from veronica.agent.providers.base import Cancelled, EventSink, Reply
from veronica.agent.providers.limit_config import Limit, limits_for

log = logging.getLogger(__name__)

POLL_MIN, POLL_MAX = 0.02, 2.0
# How long a call holds its slot, per limit, as this process saw it (an average): a waiter many
# waves back sleeps through the waves ahead of it instead of polling the shared store every few ms.
_hold: dict[str, float] = {}
_backend = None
_backend_lock = threading.Lock()
_released = threading.Condition()  # same-process waiters retry at once when a slot comes back


def backend():
    """The deployment's limiter: Redis when REDIS_URL is set, else the database."""
    global _backend
    with _backend_lock:
        if _backend is None:
            if settings.REDIS_URL:
                from veronica.agent.providers.limiter_redis import RedisLimiter

                _backend = RedisLimiter()
            else:
                from veronica.agent.providers.limiter_db import DbLimiter

                _backend = DbLimiter()
        return _backend


def reset_backend(new=None) -> None:
    """Tests: use another backend (or the default one again)."""
    global _backend
    with _backend_lock:
        _backend = new


def configured(spec: str, base_url: str) -> list[Limit]:
    return limits_for(getattr(settings, "PROVIDER_LIMITS", {}) or {}, spec, base_url)


class Held:
    """The slots one call holds; renewed from the caller's should_stop, released once."""

    def __init__(self, limits: list[Limit], tickets: list[str], tokens: int, store) -> None:
        self.limits, self.tickets, self.tokens, self.store = limits, tickets, tokens, store
        self.renew_at = self.since = time.monotonic()
        self.renew_at += self._every()
        self.used: int | None = None

    def _every(self) -> float:
        return min((limit.lease_seconds for limit in self.limits), default=60) / 3

    def renew(self) -> None:
        if time.monotonic() < self.renew_at:
            return
        self.renew_at = time.monotonic() + self._every()
        for limit, ticket in zip(self.limits, self.tickets):
            try:
                if not self.store.renew(limit, ticket):
                    log.warning("provider limit %s: the slot of a call in flight expired before it was renewed", limit.key)
            except Exception:  # noqa: BLE001 - a limiter hiccup must not fail a call already running
                log.exception("provider limit %s: renewing a slot failed", limit.key)

    def release(self) -> None:
        delta = (self.used - self.tokens) if self.used is not None else 0
        held_for = time.monotonic() - self.since
        for limit in self.limits:
            _hold[limit.key] = 0.8 * _hold.get(limit.key, held_for) + 0.2 * held_for
        for limit, ticket in zip(self.limits, self.tickets):
            try:
                self.store.release(limit, ticket, delta)
            except Exception:  # noqa: BLE001 - the lease expires by itself
                log.exception("provider limit %s: releasing a slot failed (it frees itself at expiry)", limit.key)
        with _released:
            _released.notify_all()


def acquire(limits: list[Limit], tokens: int, *, should_stop, on_event: EventSink | None = None, store=None) -> Held:
    """Wait (cancellable) for every limit in order; the slots taken so far are given back on cancel."""
    store = store or backend()
    tickets: list[str] = []
    try:
        for limit in limits:
            ticket = uuid.uuid4().hex
            _wait_for(limit, ticket, tokens, store, should_stop, on_event)
            tickets.append(ticket)
    except BaseException:
        Held(limits[:len(tickets)], tickets, tokens, store).release()
        raise
    return Held(limits, tickets, tokens, store)


def _wait_for(limit: Limit, ticket: str, tokens: int, store, should_stop, on_event) -> None:
    store.enqueue(limit, ticket)
    told = False
    try:
        while True:
            wait, ahead = store.try_acquire(limit, ticket, tokens)
            if wait <= 0:
                return
            if not told and on_event is not None:
                told = True
                on_event({"type": "queued", "limit": limit.key, "ahead": ahead, "wait": round(wait, 2)})
            if should_stop():
                raise Cancelled(f"cancelled while queued for {limit.key}")
            with _released:
                _released.wait(min(max(wait, _waves_ahead(limit, ahead), POLL_MIN), POLL_MAX))
    except BaseException:
        try:
            store.leave(limit, ticket)
        except Exception:  # noqa: BLE001 - a dead waiter is dropped at its heartbeat's expiry anyway
            log.exception("provider limit %s: leaving the queue failed", limit.key)
        raise


def _waves_ahead(limit: Limit, ahead: int) -> float:
    """Sleep through most of the waves of calls ahead (a released slot here wakes us anyway)."""
    if not limit.concurrency or ahead < limit.concurrency:
        return 0.0
    return (ahead // limit.concurrency) * _hold.get(limit.key, 0.0) * 0.7


class LimitedProvider:
    """A provider whose calls go through the limits configured for its endpoint and model."""

    def __init__(self, inner, limits: list[Limit], store=None) -> None:
        self.inner, self.limits, self.store = inner, limits, store
        self.label = inner.label

    def __getattr__(self, name):  # model, base_url, cfg, ... of the wrapped provider
        return getattr(self.inner, name)

    def complete(self, system: str, messages: list[dict], tools: list[dict], *, should_stop, on_event=None) -> Reply:
        from veronica.agent.providers.sdk import estimate_tokens

        estimate = estimate_tokens(system, messages, tools)
        held = acquire(self.limits, estimate, should_stop=should_stop, on_event=on_event, store=self.store)
        store = held.store

        def polled() -> bool:  # the SDK wrapper polls this on the caller's thread all through the call
            held.renew()
            return should_stop()

        def relayed(event: dict) -> None:
            if event.get("type") == "retry" and str(event.get("reason", "")).startswith(("HTTP 429", "HTTP 529")):
                for limit in self.limits:  # the vendor said slow down: everyone holds back, not only this call
                    _quietly(store.pause, limit, float(event.get("delay") or 1.0))
            if on_event is not None:
                on_event(event)

        try:
            reply = self.inner.complete(system, messages, tools, should_stop=polled, on_event=relayed)
            held.used = reply.usage.total
            return reply
        except Exception as exc:
            usage = getattr(exc, "usage", None)
            held.used = usage.total if usage is not None else None
            raise
        finally:
            held.release()


def _quietly(fn, *args) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001
        log.exception("provider limit: %s failed", getattr(fn, "__name__", fn))


def wrap(provider, spec: str):
    """The provider, behind its limits when any are configured for its endpoint or model."""
    limits = configured(spec, getattr(provider, "base_url", "") or "")
    return LimitedProvider(provider, limits) if limits else provider


@contextmanager
def overridden(config: dict[str, Limit]):
    """Tests and the bench: other limits for a while."""
    old = getattr(settings, "PROVIDER_LIMITS", {})
    settings.PROVIDER_LIMITS = config
    try:
        yield
    finally:
        settings.PROVIDER_LIMITS = old
