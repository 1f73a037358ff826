"""``Recent``: the newest values a worker read, by key, a few kept (thread-safe: read from worker threads).

Keys here name their content (an object's URI with its sha256 in it), so a kept value is never stale; the
oldest is dropped once more than ``keep`` are held.
"""

from __future__ import annotations

import threading
from typing import Generic, TypeVar

V = TypeVar("V")


class Recent(Generic[V]):
    """The ``keep`` values last put or read, by key."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._values: dict[str, V] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> V | None:
        with self._lock:
            value = self._values.pop(key, None)
            if value is not None:
                self._values[key] = value  # read: the newest again
            return value

    def put(self, key: str, value: V) -> None:
        with self._lock:
            self._values.pop(key, None)
            self._values[key] = value
            while len(self._values) > self.keep:
                del self._values[next(iter(self._values))]

    def __len__(self) -> int:
        with self._lock:
            return len(self._values)
