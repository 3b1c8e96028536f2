"""Put this folder on a child process's PYTHONPATH to shift the wall clock Python reads by
VERONICA_TEST_CLOCK_SKEW seconds (ahead if positive). Only what Python reads moves: the database,
Redis and the monotonic clock keep true time, as on a host whose clock is wrong."""
import os
import time
from datetime import timedelta

SKEW = float(os.environ.get("VERONICA_TEST_CLOCK_SKEW") or 0)
if SKEW:
    import django.utils.timezone as _tz

    _real_now, _real_time = _tz.now, time.time
    _tz.now = lambda: _real_now() + timedelta(seconds=SKEW)
    time.time = lambda: _real_time() + SKEW
