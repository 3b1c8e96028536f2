"""One HTTP call path for remote providers: timeouts, retries with backoff on 429/5xx, and an
abort that closes the socket when the run is cancelled mid-call."""
from __future__ import annotations

import random
import threading
import time

import httpx

from veronica.agent.providers.base import CancelCheck, Cancelled, ProviderError

RETRY_STATUSES = {408, 409, 429, 500, 502, 503, 504, 529}


def post_json(url: str, headers: dict, body: dict, *, should_stop: CancelCheck, timeout: float = 120.0,
              attempts: int = 4, backoff: float = 1.0) -> dict:
    last_error = ""
    for attempt in range(attempts):
        if should_stop():
            raise Cancelled("cancelled before the model call")
        status, payload, retry_after = _abortable_post(url, headers, body, should_stop=should_stop, timeout=timeout)
        if status == 200:
            return payload
        last_error = f"HTTP {status}: {str(payload)[:300]}"
        if status not in RETRY_STATUSES:
            raise ProviderError(last_error)
        delay = retry_after if retry_after is not None else backoff * (2 ** attempt) + random.uniform(0, backoff / 2)
        deadline = time.monotonic() + min(delay, 30.0)
        while time.monotonic() < deadline:
            if should_stop():
                raise Cancelled("cancelled while backing off")
            time.sleep(0.05)
    raise ProviderError(f"gave up after {attempts} attempts; last: {last_error}")


def _abortable_post(url: str, headers: dict, body: dict, *, should_stop: CancelCheck, timeout: float):
    """Run the request on a thread; poll the cancel flag and close the client to abort it."""
    client = httpx.Client(timeout=httpx.Timeout(timeout, connect=10.0))
    box: dict = {}

    def call() -> None:
        try:
            response = client.post(url, headers=headers, json=body)
            try:
                box["payload"] = response.json()
            except ValueError:
                box["payload"] = response.text
            box["status"] = response.status_code
            retry = response.headers.get("retry-after")
            box["retry_after"] = float(retry) if retry and retry.replace(".", "", 1).isdigit() else None
        except Exception as exc:  # noqa: BLE001 - surfaced below
            box["error"] = exc

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.05)
        if thread.is_alive() and should_stop():
            client.close()  # aborts the in-flight request
            raise Cancelled("model call aborted")
    client.close()
    if "error" in box:
        error = box["error"]
        if isinstance(error, (httpx.TimeoutException, httpx.TransportError)):
            return 503, f"transport error: {error}", None
        raise ProviderError(f"request failed: {error}")
    return box["status"], box["payload"], box.get("retry_after")
