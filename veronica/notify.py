"""The notification task's queue path, kept where django-q2 stored it.

Notifications are sent by veronica.ops.notify; its deliver task is enqueued by the string
"veronica.notify.deliver", and tasks already queued before the move still name it. This alias keeps both
working without a data migration of the queue.
"""

from veronica.ops.notify import deliver

__all__ = ["deliver"]
