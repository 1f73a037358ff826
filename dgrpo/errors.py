"""Errors a user of the ART-style client can make, each saying what to fix."""

from __future__ import annotations

from schemas.errors import DgrpoError, RunSpecError


class NotRegisteredError(DgrpoError, RuntimeError):
    """A model method that needs a backend was called before ``await model.register(backend)``."""


class ModelConflictError(RunSpecError):
    """The model's name is already registered in its project with another base model or LoRA shape."""


class EmptyGroupsError(RunSpecError):
    """``model.train`` got no groups, or groups with no trajectories."""


class NoTrainableChoiceError(RunSpecError):
    """The groups hold no sampled choice with token ids, so there is nothing to train on."""


class TooManyRolloutErrors(DgrpoError, RuntimeError):
    """More rollouts raised than ``gather_trajectory_groups(max_exceptions=...)`` tolerates."""


class BackendError(DgrpoError, RuntimeError):
    """The backend (the stack, the workers, or the Temporal cluster) could not be used."""


class UnsupportedArtOption(RunSpecError):
    """An ART setting (``_internal_config``, a train option) that dgrpo cannot honour; the message says why."""


class ArtSettingIgnored(UserWarning):
    """An ART setting of its own engine or hardware (``gpu_memory_utilization``, ``engine_args``, ...): accepted,
    not applied by the model; the worker's operator sets it (the warning names how). It changes no result."""


class UnsupportedArtFeature(NotImplementedError):
    """A public ART name whose feature dgrpo does not have (yet); the message names the feature and why."""


class UnsupportedArtAttribute(UnsupportedArtFeature, AttributeError):
    """A public ART name dgrpo refuses, read as ``art.<name>``. Also an ``AttributeError``, so feature detection
    works as on ART without it: ``hasattr(art, "ServerlessBackend")`` is False and ``getattr(art, name, None)`` is
    None; reading it says why."""


class UnsupportedArtModule(UnsupportedArtFeature, ImportError):
    """An ART module path dgrpo refuses (dgrpo/art_compat/refusals.py). Also an ``ImportError``, so a program's
    ``except ImportError`` around an optional backend (as ART's own tests skip Tinker and Unsloth) still works."""


class LocalServingUnavailableError(DgrpoError, RuntimeError):
    """ART 0.5.23's error for a local backend that cannot serve; dgrpo never raises it (its server is the
    inference worker's), so a program's ``except art.LocalServingUnavailableError`` works and catches nothing."""
