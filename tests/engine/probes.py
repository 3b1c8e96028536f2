"""Task functions the partition test enqueues on a real cluster (importable by its workers)."""
from __future__ import annotations

import time
from pathlib import Path

from django.db import transaction


def hold_space_lock(space_id: int, marker: str, seconds: float = 30) -> None:
    """What a worker does mid-run: emit an event (the space row is locked until commit) and then
    spend a while before committing. The test cuts the host off during the wait."""
    from veronica.swarm import events

    with transaction.atomic():
        events.emit(space_id, "probe.locked")
        Path(marker).write_text("locked")
        time.sleep(seconds)
