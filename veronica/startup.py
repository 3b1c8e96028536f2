"""Idempotent start-up work shared by `up` and the tests: schedules, demo space, demo login."""
from __future__ import annotations

import logging
import secrets

from django.conf import settings
from django.contrib.auth import get_user_model

from veronica.models import AccessRole, Space, SpaceAccess

log = logging.getLogger(__name__)
DEMO_USER = "operator"


def ensure_schedules() -> None:
    """Run by every qcluster at start (and by `up` through it): the q2 schedules the workers need.
    The engine tick itself is no schedule: it is the ticker thread of every qcluster."""
    from veronica.engine.tick import drop_legacy_schedule

    drop_legacy_schedule()
    for module in ("waggle.schedules", "learning.schedules"):
        try:
            mod = __import__(module, fromlist=["x"])
            (getattr(mod, "ensure_schedule", None) or getattr(mod, "ensure_schedules"))()
        except (ImportError, AttributeError):
            log.info("%s has no schedules to ensure", module)


def ensure_demo_space() -> Space:
    """Register the demo manifest once; later starts keep the space (and its runtime overrides)."""
    from veronica.manifest import register
    from veronica.seed import DEMO_MANIFEST

    space = Space.objects.filter(slug="demo").first()
    return space or register(DEMO_MANIFEST, actor="up")


def ensure_demo_login(space: Space) -> tuple[str, str]:
    """A staff login that owns the demo space. The password lives in the data folder (0600)."""
    path = settings.DATA_DIR / "demo_login.txt"
    user_model = get_user_model()
    user = user_model.objects.filter(username=DEMO_USER).first()
    if user is None or not path.exists():
        password = secrets.token_urlsafe(12)
        if user is None:
            user = user_model.objects.create_superuser(DEMO_USER, "", password)
        else:
            user.set_password(password)
            user.save()
        path.write_text(password)
        path.chmod(0o600)
    SpaceAccess.objects.get_or_create(user=user, space=space, defaults={"role": AccessRole.OWNER})
    return DEMO_USER, path.read_text().strip()
