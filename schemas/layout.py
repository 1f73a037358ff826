"""Where everything lives in the object store: the one definition of every key."""

from __future__ import annotations

MANIFEST_NAME = "manifest.json"
"""Written last into a checkpoint prefix; a prefix without it is not a checkpoint."""
TRAJECTORIES_FILE = "trajectories.parquet"
ADVANTAGES_FILE = "advantages.parquet"


def run_prefix(run_id: str) -> str:
    return f"runs/{run_id}/"


def step_prefix(run_id: str, step: int) -> str:
    return f"runs/{run_id}/steps/{step:06d}/"


def trajectories_key(run_id: str, step: int) -> str:
    return step_prefix(run_id, step) + TRAJECTORIES_FILE


def advantages_key(run_id: str, step: int) -> str:
    return step_prefix(run_id, step) + ADVANTAGES_FILE


def checkpoints_prefix(run_id: str) -> str:
    return f"runs/{run_id}/checkpoints/"


def checkpoint_prefix(run_id: str, step: int) -> str:
    return f"runs/{run_id}/checkpoints/{step:06d}/"


def metrics_key(run_id: str) -> str:
    return f"runs/{run_id}/metrics.parquet"


def run_state_key(run_id: str) -> str:
    return f"runs/{run_id}/state.json"


def adapter_name(model_name: str, step: int) -> str:
    """The name a served adapter answers to: ``<model>@<step>``."""
    return f"{model_name}@{step}"
