"""Single sign-on through the real server (daphne; hosted: PostgreSQL + Redis) against the real
provider: a person signs in with the code flow, gets the space role their IdP group maps to, opens
the event stream with that session, and logging out closes the socket and sends them to the
provider's logout. The close comes from the logout's ring (seq 0); a ring is at-most-once (one
sent before the worker's Redis subscription is up is lost), so the periodic re-check, set long
here, is the backstop the wait allows for. tests/console/test_socket.py pins the ring alone."""
from __future__ import annotations

import asyncio
import json
import sys

import httpx
import pytest
from websockets.asyncio.client import connect

from tests.conftest import make_space
from tests.console.servers import ServerProcess, free_port, server_env
from tests.oidc.idp import CLIENT_ID, CLIENT_SECRET, Browser, Idp


@pytest.fixture(scope="module")
def served(django_db_setup):
    port = free_port()
    idp = Idp(f"http://127.0.0.1:{port}/oidc/callback/")
    env = server_env(VERONICA_OIDC_ISSUER=idp.issuer, VERONICA_OIDC_CLIENT_ID=CLIENT_ID, VERONICA_OIDC_CLIENT_SECRET=CLIENT_SECRET,
                     VERONICA_OIDC_SCOPES="openid email profile groups", VERONICA_OIDC_SPACE_ROLES="alpha-team=alpha:viewer",
                     VERONICA_SOCKET_RECHECK_SECONDS="30")
    web = ServerProcess([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "veronica.asgi:application"], env, "daphne")
    web.url = f"http://127.0.0.1:{port}"
    try:
        web.wait_http("/login/", 30)
        yield idp, web
    finally:
        web.stop()
        idp.stop()


def test_sign_in_through_the_server_then_logout_closes_the_open_socket(transactional_db, tmp_path, served):
    idp, web = served
    make_space(tmp_path, "alpha")
    idp.add("hana", groups=["alpha-team"])
    b = Browser(httpx.Client(base_url=web.url, timeout=30), idp)
    landed = b.log_in("hana")
    assert landed.status_code == 302 and landed.headers["location"] == "/"
    home = b.app.get("/")
    assert home.status_code == 200 and "hana" in home.text and "Alpha" in home.text  # the mapped viewer role shows the space
    cookie = f"sessionid={b.app.cookies['sessionid']}"
    csrf = b.app.cookies["csrftoken"]

    async def scenario() -> tuple[int, httpx.Response]:
        url = web.url.replace("http://", "ws://") + "/ws/spaces/alpha/"
        async with connect(url, origin=web.url, additional_headers={"Cookie": cookie}, proxy=None, open_timeout=10) as ws:
            while json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] != "ready":
                pass
            out = await asyncio.to_thread(b.app.post, "/logout/", data={"csrfmiddlewaretoken": csrf},
                                          headers={"Referer": web.url + "/"})
            try:
                while True:
                    await asyncio.wait_for(ws.recv(), 60)
            except Exception:  # noqa: BLE001 - the close ends the loop
                pass
            return ws.close_code, out

    code, out = asyncio.run(scenario())
    assert code == 4401
    assert out.status_code == 302 and out.headers["location"].startswith(f"{idp.issuer}/session/end")
    assert b.app.get("/").headers["location"].startswith("/login/")
