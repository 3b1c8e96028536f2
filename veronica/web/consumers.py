"""The live event stream: ws /ws/spaces/<slug>/?after=<seq>.

The Event table is the truth; a ring is only a doorbell ("look again", at-most-once).

* connect: authenticate (`Authorization: Bearer <token>` for scripts, no Origin needed; else the
  session cookie through AuthMiddlewareStack, with an allowed Origin: see veronica.web.stream_auth),
  check SpaceAccess (none -> close 4404 before accept; no valid credential -> 4401), replay every
  event after the client's `after`, say {"type": "ready", "seq": n}, then stream live.
* live: one Feed per space per process looks at the table when rung and at least every
  POLL_SECONDS (the backstop for a lost ring). A ring crosses processes through Redis pub/sub
  (hosted, veronica.plumbing.redisbell: one pattern subscription per event loop) or, in the embedded default
  whose channel layer is in-memory, through the doorbell (veronica.plumbing.doorbell: a datagram socket per
  process beside the SQLite file). The feed, not each socket, hears the ring; it reads each new
  batch once and fans it out to this process's sockets on that space.
* each socket tracks last_sent: it never sends a seq twice, and on a gap (a batch starting past
  last_sent + 1) it backfills from the table first. A reconnect with after=<last seq seen> resumes
  exactly. If retention removed the rows it asks for, it gets {"type": "purged", "through": n} once
  and then the events after n. The socket is read-only (steering goes through the API): a ping gets a pong, any other
  frame (not JSON, binary, too deep) an error frame, and the socket stays open.
* re-check: every RECHECK_SECONDS (VERONICA_SOCKET_RECHECK_SECONDS; a close lands within that
  plus POLL_SECONDS) the feed re-validates all its sockets at once in at most three queries: a
  revoked token, a logged-out or invalidated session, a disabled or deleted user -> close 4401;
  access revoked -> close 4404.
"""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import DatabaseError, connections

from veronica.web import stream_auth
from veronica.swarm import access
from veronica.plumbing import doorbell, redisbell
from veronica.swarm.events import RECHECK_RING, group_name
from veronica.models import Event

log = logging.getLogger(__name__)

POLL_SECONDS: float = getattr(settings, "VERONICA_STREAM_POLL_SECONDS", 2.0 if settings.REDIS_URL else 0.5)
SUBSCRIBE_WAIT = 2.0  # seconds a feed's first socket waits for the Redis doorbell's subscription
RECHECK_SECONDS: float = getattr(settings, "VERONICA_STREAM_RECHECK_SECONDS", 5.0)
BATCH = 500
CLOSE_BAD_REQUEST, CLOSE_UNAUTHENTICATED, CLOSE_NO_ACCESS = 4400, stream_auth.CLOSE_CREDENTIALS_GONE, stream_auth.CLOSE_ACCESS_GONE


@database_sync_to_async
def _events_after(space_id: int, after: int, upto: int | None = None, limit: int = BATCH) -> list[dict]:
    qs = Event.objects.filter(space_id=space_id, seq__gt=after)
    if upto is not None:
        qs = qs.filter(seq__lte=upto)
    return [e.as_wire() for e in qs.order_by("seq")[:limit]]


# The feeds read on a thread of their own that keeps its connection: with CONN_MAX_AGE=0 every
# database_sync_to_async call opens a new one (a backend fork on PostgreSQL), and feed reads must
# not queue behind sockets' connect-time queries on the shared thread either.
_feed_thread = ThreadPoolExecutor(1, thread_name_prefix="veronica-feed-db")


def _feed_db(fn, *args):
    def guarded():
        try:
            return fn(*args)
        except DatabaseError:
            connections.close_all()  # a broken connection is replaced on the next look
            raise

    return asyncio.get_running_loop().run_in_executor(_feed_thread, guarded)


def _feed_events_after(space_id: int, after: int) -> list[dict]:
    return [e.as_wire() for e in Event.objects.filter(space_id=space_id, seq__gt=after).order_by("seq")[:BATCH]]


