"""The real OpenID Connect provider of the SSO tests (tests/oidc/provider.mjs, node-oidc-provider),
started on a free port, and a person's browser at it (httpx: redirects, its login form, cookies)."""
from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

HERE = Path(__file__).resolve().parent
CLIENT_ID, CLIENT_SECRET = "veronica-test", "a-client-secret-for-tests"
REDIRECT_URI = "http://testserver/oidc/callback/"


def install() -> None:
    """npm ci from the committed lock file, once (bin/test does it too)."""
    if not (HERE / "node_modules" / "oidc-provider").is_dir():
        subprocess.run([shutil.which("npm") or "npm", "ci", "--no-audit", "--no-fund"], cwd=HERE, check=True,
                       stdout=subprocess.DEVNULL, timeout=300)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Idp:
    def __init__(self, *more_redirect_uris: str) -> None:
        install()
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(["node", str(HERE / "provider.mjs"), str(self.port), ",".join((REDIRECT_URI, *more_redirect_uris)),
                                      CLIENT_ID, CLIENT_SECRET],
                                     cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()  # "listening ..." once the port is bound (no sleep, no poll)
        if not line.startswith("listening"):
            self.proc.kill()
            raise RuntimeError(f"the OIDC provider did not start: {line!r}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)

    def _post(self, path: str, body: dict) -> None:
        httpx.post(f"{self.issuer}/__test/{path}", json=body, timeout=10).raise_for_status()

    def add(self, sub: str, password: str = "pw", *, email: str | None = None, groups: list[str] | None = None,
            verified: bool = True) -> None:
        self._post("person", {"sub": sub, "password": password, "email": email or f"{sub}@example.org", "name": sub.title(),
                              "groups": groups or [], "email_verified": verified})

    def remove(self, sub: str) -> None:
        self._post("remove", {"sub": sub})

    def clock(self, offset_seconds: int) -> None:
        self._post("clock", {"offset_seconds": offset_seconds})

    def tamper(self, on: bool) -> None:
        self._post("tamper", {"on": on})

    def reset(self) -> None:
        self.clock(0)
        self.tamper(False)


class Browser:
    """One person's browser: the Django test client for our side, httpx (with the IdP's cookies)
    for the provider's side; a redirect from one to the other is followed by hand."""

    def __init__(self, django_client, idp: Idp) -> None:
        self.app, self.idp = django_client, idp
        self.at_idp = httpx.Client(timeout=20)

    def follow(self, response, login: tuple[str, str] | None = None, side: str = "app"):
        """Follow redirects across both sides (`side`: where `response` came from) until a page that
        is not a redirect, or a redirect back to our app outside the callback. Submits the IdP's
        login form with `login`."""
        for _ in range(20):
            location = response.headers.get("location") if response.status_code in (301, 302, 303, 307) else None
            if location is None:
                if side == "idp" and login is not None and "<form" in response.text:
                    action = response.text.split('action="', 1)[1].split('"', 1)[0]
                    response = self.at_idp.post(f"{self.idp.issuer}{action}", data={"login": login[0], "password": login[1]})
                    login = None
                    continue
                return response
            if location.startswith(self.idp.issuer) or (side == "idp" and location.startswith("/")):
                response, side = self.at_idp.get(location if location.startswith("http") else f"{self.idp.issuer}{location}"), "idp"
            else:
                parts = urlsplit(location)
                if parts.path != "/oidc/callback/":
                    return response
                response, side = self.app.get(parts.path + "?" + parts.query), "app"
        raise AssertionError("too many redirects")

    def log_in(self, sub: str, password: str = "pw"):
        """The whole authorization-code flow from our login button; the app's last answer."""
        return self.follow(self.app.get("/oidc/authenticate/"), login=(sub, password))
