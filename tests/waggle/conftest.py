"""Fixtures for waggle's tests. waggle never imports the host: these helpers stand in for it."""
from __future__ import annotations

import pytest

from waggle import recording, service, speech, window
from waggle.config import WaggleConfig
from waggle_helpers import FakeExec  # tests/waggle is on sys.path (no __init__.py layout)


@pytest.fixture
def fake_exec():
    return FakeExec()


@pytest.fixture
def cfg():
    # small numbers so a test can mine a route after a few repetitions
    return WaggleConfig(mine_period=8, min_len=2, max_len=6, k=3, min_prefix=2)


@pytest.fixture(autouse=True)
def _fresh_rings():
    """Each test starts with an empty per-process ring cache (as a new worker process would)."""
    recording._rings.clear()
    window.forget()
    speech.forget()
    yield
    recording._rings.clear()
    window.forget()
    speech.forget()
