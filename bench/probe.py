"""Tasks the benchmarks enqueue into the real cluster."""
import time


def now() -> float:
    """Bare django-q2 dispatch: the moment a worker starts the task."""
    return time.time()