@database_sync_to_async
def _head(space_id: int) -> int:
    return Event.objects.filter(space_id=space_id).order_by("-seq").values_list("seq", flat=True).first() or 0


_space_id_for = database_sync_to_async(access.space_id_for)
_token_user = database_sync_to_async(stream_auth.token_user)


class Feed:
    """The per-process watcher of one space. Started by its first socket, stopped with its last.

    It alone joins the space's channel-layer group, so a ring costs one message per process, not
    one per socket; and it alone reads new rows, once per batch, for all of its sockets.
    """

    _feeds: dict[tuple[int, int], Feed] = {}

    def __init__(self, space_id: int, seen: int) -> None:
        self.space_id = space_id
        self.seen = seen  # the highest seq read from the table and handed to the sockets
        self.sockets: set[SpaceConsumer] = set()
        self.rung = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.listener: asyncio.Task | None = None
        self.channel = ""
        self.stopping = False
        self.recheck_due = False

    @classmethod
    async def join(cls, socket: SpaceConsumer) -> Feed:
        loop = asyncio.get_running_loop()
        key = (id(loop), socket.space_id)
        feed = cls._feeds.get(key)
        if feed is None:
            _Doorbells.listen(loop)  # before the head is read: a later commit is sure to ring us
            await _Doorbells.ready(loop)
            feed = cls(socket.space_id, await _head(socket.space_id))
            feed = cls._feeds.setdefault(key, feed)  # another socket may have raced us across the await
            feed.rung.set()  # a ring that came while we read the head found no feed: look once now
        feed.sockets.add(socket)
        if feed.task is None or feed.task.done():
            feed.task = asyncio.create_task(feed.run(key))
        return feed

    def leave(self, socket: SpaceConsumer) -> None:
        self.sockets.discard(socket)
        if not self.sockets:
            self.rung.set()  # let run() notice and exit

    async def run(self, key: tuple[int, int]) -> None:
        loop = asyncio.get_running_loop()
        recheck_at = loop.time() + RECHECK_SECONDS
        self.listener = asyncio.create_task(self.listen())
        try:
            while self.sockets:
                try:
                    await asyncio.wait_for(self.rung.wait(), POLL_SECONDS)
                except asyncio.TimeoutError:
                    pass
                self.rung.clear()
                if not self.sockets:
                    break
                try:
                    await self.pump()
                    if self.recheck_due or loop.time() >= recheck_at:
                        self.recheck_due = False
                        recheck_at = loop.time() + RECHECK_SECONDS
                        await self.recheck()
                except Exception:  # a database hiccup must not kill the stream; the next look retries
                    log.warning("event feed for space %s failed; retrying", self.space_id, exc_info=True)
                    await asyncio.sleep(POLL_SECONDS)
        finally:
            if Feed._feeds.get(key) is self and not self.sockets:
                del Feed._feeds[key]
            if not Feed._feeds:
                _feed_thread.submit(connections.close_all)  # an idle process holds no connection
            if not any(k[0] == key[0] for k in Feed._feeds):
                _Doorbells.close(loop)
            await self.stop_listening()

    def ring(self, seq: int) -> None:
        if seq == RECHECK_RING:  # someone logged out: re-check credentials now, not at the next period
            self.recheck_due = True
            self.rung.set()
        elif seq > self.seen:
            self.rung.set()

    async def listen(self) -> None:
        """The channel-layer doorbell: any ring for a seq we have not read makes run() look now. Hosted
        mode rings through veronica.plumbing.redisbell instead (one subscription per event loop, _Doorbells)."""
        layer = get_channel_layer()
        if layer is None or redisbell.enabled():
            return
        group = group_name(self.space_id)
        try:
            self.channel = await layer.new_channel("feed")
            await layer.group_add(group, self.channel)
            while True:
                try:
                    message = await layer.receive(self.channel)
                except asyncio.CancelledError:
                    raise
                except Exception:  # e.g. a Redis read timeout: rings meanwhile are covered by the poll
                    log.debug("feed %s: channel layer receive failed; retrying", self.space_id, exc_info=True)
                    await asyncio.sleep(POLL_SECONDS)
                    continue
                if self.stopping:
                    return
                self.ring(int(message.get("seq") or 0))
        except asyncio.CancelledError:
            raise
        except Exception:  # no doorbell at all: the poll still delivers, only later
            log.warning("event feed for space %s has no channel layer; polling only", self.space_id, exc_info=True)
        finally:
            if self.channel:
                try:
                    await layer.group_discard(group, self.channel)
                except Exception:
                    pass

    async def stop_listening(self) -> None:
        """End the listener with a message to its own channel: cancelling a channels-redis receive
        mid-read can stall for the length of its blocking read."""
        self.stopping = True
        listener = self.listener
        if listener is None or listener.done():
            return
        try:
            if self.channel:
                await get_channel_layer().send(self.channel, {"type": "feed.stop"})
            await asyncio.wait_for(asyncio.shield(listener), 2)
        except Exception:
            listener.cancel()

    async def recheck(self) -> None:
        """Credentials and access can end while a socket is open: all of this feed's sockets are
        re-validated together (at most three queries), each one that no longer holds is closed
        with its code (4401 credentials gone, 4404 access gone)."""
        sockets = list(self.sockets)
        verdicts = await _feed_db(stream_auth.recheck, self.space_id, [s.credential for s in sockets])
        for socket in sockets:
            code = verdicts.get(socket.credential)
            if code is not None:
                self.leave(socket)
                await socket.close(code=code)
        if self.channel:
            # channels-redis forgets group members after its group_expiry (a day by default)
            await get_channel_layer().group_add(group_name(self.space_id), self.channel)

    async def pump(self) -> None:
        while self.sockets:
            batch = await _feed_db(_feed_events_after, self.space_id, self.seen)
            if not batch:
                return
            self.seen = batch[-1]["seq"]
            for socket in list(self.sockets):
                try:
                    await socket.deliver(batch)
                except Exception:  # one broken socket must not cost the others this batch
                    log.info("dropping a socket of space %s that failed to take events", self.space_id, exc_info=True)
                    self.leave(socket)
                    await socket.close(code=1011)
            if len(batch) < BATCH:
                return


