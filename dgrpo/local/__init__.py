"""``dgrpo.local``: ART's ``art.local``, the ``LocalBackend`` that runs the embedded stack on this machine.

from dgrpo.local import LocalBackend          # ART: from art.local import LocalBackend
from dgrpo.local.backend import LocalBackend  # ART: from art.local.backend import LocalBackend
"""

from __future__ import annotations

from dgrpo.local.backend import LocalBackend, LocalTrainResult

__all__ = ["LocalBackend", "LocalTrainResult"]
