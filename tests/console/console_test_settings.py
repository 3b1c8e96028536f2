"""Settings for server subprocesses started by the console tests: the normal settings, pointed at
the test database the pytest process created (VERONICA_TEST_DB_NAME). Everything else comes from
the same environment (VERONICA_DATA_DIR, DATABASE_URL, REDIS_URL), so the secret key and thus the
session cookies are shared with the test process."""
import os

from veronica.settings import *  # noqa: F401,F403
from veronica.settings import DATABASES

_test_db = os.environ.get("VERONICA_TEST_DB_NAME", "").strip()
if _test_db:
    DATABASES["default"]["NAME"] = _test_db
