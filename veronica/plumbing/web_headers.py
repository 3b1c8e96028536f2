"""Response headers every page and API answer carries (the CSP comes from django-csp).

* `Cache-Control: private, no-store` on everything but static files: pages, panels and API
  answers carry a space's data (transcripts, messages, blackboard), which must not stay in a
  shared proxy or on a disk cache after logout. Static assets keep their own caching.
* `Permissions-Policy`: the console uses no device or sensor API, so every powerful feature is
  off for the page and anything it could ever frame.
"""
from __future__ import annotations

import ipaddress

from django.conf import settings
from django.utils.cache import patch_cache_control
from django.utils.deprecation import MiddlewareMixin

# only features Chromium knows (an unknown one is a console warning on every page)
PERMISSIONS_POLICY = ", ".join(f"{feature}=()" for feature in (
    "accelerometer", "autoplay", "camera", "display-capture", "encrypted-media", "geolocation", "gyroscope",
    "magnetometer", "microphone", "midi", "payment", "publickey-credentials-get", "screen-wake-lock",
    "serial", "usb", "xr-spatial-tracking",
))


def client_ip(request) -> str | None:
    """The address login throttling (django-axes) counts failures against.

    Behind VERONICA_TRUSTED_PROXY_COUNT reverse proxies every request arrives from the proxy, so
    REMOTE_ADDR alone would make every client one address. Each trusted proxy appends the address
    it saw to X-Forwarded-For, so the client is that many entries from the right; anything further
    left was written by the client and is not believed. With no trusted proxy the header is
    ignored altogether (a client could otherwise pick a fresh address per guess)."""
    remote = request.META.get("REMOTE_ADDR")
    count = settings.TRUSTED_PROXY_COUNT
    if not count:
        return remote
    hops = [hop.strip() for hop in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if hop.strip()]
    if len(hops) < count:
        return remote  # fewer hops than proxies: not from behind them
    try:
        return str(ipaddress.ip_address(hops[-count].split("%")[0]))
    except ValueError:
        return remote


class PrivateResponseHeaders(MiddlewareMixin):
    def process_response(self, request, response):
        response.headers.setdefault("Permissions-Policy", PERMISSIONS_POLICY)
        if not request.path.startswith("/" + settings.STATIC_URL.lstrip("/")):
            patch_cache_control(response, private=True, no_store=True)
        return response
