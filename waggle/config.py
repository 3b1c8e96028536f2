"""waggle's tunables. Defaults can be overridden by an optional ``WAGGLE`` dict in Django settings
(e.g. ``WAGGLE = {"mine_period": 16}``); a per-call ``WaggleConfig`` wins over both."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from datetime import timedelta

from waggle.miner import MineConfig

DEFAULT_IGNORED_TOOLS = frozenset({"waggle_list", "waggle_run"})


@dataclass(frozen=True)
class WaggleConfig:
    ring_capacity: int = 200        # recent calls kept per session (non-positive -> 200)
    mine_period: int = 8            # observations of a session between two mining sweeps (>= 2)
    min_len: int = 2                # shortest route mined (>= 2)
    max_len: int = 8                # longest route mined
    k: int = 3                      # non-overlapping occurrences needed (>= 2)
    min_prefix: int = 2             # leading steps that must match before a replay (>= 2)
    min_confidence: float = 0.8     # a route is stored only if, in the mined calls, its trigger was
                                    # followed by the rest of the route at least this often
    mine_window: int = 2000         # newest calls of a space fed to one sweep
    retention_calls: int = 5000     # ForageCall rows kept per space
    retention_days: int = 30        # ForageCall / FiredPlan rows older than this are dropped by curation
    ignore_tools: frozenset[str] = DEFAULT_IGNORED_TOOLS  # never recorded (waggle's own tools)
    sweep_async: bool = False       # mine in a django-q2 task instead of inside observe (the host's
                                    # workers set this so mining never slows a member's turn)

    def normalized(self) -> "WaggleConfig":
        return replace(
            self,
            ring_capacity=self.ring_capacity if self.ring_capacity > 0 else 200,
            mine_period=max(2, int(self.mine_period)),
            min_prefix=max(2, int(self.min_prefix)),
            min_confidence=min(1.0, max(0.0, float(self.min_confidence))),
            mine_window=max(10, int(self.mine_window)),
            retention_calls=max(10, int(self.retention_calls)),
            retention_days=max(1, int(self.retention_days)),
            ignore_tools=frozenset(self.ignore_tools),
        )

    @property
    def mine_config(self) -> MineConfig:
        return MineConfig(min_len=self.min_len, max_len=self.max_len, k=self.k).normalized()

    @property
    def retention(self) -> timedelta:
        return timedelta(days=self.retention_days)


def default_config() -> WaggleConfig:
    """Defaults, overridden by ``settings.WAGGLE`` when the host defines it."""
    overrides: dict = {}
    try:
        from django.conf import settings

        overrides = dict(getattr(settings, "WAGGLE", {}) or {})
    except Exception:  # noqa: BLE001 - settings not configured (pure use): plain defaults
        overrides = {}
    known = {f.name for f in fields(WaggleConfig)}
    return WaggleConfig(**{k: v for k, v in overrides.items() if k in known}).normalized()


DEFAULT_STALE_AGE = timedelta(days=30)
DEFAULT_MIN_FAILS = 3
