"""Idempotent start-up work shared by `up` and the tests: schedules, demo space, demo login."""
from __future__ import annotations

import logging
import secrets
from pathlib import Path

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
    """The demo space on its own copy of the demo template under the data folder; later starts keep
    the space (and its runtime overrides). A demo an earlier version ran inside the checkout moves
    to its own copy (the template's pristine files, not what ran there)."""
    from veronica.portable import archive as portable
    from veronica.portable import manifest
    from veronica.portable.manifest import register
    from veronica.portable.seed import DEMO_SLUG, DEMO_TEMPLATE

    space = Space.objects.filter(slug=DEMO_SLUG).first()
    home = portable.home_of(DEMO_SLUG)
    if space is not None and not Path(space.workdir).resolve().is_relative_to(manifest.TEMPLATES_DIR.resolve()):
        return space
    if not (home / "space.toml").is_file():  # else the data folder outlived its database, or the demo moves in
        if space is None:
            return portable.create_from_template(DEMO_TEMPLATE, DEMO_SLUG, actor="up")
        portable.copy_template(DEMO_TEMPLATE, home, DEMO_SLUG)
    return register(home, own=True, slug=DEMO_SLUG, actor="up")


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
