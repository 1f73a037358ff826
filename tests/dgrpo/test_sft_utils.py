"""``dgrpo.utils.sft`` (ART's ``art.utils.sft``): SFT chats in JSONL, learning-rate schedules, and a dataset cut
into ``train_sft`` calls that follow one schedule. ``model.train_sft`` itself on the real stack:
``test_art_sft.py`` (which trains its first step through ``train_sft_from_file``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dgrpo.client.sft import examples_jsonl, sft_config
from dgrpo.types import TrainResult, TrainSFTConfig
from dgrpo.utils.sft import (
    create_lr_schedule,
    create_sft_dataset_iterator,
    get_file_row_count,
    iterate_file,
    train_sft_from_file,
)
from schemas.trajectory import Trajectory

TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}


def chat(i: int) -> Trajectory:
    return Trajectory(
        messages_and_choices=[{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]
    )


def question(t: Trajectory) -> str:
    return str(t.messages()[0]["content"])


def write_file(path: Path, n: int) -> Path:
    """``n`` chats as model.train_sft uploads them, blank lines between, the first with a tool."""
    lines = examples_jsonl([chat(i) for i in range(n)]).decode().splitlines()
    first = json.loads(lines[0])
    lines[0] = json.dumps({**first, "tools": [TOOL]})
    path.write_text("\n\n".join(lines) + "\n")
    return path


def test_schedule_warms_up_from_above_min_to_peak_then_decays_to_min() -> None:
    lrs = create_lr_schedule(total_steps=7, peak_lr=1.0, method="linear", warmup_steps=2, min_lr=0.2)
    assert lrs == pytest.approx([0.6, 1.0, 1.0, 0.8, 0.6, 0.4, 0.2])
    cosine = create_lr_schedule(total_steps=5, peak_lr=1.0, method="cosine", min_lr=0.0)
    assert cosine == pytest.approx(
        [1.0, (1 + math.cos(math.pi / 4)) / 2, 0.5, (1 + math.cos(3 * math.pi / 4)) / 2, 0]
    )
    assert create_lr_schedule(4, 1.0, "constant", warmup_steps=1) == pytest.approx([1.0] * 4)
    # All warmup when it is as long as the run; one step is the peak; none is an empty schedule.
    assert create_lr_schedule(3, 0.3, warmup_steps=6) == pytest.approx([0.05, 0.1, 0.15])
    assert create_lr_schedule(1, 0.3, "linear", min_lr=0.1) == [0.3]
    assert create_lr_schedule(0, 0.3) == []
    with pytest.raises(ValueError, match="step"):
        create_lr_schedule(3, 0.3, "step")  # type: ignore[arg-type]


def test_chunks_cover_each_epoch_once_and_follow_one_schedule() -> None:
    trajectories = [chat(i) for i in range(7)]
    chunks = list(
        create_sft_dataset_iterator(
            trajectories,
            chunk_size=2,
            epochs=2,
            batch_size=2,
            peak_lr=1.0,
            warmup_ratio=0.25,
            show_progress=False,
        )
    )
    # 7 chats are 4 batches an epoch (the last short): chunks of 2 batches, never across an epoch.
    assert [(c.step, c.epoch, c.epoch_step, len(c.trajectories)) for c in chunks] == [
        (0, 0, 0, 4),
        (2, 0, 2, 3),
        (4, 1, 0, 4),
        (6, 1, 2, 3),
    ]
    for epoch in (0, 1):
        seen = [question(t) for c in chunks if c.epoch == epoch for t in c.trajectories]
        assert sorted(seen) == sorted(question(t) for t in trajectories)
    first_epoch = [question(t) for t in chunks[0].trajectories + chunks[1].trajectories]
    second_epoch = [question(t) for t in chunks[2].trajectories + chunks[3].trajectories]
    assert first_epoch != second_epoch  # each epoch has its own order
    rates = [lr for c in chunks for lr in c.config.learning_rate]  # type: ignore[union-attr]
    assert rates == create_lr_schedule(8, 1.0, "linear", warmup_steps=2)
    assert all(c.config.batch_size == 2 for c in chunks)


def test_chunks_resume_at_a_step_and_repeat_with_a_seed() -> None:
    trajectories = [chat(i) for i in range(12)]

    def run(**kw: int) -> list[tuple[int, list[str], object]]:
        chunks = create_sft_dataset_iterator(
            trajectories, chunk_size=3, batch_size=2, show_progress=False, **kw
        )
        return [(c.step, [question(t) for t in c.trajectories], c.config.learning_rate) for c in chunks]

    whole = run(seed=1)
    assert run(seed=1) == whole and run(seed=2) != whole
    assert run(seed=1, initial_step=3) == whole[1:]
    # Batch-exact: from within the second chunk, that chunk from that very batch (none trained twice).
    (step, chats, rates), *rest = run(seed=1, initial_step=4)
    assert (step, chats, rates) == (4, whole[1][1][2:], whole[1][2][1:]) and rest == whole[2:]  # type: ignore[index]
    # Across epochs too: 6 batches an epoch in chunks of 4 and 2; batch 6 opens the second epoch.
    two = create_sft_dataset_iterator(
        trajectories, chunk_size=4, batch_size=2, epochs=2, initial_step=6, show_progress=False
    )
    assert [(c.step, c.epoch, c.epoch_step, len(c.trajectories)) for c in two] == [
        (6, 1, 0, 8),
        (10, 1, 4, 4),
    ]
    assert list(create_sft_dataset_iterator([], show_progress=False)) == []


def test_a_chunks_config_is_what_dgrpos_train_sft_trains_with() -> None:
    chunk = next(
        create_sft_dataset_iterator(
            [chat(i) for i in range(5)], chunk_size=4, batch_size=2, show_progress=False
        )
    )
    sft = sft_config(chunk.config, chunk.trajectories, None, {})
    assert (sft.batch_size, sft.learning_rates) == (2, chunk.config.learning_rate)


def test_iterate_file_streams_each_chat_once_an_epoch_through_a_small_buffer(tmp_path: Path) -> None:
    path = write_file(tmp_path / "chats.jsonl", 9)
    assert get_file_row_count(str(path)) == 9
    streamed = list(iterate_file(str(path), epochs=2, shuffle_buffer_size=3, seed=5))
    first, second = [question(t) for t in streamed[:9]], [question(t) for t in streamed[9:]]
    assert sorted(first) == sorted(second) == [f"q{i}" for i in range(9)]
    assert first != [f"q{i}" for i in range(9)] and first != second
    by_question = {question(t): t for t in streamed[:9]}
    assert by_question["q0"].tools == [TOOL] and by_question["q1"].tools is None
    assert by_question["q4"].messages() == chat(4).messages()
    again = [
        question(t) for t in iterate_file(str(path), epochs=2, shuffle_buffer_size=3, seed=5, initial_skip=7)
    ]
    assert again == (first + second)[7:]
    with pytest.raises(ValueError, match="jsonl"):
        list(iterate_file(str(tmp_path / "chats.json")))


class RecordingModel:
    """What ``train_sft_from_file`` calls: ``TrainableModel.train_sft`` (on the real stack in test_art_sft.py)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[Trajectory], TrainSFTConfig | None]] = []

    async def train_sft(
        self,
        trajectories: list[Trajectory],
        config: TrainSFTConfig | None = None,
        _config: dict[str, object] | None = None,
        verbose: bool = False,
        log_metrics: bool = True,
    ) -> TrainResult:
        self.calls.append((trajectories, config))
        self.logged = log_metrics
        return TrainResult(step=len(self.calls))


