"""ART's ``art.backend`` module path: ``Backend`` (dgrpo's backends; dgrpo/client/backends.py has ``ArtBackend``,
ART's own protocol, whose hooks a model calls on any backend) and ART's type aliases of backend signatures,
``AnyModel`` and ``AnyTrainableModel`` (NeMo Agent Toolkit's ART plugin imports them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

from dgrpo.client.backends import ArtBackend, Backend

if TYPE_CHECKING:
    from dgrpo.model import Model, TrainableModel

AnyModel: TypeAlias = "Model[Any, Any]"
"""A model with any config and state type, as ART spells it (a string, as ART 0.5.17 to 0.5.23 define it)."""
AnyTrainableModel: TypeAlias = "TrainableModel[Any, Any]"
"""A trainable model with any config and state type, as ART spells it."""

__all__ = ["AnyModel", "AnyTrainableModel", "ArtBackend", "Backend"]
