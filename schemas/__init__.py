"""The data contract: pydantic models only (safe to import inside the Temporal workflow sandbox)."""

from schemas.config import (
    JudgeConfig,
    LoraConfig,
    ModelSpec,
    RunSpec,
    ServingSpec,
    StorageSpec,
    TaskSpec,
    TrainConfig,
    load_run_spec,
    parse_run_spec,
)
from schemas.refs import CheckpointRef, Manifest, ManifestEntry, ObjectRef, TrajectoriesRef
from schemas.trajectory import Choice, ExceptionRecord, Trajectory, TrajectoryGroup

__all__ = [
    "CheckpointRef",
    "Choice",
    "ExceptionRecord",
    "JudgeConfig",
    "LoraConfig",
    "Manifest",
    "ManifestEntry",
    "ModelSpec",
    "ObjectRef",
    "RunSpec",
    "ServingSpec",
    "StorageSpec",
    "TaskSpec",
    "TrainConfig",
    "TrajectoriesRef",
    "Trajectory",
    "TrajectoryGroup",
    "load_run_spec",
    "parse_run_spec",
]
