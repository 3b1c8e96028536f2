"""The model learning's passes call: settings.LEARNING_COMPLETE points here (learning never imports
veronica). Moved out of veronica.swarm.learning_bridge: it builds a provider, and the swarm verbs sit
below the agent runtime."""
from __future__ import annotations

import os


def make_complete():
    """VERONICA_LEARNING_MODEL picks the passes' model (default: the offline heuristic)."""
    spec = os.environ.get("VERONICA_LEARNING_MODEL", "offline")
    if spec == "offline":
        from learning.offline import complete

        return complete
    from veronica.agent.providers import get_provider

    provider = get_provider(spec)

    def complete(system: str, prompt: str) -> str:
        return provider.complete(system, [{"role": "user", "content": prompt}], [], should_stop=lambda: False).text
    return complete
