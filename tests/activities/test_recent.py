"""``Recent``, the few values a worker keeps of what it read (a run's stored texts and scenario lists)."""

from __future__ import annotations

import threading

from activities.recent import Recent


def test_the_newest_values_are_kept_and_a_read_makes_a_value_the_newest() -> None:
    kept: Recent[str] = Recent(keep=2)
    kept.put("a", "A")
    kept.put("b", "B")
    assert kept.get("a") == "A"  # now newer than b
    kept.put("c", "C")
    assert (kept.get("a"), kept.get("b"), kept.get("c")) == ("A", None, "C")
    kept.put("a", "A2")  # put again: the new value, no second entry
    kept.put("d", "D")
    assert (kept.get("a"), kept.get("c"), kept.get("d")) == ("A2", None, "D")


def test_threads_reading_and_putting_at_once_never_keep_more_than_asked() -> None:
    kept: Recent[int] = Recent(keep=3)

    def work(offset: int) -> None:
        for i in range(2000):
            kept.put(str((i + offset) % 7), i)
            kept.get(str((i * 3 + offset) % 7))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(kept) == 3
