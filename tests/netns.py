"""A worker host that can be cut off from the database: a qcluster in its own network namespace.

Inside the namespace the cluster reaches PostgreSQL and Redis at 127.0.0.1, on the ports of the URLs
the test run was given (`plan()`), through a relay that crosses over by Unix sockets (files are shared
across network namespaces) to the real host and port. Taking the
namespace's loopback down then drops every packet between the cluster and its relay, as a real
partition does: nothing is refused, nothing is acknowledged, the database sees the sessions idle.

With --db-pidfile, PostgreSQL is reached over a veth pair instead, at DB_ADDRESS, whose far end
lives in a second namespace holding the PostgreSQL relay (its pid is written to that file): taking
that end down (`cut_database`) drops the packets to the database only, Redis stays reachable, as in a
database-only partition. Bringing it up again (`heal_database`) heals it.

    python -m tests.netns --pidfile F --pg-sock A --redis-sock B -- manage.py qcluster   (under `unshare -n`)
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Relay:
    """Accept on `listener`, connect each client to `connect()`, copy both ways until either ends."""

    def __init__(self, listener: socket.socket, connect) -> None:
        self.listener, self.connect = listener, connect
        self.open: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
                upstream = self.connect()
            except OSError:
                return
            self.open += [client, upstream]
            threading.Thread(target=_pipe, args=(client, upstream), daemon=True).start()
            threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()

    def close(self) -> None:
        for sock in [self.listener, *self.open]:
            try:
                sock.close()
            except OSError:
                pass


def unix_to_tcp(path: Path, host: str, port: int) -> Relay:
    """Host side: a Unix socket file that leads to host:port."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(64)
    return Relay(listener, lambda: socket.create_connection((host, port)))


@dataclass
class Plan:
    """Where the host-side relays connect (the services the test run was pointed at), and the URLs
    the cluster inside the namespace uses: the same ports, on the namespace's own 127.0.0.1."""
    pg: tuple[str, int]
    redis: tuple[str, int]
    database_url: str
    redis_url: str


def on_loopback(url: str, port: int, host: str = "127.0.0.1") -> str:
    """`url` with its host replaced by 127.0.0.1 (credentials, port, path and query kept)."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{userinfo + '@' if userinfo else ''}{host}:{port}"))


def plan(database_url: str, redis_url: str) -> Plan:
    pg, redis = urlsplit(database_url), urlsplit(redis_url)
    pg_addr = (pg.hostname or "127.0.0.1", pg.port or 5432)
    redis_addr = (redis.hostname or "127.0.0.1", redis.port or 6379)
    return Plan(pg=pg_addr, redis=redis_addr, database_url=on_loopback(database_url, pg_addr[1]),
                redis_url=on_loopback(redis_url, redis_addr[1]))


def tcp_to_unix(port: int, path: str) -> Relay:
    """Namespace side: 127.0.0.1:port that leads to the host's Unix socket file."""
    listener = socket.create_server(("127.0.0.1", port), backlog=64)

    def connect() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(path)
        return sock

    return Relay(listener, connect)


DB_ADDRESS, HOST_SIDE = "10.77.0.1", "10.77.0.2"


def serve_database(port: int, path: str) -> None:
    """In the database namespace: wait for DB_ADDRESS to be configured, then relay it to the socket file."""
    while True:
        try:
            listener = socket.create_server((DB_ADDRESS, port), backlog=64)
            break
        except OSError:
            time.sleep(0.05)

    def connect() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(path)
        return sock

    Relay(listener, connect)
    threading.Event().wait()


def database_over_veth(port: int, path: str, pidfile: str) -> None:
    """A veth pair from this namespace to a new one that holds the PostgreSQL relay."""
    run = lambda *cmd: subprocess.run(cmd, check=True)  # noqa: E731
    run("ip", "link", "add", "vdb0", "type", "veth", "peer", "name", "vdb1")
    far = subprocess.Popen(["unshare", "-n", sys.executable, __file__, "--serve-database", str(port), "--pg-sock", path])
    ours = os.readlink("/proc/self/ns/net")
    while os.readlink(f"/proc/{far.pid}/ns/net") == ours:  # until unshare has made the new namespace
        time.sleep(0.02)
    run("ip", "link", "set", "vdb1", "netns", str(far.pid))
    inside = ["nsenter", "-t", str(far.pid), "-n"]
    run(*inside, "ip", "link", "set", "lo", "up")
    run(*inside, "ip", "addr", "add", f"{DB_ADDRESS}/30", "dev", "vdb1")
    run(*inside, "ip", "link", "set", "vdb1", "up")
    mac = subprocess.run([*inside, "ip", "-o", "link", "show", "vdb1"], check=True, capture_output=True, text=True).stdout
    mac = mac.split("link/ether", 1)[1].split()[0]
    run("ip", "addr", "add", f"{HOST_SIDE}/30", "dev", "vdb0")
    run("ip", "link", "set", "vdb0", "up")
    # no ARP across the cut: a packet to the database is sent and lost, never refused for want of a neighbour
    run("ip", "neigh", "replace", DB_ADDRESS, "lladdr", mac, "dev", "vdb0", "nud", "permanent")
    Path(pidfile).write_text(str(far.pid))


def tear_down(launcher: subprocess.Popen, relays: list[Relay]) -> None:
    """Kill the namespace's process group (the cluster, its relays, the database namespace), then
    close the host-side relays: the database now sees the sessions end."""
    import signal

    try:
        os.killpg(launcher.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    launcher.wait(timeout=10)
    for relay in relays:
        relay.close()


def set_database_link(db_pid: int, up: bool) -> None:
    """From the test: the veth end in the database namespace down (a cut) or up (healed)."""
    subprocess.run(["nsenter", "-t", str(db_pid), "-n", "ip", "link", "set", "vdb1", "up" if up else "down"], check=True)


def main() -> None:
    if sys.argv[1:2] == ["--serve-database"]:
        serve_database(int(sys.argv[2]), sys.argv[4])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--pidfile", required=True)
    parser.add_argument("--pg-sock", required=True)
    parser.add_argument("--pg-port", type=int, required=True)
    parser.add_argument("--redis-sock", required=True)
    parser.add_argument("--redis-port", type=int, required=True)
    parser.add_argument("--db-pidfile", help="reach PostgreSQL over a veth pair that can be cut alone")
    parser.add_argument("command", nargs="+")
    args = parser.parse_args()
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    env = os.environ.copy()
    if args.db_pidfile:
        database_over_veth(args.pg_port, args.pg_sock, args.db_pidfile)
        env["DATABASE_URL"] = on_loopback(env["DATABASE_URL"], args.pg_port, DB_ADDRESS)
    else:
        tcp_to_unix(args.pg_port, args.pg_sock)
    tcp_to_unix(args.redis_port, args.redis_sock)
    child = subprocess.Popen([sys.executable, *args.command], env=env)
    Path(args.pidfile).write_text(str(child.pid))
    sys.exit(child.wait())


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
