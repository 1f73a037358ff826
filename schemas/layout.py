"""Where everything lives in the object store: the one definition of every key."""

from __future__ import annotations

from pathlib import Path

MANIFEST_NAME = "manifest.json"
"""Written last into a checkpoint prefix, once every file is in: the checkpoint is *resumable* (adapter, optimizer
and trainer state). A prefix without it is not a checkpoint: resume, retention and the ART client never see it."""
ADAPTER_MANIFEST_NAME = "adapter_manifest.json"
"""Written into a checkpoint prefix once the adapter's files are in: the checkpoint is *servable* (the inference
servers may load it) while its optimizer and trainer state may still be uploading."""
TRAJECTORIES_FILE = "trajectories.parquet"
ADVANTAGES_FILE = "advantages.parquet"
SFT_EXAMPLES_FILE = "sft_examples.jsonl"
SCORED_FILE = "scored.parquet"
"""The step's trajectories with the judge's rewards (written next to ``trajectories.parquet``)."""


def step_name(step: int) -> str:
    """A step's folder name, here and on local disks: zero-padded, so names sort as numbers."""
    return f"{step:06d}"


def local_step_dir(root: str | Path, run_id: str, step: int) -> Path:
    """``<root>/<run_id>/<step>``: where a worker keeps a step's files (staged or downloaded checkpoints)."""
    return Path(root) / run_id / step_name(step)


def step_prefix(run_id: str, step: int) -> str:
    return f"runs/{run_id}/steps/{step_name(step)}/"


def trajectories_key(run_id: str, step: int) -> str:
    return step_prefix(run_id, step) + TRAJECTORIES_FILE


def rollout_shard_key(run_id: str, step: int, shard: int, attempt: int = 1) -> str:
    """One attempt at one shard of a step's rollouts; the shards are merged, in order, into its
    ``trajectories.parquet``. Each attempt has its own key: the merge reads the attempt the workflow recorded,
    and an attempt that a retry replaced but that still finishes writes beside it, never over it."""
    return step_prefix(run_id, step) + f"rollouts/shard-{shard:05d}-attempt-{attempt}.parquet"


def sft_examples_key(run_id: str, step: int) -> str:
    """The chats a supervised fine-tuning call that produces ``step`` trains on (JSONL)."""
    return step_prefix(run_id, step) + SFT_EXAMPLES_FILE


def scored_key(run_id: str, step: int, attempt: int = 1) -> str:
    """A judge attempt's scored trajectories. A retry writes beside the attempt it replaced (the first keeps
    the plain name), so an attempt still running after its retry's ref was recorded never changes that ref's
    object (an LLM judge need not score alike twice)."""
    suffix = "" if attempt == 1 else f"-attempt-{attempt}"
    return step_prefix(run_id, step) + SCORED_FILE.replace(".parquet", f"{suffix}.parquet")


def art_request_key(run_id: str, step: int) -> str:
    """The sha256 of the ART server request (``/_train_model``) that trains ``step``, written before it trains:
    the same request again, after a lost connection or a restarted server, gets that step's result."""
    return step_prefix(run_id, step) + "art-request.json"


def judge_cache_key(run_id: str, sha256: str) -> str:
    """One judged group's scores, by the content hash of what the judge was asked."""
    return f"runs/{run_id}/judge_cache/{sha256}.json"


def advantages_key(run_id: str, step: int) -> str:
    return step_prefix(run_id, step) + ADVANTAGES_FILE


def checkpoints_prefix(run_id: str) -> str:
    return f"runs/{run_id}/checkpoints/"


def checkpoint_prefix(run_id: str, step: int) -> str:
    return f"runs/{run_id}/checkpoints/{step_name(step)}/"


def metrics_key(run_id: str) -> str:
    return f"runs/{run_id}/metrics.parquet"


def metrics_events_prefix(run_id: str) -> str:
    """One JSON object per metrics write, never overwritten: ``<step>/<ns>-<id>.json`` (the truth that
    ``metrics.parquet`` is rebuilt from, so concurrent writers lose nothing)."""
    return f"runs/{run_id}/metrics/"


def metrics_event_key(run_id: str, step: int, written_ns: int, writer: str) -> str:
    return f"{metrics_events_prefix(run_id)}{step_name(step)}/{written_ns:020d}-{writer}.json"


