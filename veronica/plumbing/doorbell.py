"""The embedded mode's cross-process doorbell: Unix datagram sockets beside the SQLite file.

In embedded mode the channel layer is in-memory, so a worker process's ring would never reach the
web process. Every process that streams events (a Feed in veronica.web.consumers) binds one datagram
socket in a directory derived from the database file, so exactly the processes that share a
database share a doorbell; a ring after a commit sends "space:seq" to each socket found there.

The ring only says "look": the feed reads committed rows by seq, and its poll stays as the backstop,
so a lost, late or forged datagram costs latency at most, never an event. Sending never blocks and
never fails the caller: a full receive queue drops the datagram (that process has plenty to read
already); a socket whose process died is unlinked by the first ring that meets it.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import socket
import tempfile
import uuid
from pathlib import Path
from typing import Callable

from django.conf import settings
from django.db import connections

log = logging.getLogger(__name__)

SUN_PATH_MAX = 100  # sockaddr_un holds 108 bytes; leave room for the socket's own file name
SUFFIX = ".sock"


def enabled() -> bool:
    """Embedded mode only (with channels-redis the channel layer itself crosses processes), and only
    for a database in a file: an in-memory one has no other process to ring."""
    conn = connections["default"]
    if settings.REDIS_URL or conn.vendor != "sqlite":
        return False
    name = str(conn.settings_dict["NAME"])
    return bool(name) and not name.startswith((":memory:", "file:")) and "mode=memory" not in name


_dirs: dict[str, Path] = {}


def directory() -> Path:
    """Beside the database file; under the temp dir (named by the file's hash) when that path is
    too long for a socket address."""
    name = str(connections["default"].settings_dict["NAME"])
    found = _dirs.get(name)
    if found is None:
        db = Path(os.path.realpath(name))
        found = db.parent / f".{db.name}.doorbell"
        if len(str(found)) + 32 > SUN_PATH_MAX:
            found = Path(tempfile.gettempdir()) / f"veronica-doorbell-{hashlib.sha1(str(db).encode()).hexdigest()[:16]}"
        _dirs[name] = found
    return found


_sender: tuple[int, socket.socket] | None = None


def _send_socket() -> socket.socket:
    global _sender
    if _sender is None or _sender[0] != os.getpid():  # a forked worker gets its own
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        _sender = (os.getpid(), sock)
    return _sender[1]


def ring(space_id: int, seq: int) -> None:
    """Tell every listening process to look at space_id (call after the commit)."""
    _ring(SUFFIX, f"{space_id}:{seq}".encode())


# The embedded broker's pushers (veronica.engine.qbroker) listen beside the feeds, under their own
# suffix: a ring for the queue wakes no feed, and an event wakes no pusher.
QUEUE_SUFFIX = ".qbell"


def ring_queue() -> None:
    """Tell every pusher on this database that a task was enqueued (call after its commit)."""
    if enabled():
        _ring(QUEUE_SUFFIX, b"q")


def _ring(suffix: str, payload: bytes) -> None:
    try:
        entries = list(os.scandir(directory()))
    except FileNotFoundError:
        return  # nobody has listened yet
    sender = _send_socket()
    for entry in entries:
        if not entry.name.endswith(suffix):
            continue
        try:
            sender.sendto(payload, entry.path)
        except ConnectionRefusedError:  # bound by a process that died without cleaning up
            _unlink(entry.path)
        except (BlockingIOError, FileNotFoundError):
            pass  # its queue is full (it will look anyway), or it just closed
        except OSError:
            log.debug("doorbell ring to %s failed", entry.path, exc_info=True)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class QueueBell:
    """A pusher's blocking side of the queue's doorbell: wait(timeout) returns at the first ring, or
    after timeout (the broker's poll, kept as the backstop). Rings that came while the pusher was
    busy are queued in the socket and end the next wait at once: none is missed between a poll that
    found nothing and the wait after it."""

    def __init__(self) -> None:
        folder = directory()
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.pid = os.getpid()
        self.path = str(folder / f"{self.pid}-{uuid.uuid4().hex[:8]}{QUEUE_SUFFIX}")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)

    def wait(self, timeout: float) -> bool:
        """True when rung. Drains every ring already queued, so one enqueue ends one wait."""
        import select

        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            return False
        self.sock.setblocking(False)
        try:
            while True:
                self.sock.recv(16)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            pass
        finally:
            self.sock.setblocking(True)
        return True

    def close(self) -> None:
        self.sock.close()
        _unlink(self.path)


class Listener:
    """One bound socket on an event loop; calls on_ring(space_id, seq) in the loop for each ring."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_ring: Callable[[int, int], None]) -> None:
        folder = directory()
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path = str(folder / f"{os.getpid()}-{uuid.uuid4().hex[:8]}{SUFFIX}")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self.sock.bind(self.path)
        self.loop, self.on_ring = loop, on_ring
        loop.add_reader(self.sock.fileno(), self._read)

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(64)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            space, _, seq = data.partition(b":")
            if space.isdigit() and seq.isdigit():
                self.on_ring(int(space), int(seq))

    def close(self) -> None:
        try:
            self.loop.remove_reader(self.sock.fileno())
        except Exception:  # the loop may already be closed
            pass
        self.sock.close()
        _unlink(self.path)
