"""ART's ``art.model``: ``Model`` (dgrpo/client/model.py) and ``TrainableModel``
(dgrpo/client/trainable_model.py), so ``from art.model import Model, TrainableModel`` works."""

from __future__ import annotations

import time  # noqa: F401  ART's tests patch art.model.time.monotonic, the clock of model.log's time/step_wall_s

from dgrpo.client.model import Model
from dgrpo.client.openai_client import CostRecordingCompletions
from dgrpo.client.trainable_model import TrainableModel

_OpenAIChatCompletionsProxy = CostRecordingCompletions
"""ART's name for ``client.chat.completions`` of ``openai_client()``."""

__all__ = ["Model", "TrainableModel"]
