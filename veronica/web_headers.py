"""Response headers every page and API answer carries (the CSP comes from django-csp).

* `Cache-Control: private, no-store` on everything but static files: pages, panels and API
  answers carry a space's data (transcripts, messages, blackboard), which must not stay in a
  shared proxy or on a disk cache after logout. Static assets keep their own caching.
* `Permissions-Policy`: the console uses no device or sensor API, so every powerful feature is
  off for the page and anything it could ever frame.
"""
from __future__ import annotations

from django.conf import settings
from django.utils.cache import patch_cache_control
from django.utils.deprecation import MiddlewareMixin

# only features Chromium knows (an unknown one is a console warning on every page)
PERMISSIONS_POLICY = ", ".join(f"{feature}=()" for feature in (
    "accelerometer", "autoplay", "camera", "display-capture", "encrypted-media", "geolocation", "gyroscope",
    "magnetometer", "microphone", "midi", "payment", "publickey-credentials-get", "screen-wake-lock",
    "serial", "usb", "xr-spatial-tracking",
))


class PrivateResponseHeaders(MiddlewareMixin):
    def process_response(self, request, response):
        response.headers.setdefault("Permissions-Policy", PERMISSIONS_POLICY)
        if not request.path.startswith("/" + settings.STATIC_URL.lstrip("/")):
            patch_cache_control(response, private=True, no_store=True)
        return response
