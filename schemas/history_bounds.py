"""How big a ``TrainingRun``'s workflow history can grow, and the run-spec bounds that keep it within
Temporal's limits.

Temporal refuses a workflow whose history passes 51,200 events or 50 MiB, a payload over 2 MiB, and more
than 2,000 activities pending at once. A run continues as new every ``continue_as_new_every`` steps, so the
history to bound is one run's: the steps it runs, each at its worst (every resample, every retrain).
``RunSpec`` refuses a spec whose worst history passes a fifth of those limits (Temporal's own warning
thresholds), which leaves the rest for what the spec cannot see: pause/resume/stop updates, workflow tasks
retried after a worker crash. ``tests/workflows/test_history_bounds.py`` runs the largest allowed shapes and
checks that the recorded histories stay under these estimates.
"""

from __future__ import annotations

HISTORY_EVENTS_LIMIT = 51_200
"""Temporal's hard limit on the events in one workflow run's history."""
HISTORY_BYTES_LIMIT = 50 * 2**20
"""Temporal's hard limit on the bytes of one workflow run's history."""
PAYLOAD_BYTES_LIMIT = 2 * 2**20
"""Temporal's hard limit on one payload (an activity's input, a workflow's input)."""
PENDING_ACTIVITIES_LIMIT = 2_000
"""Temporal's hard limit on the activities one workflow has scheduled and not yet closed."""
GRPC_MESSAGE_BYTES_LIMIT = 4 * 2**20
"""Temporal's limit on one gRPC message: a workflow task's completion carries every command it made together
(all of a step's shards are scheduled in one), so their inputs share it."""

HISTORY_EVENTS_BUDGET = HISTORY_EVENTS_LIMIT // 5
"""10,240 events: what a run's worst case may use (Temporal warns there); the rest is margin."""
HISTORY_BYTES_BUDGET = HISTORY_BYTES_LIMIT // 5
"""10 MiB: what a run's worst case may use (Temporal warns there); the rest is margin."""

RESAMPLES_WITHOUT_SIGNAL = 3
"""Times TrainingRun rolls a step out again (other scenarios) when every group's rewards were equal."""
RETRAINS_AFTER_LOST_WORKER = 3
"""Times a step is trained again because the worker holding its adapter vanished before publishing."""

EVENTS_PER_ACTIVITY = 6
"""Scheduled, started and closed, plus the workflow task its result wakes (scheduled, started, completed)."""
ROLLOUT_ROUNDS_PER_STEP = RESAMPLES_WITHOUT_SIGNAL + 2
"""A step's scenarios are rolled out once, once per resample, and once more ahead of time in pipelined mode
(a prefetch dropped as too stale)."""
ACTIVITIES_PER_ROUND_BEYOND_SHARDS = 3
"""Each rollout round: its shards, then the merge, the judge and the advantages."""
ACTIVITIES_PER_STEP_BEYOND_ROUNDS = 2 * (RETRAINS_AFTER_LOST_WORKER + 1) + 5
"""Train and publish per training attempt; sleep, wake, reload, metrics and retention once."""
RUN_OVERHEAD_EVENTS = 100
"""A run's start (newest checkpoint, publish step 0, reload), version markers, and its close."""

EVENT_BYTES = 1024
"""Bytes of an event whose payloads are refs and counts: about 560 measured, so twice that (RunState aside)."""
RUN_STATE_BYTES = 256 * 1024
"""Bytes of the run state carried across continue-as-new: at most MAX_HISTORY (200) step summaries."""

MAX_SHARDS_PER_STEP = 128
"""A step's shards are scheduled in one workflow task and pending together: 128 is far below the 2,000
pending activities, and 128 shard inputs of refs are a small part of what one workflow task may carry.
At ``continue_as_new_every = 1`` a step of 128 shards at its worst is about 4,100 events."""
MAX_CONTINUE_AS_NEW_EVERY = 50
"""At one shard a step at its worst is 33 activities (about 200 events): 50 steps use the event budget."""
MAX_RUN_TEXT_CHARS = 65536
"""A run's own chat template and its judge rubric, each (the largest templates of current models are ~20 kB).
Each is stored once per run (``store_run_texts``) and the activities carry its ref, so a run's history holds
it only in the spec (at the start and at each continue-as-new), in the storing activity's input and in the
start's ``ServeModelInput``."""
JSON_BYTES_PER_CHAR = 6
"""The most bytes one character of text takes in a JSON payload (a control character, escaped ``\u001f``)."""
MAX_SPEC_BYTES = PAYLOAD_BYTES_LIMIT - RUN_STATE_BYTES - 64 * 1024
"""A spec's JSON: continue-as-new sends it with the run state as one payload, under the 2 MiB payload limit
with 64 KiB of envelope to spare. An inline scenario list at its cap and both texts at theirs in plain ASCII
(1 MiB + 2 x 64 KiB) fit; texts that escape to 6 bytes a character may not, and are refused naming the spec."""
MAX_ACTIVITY_INPUT_BYTES = 16 * 1024
"""The largest input a spec within its bounds makes for one activity (names, paths, endpoints, refs, small
configs; never a list or a text): ``tests/workflows/test_history_bounds.py`` builds the largest and checks.
A step's ``MAX_SHARDS_PER_STEP`` shards, scheduled in one workflow task, then carry at most half of gRPC's limit."""
MAX_INLINE_SCENARIOS_BYTES = 1024 * 1024
"""An inline scenario list travels in the run's input (the spec, at its start and at each continue-as-new) and
once in the activity that stores it (``layout.scenarios_key``); the rollouts activities carry its ref. 1 MiB
leaves the spec's other fields and Temporal's envelope half of the 2 MiB payload limit; larger lists belong in
a ``.jsonl``/``.parquet`` file or a ``module:function``."""


def shards_per_step(groups_per_step: int, groups_per_shard: int) -> int:
    """How many rollouts activities one step fans out to (``workflows/rollout_shards.shard_slices``)."""
    return -(-groups_per_step // groups_per_shard)


def step_activities(shards: int) -> int:
    """The most activities one step of ``TrainingRun`` schedules: every resample and retrain taken."""
    return (
        ROLLOUT_ROUNDS_PER_STEP * (shards + ACTIVITIES_PER_ROUND_BEYOND_SHARDS)
        + ACTIVITIES_PER_STEP_BEYOND_ROUNDS
    )


def run_history_events(shards: int, steps_per_run: int) -> int:
    """The most events one run (between two continue-as-new) of ``TrainingRun`` records."""
    return steps_per_run * step_activities(shards) * EVENTS_PER_ACTIVITY + RUN_OVERHEAD_EVENTS


def run_history_bytes(
    shards: int,
    steps_per_run: int,
    inline_scenarios_bytes: int,
    spec_bytes: int,
    texts_bytes: int = 0,
    carried_bytes: int = 0,
) -> int:
    """The most bytes one run of ``TrainingRun`` records: its events, the inline scenarios the activity that
    stores them carries and the texts (chat template, rubric) the storing activity and the start's serve carry
    (once per run; the activities that use them carry refs), the spec's strings every activity input may carry
    (``carried_bytes``: paths, names, endpoints), and the spec (inline scenarios and texts included) and run
    state it starts with and continues as new with."""
    return (
        run_history_events(shards, steps_per_run) * EVENT_BYTES
        + steps_per_run * step_activities(shards) * carried_bytes
        + inline_scenarios_bytes
        + 2 * texts_bytes
        + 2 * (spec_bytes + RUN_STATE_BYTES)
    )