class _Doorbells:
    """One doorbell listener per event loop with feeds, so a worker process's commit rings this
    process's feeds: veronica.plumbing.redisbell hosted, veronica.plumbing.doorbell embedded (whose in-memory channel
    layer cannot leave the process)."""

    _listeners: dict[int, doorbell.Listener] = {}

    @classmethod
    def listen(cls, loop: asyncio.AbstractEventLoop) -> None:
        if id(loop) in cls._listeners:
            return
        on_ring = lambda space_id, seq: cls.rung(loop, space_id, seq)  # noqa: E731
        if redisbell.enabled():
            cls._listeners[id(loop)] = redisbell.Listener(loop, on_ring)
            return
        if not doorbell.enabled():
            return
        try:
            cls._listeners[id(loop)] = doorbell.Listener(loop, on_ring)
        except OSError:  # e.g. a read-only data dir: the poll still delivers, only later
            log.warning("no embedded doorbell for this process; the event stream polls only", exc_info=True)

    @classmethod
    async def ready(cls, loop: asyncio.AbstractEventLoop) -> None:
        """Until this loop's Redis subscription is live (at most SUBSCRIBE_WAIT): a commit after the
        feed reads its head must find someone subscribed. A Redis that is slow or down leaves it to the poll."""
        subscribed = getattr(cls._listeners.get(id(loop)), "subscribed", None)
        if subscribed is not None and not subscribed.is_set():
            try:
                await asyncio.wait_for(subscribed.wait(), SUBSCRIBE_WAIT)
            except asyncio.TimeoutError:
                log.warning("the event doorbell is not subscribed yet; this feed polls until it is")

    @staticmethod
    def rung(loop: asyncio.AbstractEventLoop, space_id: int, seq: int) -> None:
        feed = Feed._feeds.get((id(loop), space_id))
        if feed is not None:
            feed.ring(seq)

    @classmethod
    def close(cls, loop: asyncio.AbstractEventLoop) -> None:
        listener = cls._listeners.pop(id(loop), None)
        if listener is not None:
            listener.close()


