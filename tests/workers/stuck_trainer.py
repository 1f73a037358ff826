"""``python -m tests.workers.stuck_trainer worker trainer ...``: the real ``dgrpo worker``, whose micro-batches never
return when ``DGRPO_TEST_STUCK`` is set (a kernel that hangs: planted here, the only thing that is); for
tests/workers/test_stuck_trainer.py."""

from __future__ import annotations

import os
import threading
from typing import Any

from activities import sft
from dgrpo.cli import entry


def never_returns(*args: Any, **kwargs: Any) -> Any:
    threading.Event().wait()


if os.environ.get("DGRPO_TEST_STUCK"):
    sft.sft_update = never_returns
entry()