async def test_train_sft_from_file_trains_a_segment_of_one_schedule(tmp_path: Path) -> None:
    path = str(write_file(tmp_path / "chats.jsonl", 5))
    model = RecordingModel()
    # 5 chats x 2 epochs are 4 batches of 3 (the stream runs on across epochs): batches 1 and 2 of them.
    result = await train_sft_from_file(
        model, path, epochs=2, batch_size=3, peak_lr=1.0, warmup_ratio=0.5, initial_step=1, final_step=3
    )
    assert result == TrainResult(step=1)
    [(chats, config)] = model.calls
    assert config is not None and config.batch_size == 3
    assert config.learning_rate == create_lr_schedule(4, 1.0, "linear", warmup_steps=2)[1:3]
    assert [question(t) for t in chats] == [question(t) for t in iterate_file(path, epochs=2)][3:9]
    assert await train_sft_from_file(model, path, initial_step=3) is None and len(model.calls) == 1
    await train_sft_from_file(model, path, batch_size=5, assistant_turns="last", log_metrics=False)
    config = model.calls[-1][1]
    assert config is not None and config.assistant_turns == "last" and model.logged is False


def test_training_only_the_last_assistant_turn_needs_chats_that_end_with_it() -> None:
    last = TrainSFTConfig(assistant_turns="last")
    assert sft_config(last, [chat(1)], None, {}).assistant_turns == "last"
    asked = Trajectory(messages_and_choices=[*chat(1).messages(), {"role": "user", "content": "and?"}])
    with pytest.raises(ValueError, match="assistant_turns='last' requires the final message"):
        sft_config(last, [chat(1), asked], None, {})
    assert sft_config(TrainSFTConfig(), [asked], None, {}).assistant_turns == "all"
