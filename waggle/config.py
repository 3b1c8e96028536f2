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
    min_confidence: float = 0.75    # a route is stored only if the Wilson lower bound of the share of
                                    # replayed steps the agent then made itself, over distinct
                                    # contexts, reaches this (3 clean contexts at z=1 give 0.75)
    confidence_z: float = 1.0       # that bound is one standard error (one-sided 84 %)
    min_contexts: int = 3           # distinct contexts (argument values, else sessions) the trigger
                                    # must be seen in before the route may fire
    fanout_cap: int = 8             # calls one fan-out step may make in one replay
    sweep_candidates: int = 32      # mined routes judged per sweep, best first (keeps a sweep linear)
    mining: bool = True             # False: record and replay, never mine (a frozen library)
    mine_window: int = 5000         # newest calls of a space fed to one sweep (all that is retained)
    retention_calls: int = 5000     # ForageCall rows kept per space
    retention_days: int = 30        # ForageCall / FiredPlan rows older than this are dropped by curation
    ignore_tools: frozenset[str] = DEFAULT_IGNORED_TOOLS  # never recorded (waggle's own tools)
    sweep_async: bool = False       # mine in a django-q2 task instead of inside observe (the host's
                                    # workers set this so mining never slows a member's turn)
    sweep_interval: float = 2.0     # sweep_async: at most one sweep of a space enqueued per this many
                                    # seconds from one process (a sweep mines the whole window, so the
                                    # next one covers what a skipped period saw; without the bound a
                                    # busy space queued sweeps faster than workers ran them, and wakes
                                    # waited behind them)

    def normalized(self) -> "WaggleConfig":
        """The config with every field in range; memoized (a member's path asks several times a call)."""
        try:
            hit = _normalized.get(self)
        except TypeError:  # a field given as something unhashable (a list of tools): computed each time
            return self._normalize()
        if hit is None:
            if len(_normalized) > 64:
                _normalized.clear()
            hit = _normalized[self] = self._normalize()
            _normalized[hit] = hit
        return hit

    def _normalize(self) -> "WaggleConfig":
        return replace(
            self,
            ring_capacity=self.ring_capacity if self.ring_capacity > 0 else 200,
            mine_period=max(2, int(self.mine_period)),
            min_prefix=max(2, int(self.min_prefix)),
            min_confidence=min(1.0, max(0.0, float(self.min_confidence))),
            confidence_z=max(0.0, float(self.confidence_z)),
            min_contexts=max(1, int(self.min_contexts)),
            fanout_cap=max(1, int(self.fanout_cap)),
            sweep_candidates=max(1, int(self.sweep_candidates)),
            mining=bool(self.mining),
            mine_window=max(10, int(self.mine_window)),
            retention_calls=max(10, int(self.retention_calls)),
            retention_days=max(1, int(self.retention_days)),
            sweep_interval=max(0.0, float(self.sweep_interval)),
            ignore_tools=frozenset(self.ignore_tools),
        )

    @property
    def mine_config(self) -> MineConfig:
        return MineConfig(min_len=self.min_len, max_len=self.max_len, k=self.k).normalized()

    @property
    def retention(self) -> timedelta:
        return timedelta(days=self.retention_days)


_normalized: dict[WaggleConfig, WaggleConfig] = {}
_default: tuple[dict, WaggleConfig] | None = None


def default_config() -> WaggleConfig:
    """Defaults, overridden by ``settings.WAGGLE`` when the host defines it (read again whenever that
    setting changes)."""
    global _default
    overrides: dict = {}
    try:
        from django.conf import settings

        overrides = dict(getattr(settings, "WAGGLE", {}) or {})
    except Exception:  # noqa: BLE001 - settings not configured (pure use): plain defaults
        overrides = {}
    if _default is not None and _default[0] == overrides:
        return _default[1]
    known = {f.name for f in fields(WaggleConfig)}
    cfg = WaggleConfig(**{k: v for k, v in overrides.items() if k in known}).normalized()
    _default = (overrides, cfg)
    return cfg


DEFAULT_STALE_AGE = timedelta(days=30)
DEFAULT_MIN_FAILS = 3
