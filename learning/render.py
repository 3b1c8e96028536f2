"""Rendering of the run-start rules block (pure, no ORM)."""
from __future__ import annotations

HEADING = "## Rules"
USER_HEADING = "Operator rules (set by people; always follow them, they override learned rules):"
LEARNED_HEADING = "Learned rules (lessons from reviewed past work):"


def render_block(user: list[tuple[str, str]], learned: list[tuple[str, str]]) -> str | None:
    """`user` and `learned` are (domain, text) pairs already in order. None when both are empty:
    an empty section would spend prompt tokens on a heading."""
    if not user and not learned:
        return None
    parts = [HEADING]
    if user:
        parts.append("")
        parts.append(USER_HEADING)
        parts.extend(f"- ({domain}) {text}" for domain, text in user)
    if learned:
        parts.append("")
        parts.append(LEARNED_HEADING)
        parts.extend(f"- ({domain}) {text}" for domain, text in learned)
    return "\n".join(parts)
