"""The partition test's relays honour the URLs the run was given (VERONICA_TEST_DATABASE_URL /
VERONICA_TEST_REDIS_URL on any port), not 5432 / 6379. No namespace needed: real sockets only."""
from __future__ import annotations

import socket
import threading

from tests.harness import free_port
from tests.netns import plan, tcp_to_unix, unix_to_tcp


def test_the_plan_keeps_the_urls_ports_and_credentials_and_moves_the_host_to_the_namespaces_loopback():
    route = plan("postgres://ci:s3cret@db.internal:6543/h_run?sslmode=disable", "redis://:pw@10.0.0.7:6390/8")
    assert route.pg == ("db.internal", 6543) and route.redis == ("10.0.0.7", 6390)
    assert route.database_url == "postgres://ci:s3cret@127.0.0.1:6543/h_run?sslmode=disable"
    assert route.redis_url == "redis://:pw@127.0.0.1:6390/8"
    assert plan("postgres://postgres@localhost/x", "redis://127.0.0.1/0").pg == ("localhost", 5432)


def test_a_relay_reaches_a_service_on_any_port(tmp_path):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]  # not 5432 / 6379

    def echo() -> None:
        conn, _ = server.accept()
        with conn:
            conn.sendall(b"echo:" + conn.recv(100))

    threading.Thread(target=echo, daemon=True).start()
    host_side = unix_to_tcp(tmp_path / "svc.sock", "127.0.0.1", port)
    inside = free_port()
    namespace_side = tcp_to_unix(inside, str(tmp_path / "svc.sock"))
    try:
        with socket.create_connection(("127.0.0.1", inside), timeout=5) as client:
            client.sendall(b"hello")
            assert client.recv(100) == b"echo:hello"
    finally:
        host_side.close()
        namespace_side.close()
        server.close()
