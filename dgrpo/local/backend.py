"""``dgrpo.local.backend``: where ``from art.local(.backend) import LocalBackend`` points, with ART 0.5's
``backend.train`` and ``backend.train_sft`` (dgrpo/art_backend.py) on top of the embedded stack's backend
(dgrpo/local/stack.py).

with LocalBackend() as backend:            # or ``async with``
    await model.register(backend)
    result = await backend.train(model, groups, learning_rate=1e-5)
    await model.log(groups, metrics=result.metrics, step=result.step, split="train")
"""

from __future__ import annotations

from dgrpo.art_backend import ArtTraining
from dgrpo.local import stack
from dgrpo.types import LocalTrainResult


class LocalBackend(ArtTraining, stack.LocalBackend):
    """``dgrpo.LocalBackend`` with ART's ``train(model, groups, ...)`` and a plain ``with`` block."""

    def __enter__(self) -> LocalBackend:
        return self  # started by the first ``register``

    def __exit__(self, *exc: object) -> None:
        self.close_sync()


__all__ = ["LocalBackend", "LocalTrainResult"]
