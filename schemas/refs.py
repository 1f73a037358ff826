"""References and small summaries that workflows pass around instead of data."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

SHA256_PATTERN = r"^[0-9a-f]{64}$"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
ADAPTER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,255}$"

Name = Annotated[str, Field(pattern=NAME_PATTERN)]
"""A run id, model name or project: 1-128 letters, digits, ``.``, ``_`` or ``-``, starting with a letter or
digit. So it is one safe path component and one S3 key segment: never empty, ``.``, ``..``, or with a ``/``."""
AdapterName = Annotated[str, Field(pattern=ADAPTER_NAME_PATTERN)]
"""A served adapter's name (``<model name>@<step>``, see ``layout.adapter_name``): names and ``@``, no ``/``."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ObjectRef(_Strict):
    """One object in the store (or a local file), pinned by its content hash."""

    uri: str = Field(pattern=r"^(s3://[^/]+/.+|file://.+)$")
    """``s3://bucket/key``, or ``file:///abs/path`` for a local copy a client wrote and reads itself
    (``trajectory_store.write_groups``): a worker reads only its own store's ``s3://`` objects and refuses any
    other URI with a ``ForeignObjectError`` (non-retryable), before it opens anything."""
    size: int = Field(ge=0, le=5 * 2**40)  # S3's largest object
    """Size in bytes."""
    sha256: str = Field(pattern=SHA256_PATTERN)
    """Hex sha256 of the content."""


class ManifestEntry(_Strict):
    path: str
    """Path relative to the checkpoint prefix."""
    size: int = Field(ge=0, le=5 * 2**40)  # S3's largest object
    sha256: str = Field(pattern=SHA256_PATTERN)


class Manifest(_Strict):
    """The file list of a directory upload; written last, so its presence means complete."""

    files: list[ManifestEntry]
    """Every file of the upload, with its size and sha256."""
    metadata: dict[str, str | int | float | bool | None] = Field(default_factory=dict)
    """Small facts about the upload (step, run id, base model)."""


class CheckpointRef(_Strict):
    """A complete (manifested) checkpoint of a run."""

    run_id: Name
    step: int = Field(ge=0)
    """The step this adapter is the result of (step 0 is the starting adapter)."""
    uri: str = Field(pattern=r"^(s3://[^/]+/.+/|file://.+/)$")
    """The checkpoint prefix, ending in ``/``."""
    manifest_sha256: str = Field(pattern=SHA256_PATTERN)
    """sha256 of the manifest file, so a reader can tell it read the one that was published."""


class AdapterRef(_Strict):
    """A *servable* checkpoint: its adapter's files and adapter manifest are written, so the inference servers may
    load it; its optimizer and trainer state may still be uploading (``CheckpointRef`` once they are)."""

    run_id: Name
    step: int = Field(ge=0)
    uri: str = Field(pattern=r"^(s3://[^/]+/.+/|file://.+/)$")
    """The checkpoint prefix, ending in ``/``."""
    adapter_sha256: str = Field(pattern=SHA256_PATTERN)
    """sha256 of the adapter manifest (``activities.checkpoints.adapter_manifest_bytes``): names the adapter's
    content, whichever manifest it is read from, so a step trained again with other weights is another adapter."""


class TrajectoriesRef(_Strict):
    """A step's trajectories in the store, with the summary a workflow needs."""

    ref: ObjectRef
    run_id: Name | Literal[""]
    """The run the trajectories belong to; empty for a local file written outside any run."""
    step: int = Field(ge=0)
    n_groups: int = Field(ge=0)
    n_trajectories: int = Field(ge=0)
    n_exceptions: int = Field(0, ge=0)
    reward_mean: float | None = None
    reward_std: float | None = None
    policy_adapters: list[Annotated[str, Field(pattern=SHA256_PATTERN)]] = Field(default_factory=list)
    """The ``adapter_sha256`` of each adapter that sampled its trajectories, sorted: one, unless its shards were
    sampled by different adapters; none when unknown (the base model, a server no dgrpo inference worker
    fronts, files written before adapters were labelled)."""
