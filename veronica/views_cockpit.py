"""Console parts of the operator's cockpit (issue 22): the member's chat and budget panels, the
prompt inspector. Writes go through the JSON API (veronica.api.cockpit), which calls the verbs."""
from __future__ import annotations

from typing import Callable

from veronica import chat
from veronica.engine import budget


def member_panels(member: Callable) -> dict[str, Callable[[], dict]]:
    """Extra member panels; `member` fetches the member (each refresh reads it fresh)."""
    return {
        "chat": lambda: {"chat": chat.conversation(member(), limit=30)},
        "budget": lambda: {"budget": budget.budget_state(member())},
    }
