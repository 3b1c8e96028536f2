"""A worker host that can be cut off from the database: a qcluster in its own network namespace.

Inside the namespace the cluster reaches PostgreSQL and Redis at their usual 127.0.0.1 ports through
a relay that crosses over by Unix sockets (files are shared across network namespaces). Taking the
namespace's loopback down then drops every packet between the cluster and its relay, as a real
partition does: nothing is refused, nothing is acknowledged, the database sees the sessions idle.

    python -m tests.netns --pidfile F --pg-sock A --redis-sock B -- manage.py qcluster   (under `unshare -n`)
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path


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


def unix_to_tcp(path: Path, port: int) -> Relay:
    """Host side: a Unix socket file that leads to 127.0.0.1:port."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(64)
    return Relay(listener, lambda: socket.create_connection(("127.0.0.1", port)))


def tcp_to_unix(port: int, path: str) -> Relay:
    """Namespace side: 127.0.0.1:port that leads to the host's Unix socket file."""
    listener = socket.create_server(("127.0.0.1", port), backlog=64)

    def connect() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(path)
        return sock

    return Relay(listener, connect)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pidfile", required=True)
    parser.add_argument("--pg-sock", required=True)
    parser.add_argument("--pg-port", type=int, default=5432)
    parser.add_argument("--redis-sock", required=True)
    parser.add_argument("--redis-port", type=int, default=6379)
    parser.add_argument("command", nargs="+")
    args = parser.parse_args()
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    tcp_to_unix(args.pg_port, args.pg_sock)
    tcp_to_unix(args.redis_port, args.redis_sock)
    child = subprocess.Popen([sys.executable, *args.command])
    Path(args.pidfile).write_text(str(child.pid))
    sys.exit(child.wait())


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
