"""The engine ticker: a thread in every qcluster, one of which is active per deployment.

Every worker host runs one (started by `manage.py qcluster`, no set-up step). Each beat, every
ticker tries to hold the `engine-ticker` role (one conditional UPDATE on the database's clock);
the holder runs `tick()`, the others only renew their claim attempt and watch the soonest run lease
end, expiring it themselves when it runs out (so recovery never waits on a hand-over of the role).
A holder that dies stops renewing, and a follower takes the role over within `role_ttl()` seconds. So a killed worker's
member is running again within its run lease + about one tick period, and an idle deployment costs
a handful of indexed statements per period, none per member.

A ticker cut off from its database logs every failed beat and keeps retrying, and marks its host
cut off (veronica.engine.outage: the host fetches no wakes) until a beat gets through; it never holds up
the cluster's shutdown (it is a daemon thread, and the qcluster command bounds the stop).
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid

from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, connection
from veronica.engine import clock, leases, outage

log = logging.getLogger(__name__)
ROLE = "engine-ticker"


STALL_SLACK = 5.0  # a beat's statements take milliseconds; one this late is waiting on a database it cannot reach


def role_ttl(period: float) -> float:
    """How long a holder keeps the role without renewing: one beat plus a second of slack. Short, as
    a dead holder's members wait on it: with kills every few seconds the holder and then its successor
    may both die (bench/recovery.py saw kill -> lease expired take 16.9 s with period + 2), and two
    hand-overs must still fit inside a run lease. A late beat that lets the role move costs nothing
    (every duty of the tick is a conditional update, safe to run twice)."""
    return period + 1


def holder_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Ticker(threading.Thread):
    def __init__(self, period: float | None = None, holder: str | None = None) -> None:
        super().__init__(name="veronica-engine-ticker", daemon=True)
        self.period = float(period or settings.ENGINE_TICK_SECONDS)
        self.holder = holder or holder_id()
        self.leading = False
        self.failures = 0
        self.expiry_deadline: float | None = None  # time.monotonic() when the soonest run lease runs out
        self.beat_started: float | None = None  # time.monotonic() when the beat's role statement was sent
        self._stall_noted = False
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        log.info("engine ticker %s started (every %.0fs)", self.holder, self.period)
        while not self._stop_event.is_set():
            started = time.monotonic()
            self.beat()
            self._stop_event.wait(self.pause(time.monotonic() - started))
        self._hand_back()

    def pause(self, spent: float) -> float:
        """Until the next beat: one period, or less when a run lease runs out sooner (the
        holder then expires it right away; the host clock only times the wait, the database's
        clock still decides). The lease's time left is measured on the database's clock when the tick
        read it, then counted down on this host's monotonic clock: a host whose wall clock is wrong
        neither spins (ahead) nor oversleeps (behind)."""
        wait = self.period - spent
        if self.expiry_deadline is not None:  # holder and followers alike (see _follow)
            wait = min(wait, self.expiry_deadline - time.monotonic() + 0.05)
        return max(0.05, wait)

    def beat(self) -> dict | None:
        """One period: hold (or try to take) the role; the holder ticks. Never raises."""
        from veronica.engine import tick

        self.beat_started = time.monotonic()
        try:
            if not connection.in_atomic_block:  # (tests call beat() inside their transaction)
                close_old_connections()  # the thread's own connection: health-checked like a request's
            held = leases.hold_role(ROLE, self.holder, role_ttl(self.period))
            self.beat_started = None  # (watched: one indexed UPDATE; the tick's duties may take long)
            if not held:
                if self.leading:
                    log.warning("engine ticker %s lost the role to another process", self.holder)
                self.leading = False
                self._recovered()  # the role's statement got through: this host reaches its database
                self._follow()
                return None
            if not self.leading:
                log.info("engine ticker %s is the active ticker", self.holder)
            self.leading = True
            read_at = time.monotonic()
            with clock.ticking() as db_time:
                summary = tick.tick()
                soonest = leases.next_expiry()
            self.expiry_deadline = None if soonest is None else read_at + (soonest - db_time).total_seconds()
            self._recovered()
            return summary
        except Exception as exc:
            self.failures += 1
            self.leading = False
            self.expiry_deadline = None  # a database we cannot reach is retried once a period, not at a lease end
            if isinstance(exc, (OperationalError, InterfaceError)):
                outage.mark_down()  # this host's pusher stops fetching wakes until a beat gets through
            log.warning("engine ticker %s: beat failed (%s: %s); retry %d in %.0fs", self.holder, type(exc).__name__,
                        str(exc).strip().splitlines()[0][:200] if str(exc).strip() else "", self.failures, self.period)
            if not connection.in_atomic_block:
                try:
                    connection.close()  # a broken socket: reconnect at the next beat
                except Exception:
                    pass
            return None
        finally:
            self.beat_started = None

    def _follow(self) -> None:
        """A follower's beat: when a run lease it was waiting for has run out, expire it now rather
        than wait for the holder, which may have died in the same kill (a hand-over of the role costs
        its TTL plus a beat, and a starved host adds to both); then note when the next one runs out.
        One statement when nothing is due."""
        from veronica.engine import tick

        if self.expiry_deadline is not None and time.monotonic() >= self.expiry_deadline:
            tick.expire_due_leases()
        read_at = time.monotonic()
        left = leases.seconds_to_next_expiry()
        self.expiry_deadline = None if left is None else read_at + left

    def stall_seconds(self) -> float:
        return self.period + STALL_SLACK

    def watch(self) -> None:
        """Called from another thread (the qcluster's main loop): a beat's role statement stuck on the
        database for longer than stall_seconds() is a partition until it says otherwise (a packet that is never
        answered fails only after the connect or TCP user timeout, 10-20 s): the host stops fetching
        wakes now, and the beat that gets through lifts the note."""
        started = self.beat_started
        if started is None or time.monotonic() - started < self.stall_seconds() or not outage.network_database():
            self._stall_noted = False
            return
        outage.mark_down()
        if not self._stall_noted:
            self._stall_noted = True
            log.warning("engine ticker %s: a beat has waited on the database for %.0fs; this host takes no wakes until "
                        "it answers", self.holder, time.monotonic() - started)

    def _recovered(self) -> None:
        outage.mark_up()  # the beat's statements got through: the host takes wakes again
        if self.failures:
            log.warning("engine ticker %s: database reachable again after %d failed beats", self.holder, self.failures)
        self.failures = 0

    def _hand_back(self) -> None:
        try:
            if self.leading:
                leases.release_role(ROLE, self.holder)
            connection.close()
        except Exception:
            pass
        log.info("engine ticker %s stopped", self.holder)
