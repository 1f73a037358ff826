"""Whether two checkpoints of a step are the same training within fp32 rounding: what a gang of ranks trained
against what one device trains from the same start (tests/activities/test_gang_training.py, and the cluster's
gang test through tests/cluster/observer.py).

Adam moves a weight by about its learning rate whatever its gradient's size, so a gradient near zero moves by as much
as rounding lets its sign and size change. One device alone does it between micro-batch sizes: from the same
checkpoint, the tiny Qwen3's first step (tests/activities/test_gang_training.py's data and settings) at micro-batch
1 and at 4 against 2 leaves 118 and 31 of the adapter's 22,528 weights over 1e-5 apart, the most by 7.3e-3 and
3.4e-3 (2 ranks against 1 device: 96, 7.0e-3). So the rule is: all but ``OFF_FRACTION`` of the weights within
``ADAPTER_ATOL``, none beyond two updates; Adam's moments near by the tensor's norm. A rank's share lost or left
unreduced moves most weights far beyond it.
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from safetensors.torch import load_file

from activities.object_store import ObjectStore
from activities.state_files import ADAPTER_WEIGHTS, read_optimizer_state
from schemas.activities import TrainInput
from schemas.config import RunSpec
from schemas.layout import advantages_key
from schemas.refs import ObjectRef

ADAPTER_ATOL = 1e-5
"""fp32 rounding: summing a step's tokens in another order moves most of the adapter's weights by under 1e-6."""
OFF_FRACTION = 0.02
"""The adapter's weights allowed beyond ``ADAPTER_ATOL`` (each by at most two updates)."""
STATE_RTOL = 1e-2
"""Adam's moments, as far from the other's (by norm) as the gradients of those weights let them."""
STATE_FLOOR = 1e-3
"""...and a moment whose gradients nearly cancelled out (a sum far smaller than its terms, so rounding moves it by
more than 1% of itself: 1.7% was seen on a 2-host gang's step, 3.8e-11 on 2.3e-9) as far as this fraction of the
largest moment of its kind in the state, which is how large its terms' rounding can be. A rank's share lost or left
unreduced moves the adapter itself far beyond its rule."""


@dataclass
class StepDistance:
    """How far one checkpoint of a step is from another."""

    problems: list[str] = field(default_factory=list)
    """What makes it another training (empty: the same within fp32 rounding)."""
    n_off: int = 0
    n_weights: int = 0
    most: float = 0.0
    moved: float = 0.0
    """How far the wanted step moved its B matrices (zero at a run's start): that it trained at all."""

    def __str__(self) -> str:
        return (
            f"{self.n_off} of {self.n_weights} weights differ by over {ADAPTER_ATOL}, the most {self.most:.1e} "
            f"(B moved {self.moved:.1e}){'; ' + '; '.join(self.problems) if self.problems else ''}"
        )


def step_differences(got: str | Path, want: str | Path, update_bound: float) -> StepDistance:
    """How far checkpoint ``got`` is from ``want``; ``update_bound``: the most one weight may differ, two updates'
    worth (2 x epochs x rate)."""
    got_adapter, want_adapter = load_file(f"{got}/{ADAPTER_WEIGHTS}"), load_file(f"{want}/{ADAPTER_WEIGHTS}")
    if got_adapter.keys() != want_adapter.keys():
        return StepDistance(
            [f"adapter tensors differ: {sorted(got_adapter.keys() ^ want_adapter.keys())[:3]}"]
        )
    off = {key: (got_adapter[key] - tensor).abs() for key, tensor in want_adapter.items()}
    n_off = sum(int((d > ADAPTER_ATOL).sum()) for d in off.values())
    n_weights = sum(d.numel() for d in off.values())
    worst = max(off, key=lambda key: float(off[key].max()))
    most = float(off[worst].max())
    problems = []
    if n_off > OFF_FRACTION * n_weights:
        problems.append(f"{n_off} of {n_weights} weights differ by more than {ADAPTER_ATOL}")
    if most > update_bound:
        problems.append(f"{worst} differs by {most:.2e}, beyond {update_bound:.2e}")
    got_state, want_state = read_optimizer_state(got), read_optimizer_state(want)
    if (got_state is None) != (want_state is None):
        problems.append("one has an optimizer state, the other none")
    elif got_state is not None and want_state is not None:
        if got_state["param_groups"] != want_state["param_groups"]:
            problems.append("optimizer param groups differ")
        largest: dict[str, float] = {}
        for entry in want_state["state"].values():
            for name, value in entry.items():
                largest[name] = max(largest.get(name, 0.0), float(value.float().norm()))
        for index, entry in want_state["state"].items():
            theirs = got_state["state"].get(index, {})
            for name, value in entry.items():
                if name not in theirs:
                    problems.append(f"optimizer state {index}.{name} missing")
                    continue
                distance = float((theirs[name] - value).norm())
                if distance > STATE_RTOL * float(value.norm()) + STATE_FLOOR * largest[name] + 1e-12:
                    problems.append(
                        f"optimizer state {index}.{name} off by {distance:.2e} of {float(value.norm()):.2e}"
                    )
    moved = max(float(t.abs().max()) for k, t in want_adapter.items() if "lora_B" in k)
    return StepDistance(problems, n_off, n_weights, most, moved)


def retrained(store: ObjectStore, spec: RunSpec, steps: int) -> list[StepDistance]:
    """Each step of run ``spec`` trained again on one device, from the run's checkpoint before it and on the step's
    advantages, against the run's checkpoint of it: nothing lost, nothing trained twice, at any world size."""
    from activities.training import TrainerActivities

    bound = 2 * spec.train.epochs * spec.train.learning_rate
    out = []
    with tempfile.TemporaryDirectory(prefix="dgrpo-retrain-") as scratch:
        trainer = TrainerActivities(store, Path(scratch) / "staging", "retrain")
        for step in range(1, steps + 1):
            data = store.get_bytes(advantages_key(spec.run_id, step))
            uri = store.uri(advantages_key(spec.run_id, step))
            advantages = ObjectRef(uri=uri, size=len(data), sha256=hashlib.sha256(data).hexdigest())
            inp = TrainInput(run_id=spec.run_id, step=step, model=spec.model, advantages=advantages,
                             train=spec.train, start_from=store.checkpoint_ref(spec.run_id, step - 1))  # fmt: skip
            again = trainer.train_sync(inp, micro_batch=spec.train.micro_batch_size)
            trainer._written(Path(again.staging_dir))  # staged beside what follows: written once asked for
            theirs = Path(scratch) / f"published-{step}"
            store.get_checkpoint(store.checkpoint_ref(spec.run_id, step), theirs)
            out.append(step_differences(theirs, again.staging_dir, bound))
    return out
