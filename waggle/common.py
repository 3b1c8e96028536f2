"""What every part of the waggle service shares: its logger, the exec callable's type and the refusal error."""
from __future__ import annotations

import logging
from typing import Any, Callable

log = logging.getLogger("waggle")

ExecFn = Callable[[str, dict[str, Any]], str]
"""exec(tool_name, args) -> output text. ``args`` keep their JSON types. Raises on a tool error.
The host applies the same safety checks and output truncation as for a model-driven call."""


class WaggleError(Exception):
    """A refused on-demand request (unknown or disabled waggle, bad parameters, a failed step)."""