class SpaceConsumer(AsyncJsonWebsocketConsumer):
    # No channel of its own: the space's Feed is the one group member in this process. (An alias
    # that is not configured makes Channels skip the per-socket channel and its receive loop.)
    channel_layer_alias = "veronica-socket-has-no-channel"
    space_id: int | None = None
    feed: Feed | None = None

    async def connect(self) -> None:
        self.last_sent = 0
        self.lock = asyncio.Lock()
        found = await self._authenticate()
        if found is None:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        user, self.credential = found
        space_id = await _space_id_for(user, self.scope["url_route"]["kwargs"]["slug"])
        if space_id is None:
            await self.close(code=CLOSE_NO_ACCESS)
            return
        after = self._after()
        if after is None:
            await self.close(code=CLOSE_BAD_REQUEST)
            return
        # a client ahead of the table (a restored or reset database) resumes from the table's head
        self.space_id, self.last_sent = space_id, min(after, await _head(space_id))
        await self.accept()
        await self.catch_up()
        self.feed = await Feed.join(self)
        await self.catch_up()  # whatever committed between the replay and joining the feed
        await self.send_json({"type": "ready", "seq": self.last_sent})

    async def disconnect(self, code: int) -> None:
        if self.feed is not None:
            self.feed.leave(self)
            self.feed = None

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: object) -> None:
        """A frame that is not JSON text gets an error frame; it must not end the stream (the
        base class would raise, and the server would close with 1011)."""
        if text_data is None:
            await self.send_json({"type": "error", "field": "frame", "error": "frames must be JSON text, not binary"})
            return
        try:
            content = await self.decode_json(text_data)
        except (ValueError, RecursionError):
            await self.send_json({"type": "error", "field": "frame", "error": 'a frame must be JSON, e.g. {"type": "ping"}'})
            return
        await self.receive_json(content)

    async def receive_json(self, content: object, **kwargs: object) -> None:
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong", "seq": self.last_sent})
            return
        await self.send_json({"type": "error", "error": "this stream is read-only; steer through /api/"})

    # --- delivery ------------------------------------------------------------------------------------

    async def deliver(self, batch: list[dict]) -> None:
        async with self.lock:
            await self._send(batch)

    async def catch_up(self) -> None:
        async with self.lock:
            while True:
                batch = await _events_after(self.space_id, self.last_sent)
                await self._send(batch)
                if len(batch) < BATCH:
                    return

    async def _send(self, batch: list[dict]) -> None:
        for event in batch:
            if event["seq"] <= self.last_sent:
                continue  # already sent (replay and feed overlap, or a second ring)
            if event["seq"] > self.last_sent + 1:
                await self._backfill(upto=event["seq"] - 1)
            await self._emit(event)

    async def _backfill(self, upto: int) -> None:
        """Seqs are gapless in the table, so a jump means rows this socket has not sent yet."""
        while self.last_sent < upto:
            batch = await _events_after(self.space_id, self.last_sent, upto)
            if not batch:
                # purged by retention (veronica.engine.retention deletes a seq prefix): say so once,
                # then carry on from the oldest kept event
                await self.send_json({"type": "purged", "through": upto,
                                      "note": f"events up to seq {upto} were removed by the space's retention"})
                self.last_sent = upto
                return
            for event in batch:
                await self._emit(event)

    async def _emit(self, event: dict) -> None:
        await self.send_json({"type": "event", **event})
        self.last_sent = event["seq"]

    # --- helpers -------------------------------------------------------------------------------------------

    async def _authenticate(self):
        """(user, Credential), or None. An Authorization header decides alone (no cookie fall-back)."""
        header = stream_auth.authorization(self.scope)
        if header is not None:
            return await _token_user(header)
        return stream_auth.session_user(self.scope)

    def _after(self) -> int | None:
        raw = parse_qs(self.scope.get("query_string", b"").decode("latin1")).get("after", ["0"])[-1]
        try:
            value = int(raw or "0")
        except ValueError:
            return None
        return value if value >= 0 else None
