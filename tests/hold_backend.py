"""Hold a ``LocalBackend`` (the embedded stack and ``dgrpo worker all``) open until SIGTERM.

The example programs and the ART programs of tests/dgrpo share one (``held_backend`` in tests/conftest.py): each
program's own ``LocalBackend(path=...)`` then reuses these workers, as a second ART client reuses a running
backend, instead of starting a stack and loading the model again.

    python -m tests.hold_backend HOME READY_FILE
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from dgrpo.local import LocalBackend


async def hold(home: Path, ready: Path) -> None:
    """Start the backend, say so in ``ready``, and keep it until SIGTERM (which also aborts a start)."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        async with LocalBackend(path=home):
            await asyncio.to_thread(ready.write_text, "ready\n")
            await asyncio.Event().wait()
    except asyncio.CancelledError:
        pass  # SIGTERM: leaving ``async with`` stopped what this backend started


if __name__ == "__main__":
    asyncio.run(hold(Path(sys.argv[1]), Path(sys.argv[2])))
