"""Another process on this host with a CPU share (host/cpu_share.py), told over stdin to be busy or idle."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HOLDER = """
import sys
from pathlib import Path
from host.cpu_share import CpuShare
share = CpuShare(Path(sys.argv[1]), cores=2)
for line in sys.stdin:
    if line.strip() == "busy":
        share.enter()
    else:
        share.leave()
    print("ok", flush=True)
"""


class Neighbour:
    def __init__(self, directory: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(directory)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parents[1],
        )

    def say(self, what: str) -> None:
        """``busy`` or ``idle``; returns once the neighbour is."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(what + "\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline().strip() == "ok"

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
