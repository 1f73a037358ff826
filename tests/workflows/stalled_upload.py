"""``dgrpo worker trainer`` whose upload of one step's optimizer and trainer state never ends (test_servable_real.py).

    python -m tests.workflows.stalled_upload --step N worker trainer [dgrpo worker's flags]

The real trainer worker but for one thing: ``publish`` of step N (the rest of its checkpoint, once its adapter is
up) waits forever, as an upload to a store that stopped answering would, while the worker heartbeats on. The test
kills the process there: the step is served, not resumable, and the trainer is gone with its disk.
"""

from __future__ import annotations

import argparse
import sys
import threading
from typing import Any

from activities.training import TrainerActivities
from dgrpo.cli import main as dgrpo_main
from schemas.activities import PublishInput


def stall(step: int) -> None:
    publish = TrainerActivities.publish_sync

    def publish_sync(self: TrainerActivities, inp: PublishInput) -> Any:
        if inp.step == step:
            print(f"STALLED publishing step {step}", flush=True)
            threading.Event().wait()
        return publish(self, inp)

    TrainerActivities.publish_sync = publish_sync  # type: ignore[method-assign]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step", type=int, required=True)
    args, rest = parser.parse_known_args()
    stall(args.step)
    return dgrpo_main(rest)


if __name__ == "__main__":
    sys.exit(main())