def reward_curve_key(run_id: str) -> str:
    """The reward-per-step PNG, redrawn by every metrics activity."""
    return f"runs/{run_id}/reward_curve.png"


def scenarios_key(run_id: str, sha256: str) -> str:
    """A run's inline scenario list (JSON), stored once by the content hash of its bytes: the rollouts
    activities get its ref, not the list."""
    return f"runs/{run_id}/scenarios/{sha256}.json"


def run_text_key(run_id: str, kind: str, sha256: str) -> str:
    """A run's own chat template or judge rubric (UTF-8), stored once by the content hash of its bytes: the
    activities that use it get its ref, not the text."""
    return f"runs/{run_id}/texts/{kind}-{sha256}.txt"


def spec_key(run_id: str) -> str:
    """The RunSpec a run was started with (``dgrpo resume`` restarts from it)."""
    return f"runs/{run_id}/spec.json"


def model_key(run_id: str) -> str:
    """The ``ModelSpec`` an ART-style client registered for the run (checked on every ``register``)."""
    return f"runs/{run_id}/model.json"


def adapter_name(run_id: str, step: int) -> str:
    """The name a served adapter answers to: ``<run id>@<step>``. Named by the run, not the model, so two runs
    that train models of one name on one server never serve each other's adapters."""
    return f"{run_id}@{step}"


def worker_task_queue(trainer_queue: str, worker_id: str) -> str:
    """The task queue only trainer ``worker_id`` polls (publish runs where the staged adapter is)."""
    return f"{trainer_queue}@{worker_id}"


def gang_prefix(gang: str) -> str:
    """What the trainer workers of gang ``gang`` share (activities/gang/rendezvous.py): each member's record,
    its invitation, and each attempt's step, answers and roster."""
    return f"gangs/{gang}/"


def gang_member_key(gang: str, worker_id: str) -> str:
    """A member's record, rewritten every second while it lives (how the others know it does)."""
    return f"{gang_prefix(gang)}members/{worker_id}.json"


def gang_invite_key(gang: str, worker_id: str) -> str:
    """The newest attempt a member is invited to (a leader overwrites it)."""
    return f"{gang_prefix(gang)}invites/{worker_id}.json"


def gang_attempt_prefix(gang: str, attempt: str) -> str:
    """One attempt's files: ``step.json``, ``sequences.safetensors``, ``replies/``, ``roster.json``, ``ready/``."""
    return f"{gang_prefix(gang)}attempts/{attempt}/"


ART_BASE_PATH = ".art"
"""Where ART-style models keep their local files unless given ``base_path`` (ART: ``.art``)."""
ART_HISTORY_FILE = "history.jsonl"
"""ART's local metrics log: one JSON object per ``model.log`` row."""
ART_STATE_FILE = "state.json"
"""ART's local model state (its metrics builder's running totals, under ``_metrics_builder_state``)."""


def art_models_dir(base_path: str | Path, project: str) -> Path:
    """``<base_path>/<project>/models``: where ART keeps a project's models."""
    return Path(base_path) / project / "models"


def art_model_dir(base_path: str | Path, project: str, name: str) -> Path:
    """``<base_path>/<project>/models/<name>``: where ART keeps a model's local files (``model.log``'s)."""
    return art_models_dir(base_path, project) / name


def art_trajectories_dir(model_dir: str | Path) -> Path:
    """``<model dir>/trajectories``: ``model.log``'s groups, a directory per split."""
    return Path(model_dir) / "trajectories"


def art_trajectories_path(model_dir: str | Path, split: str, step: int) -> Path:
    """``<model dir>/trajectories/<split>/<step:04d>.parquet``: one ``model.log`` call's groups, as ART names it."""
    return art_trajectories_dir(model_dir) / split / f"{step:04d}.parquet"


ART_CHECKPOINTS_DIR = "checkpoints"
"""ART's checkpoints under a model's directory (local or in an S3 backup): ``checkpoints/<step:04d>/``."""


def art_checkpoint_name(step: int) -> str:
    """ART's checkpoint folder name: the step, zero-padded to 4 digits (``0001``)."""
    return f"{step:04d}"


def art_backup_prefix(prefix: str | None, project: str, name: str) -> str:
    """``[<prefix>/]<project>/models/<name>/``: a model's directory in an S3 backup, ART's layout."""
    head = f"{prefix.strip('/')}/" if prefix and prefix.strip("/") else ""
    return f"{head}{project}/models/{name}/"
