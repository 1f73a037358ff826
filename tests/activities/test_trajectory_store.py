"""Trajectory Parquet: exact round trips through the real S3 server, and files other tools can read."""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from activities import trajectory_store as ts
from activities.object_store import ObjectStore
from schemas import layout
from schemas.errors import CorruptTrajectoriesError, ForeignObjectError
from schemas.trajectory import (
    SCHEMA_VERSION,
    Choice,
    ChoiceLogprobs,
    ExceptionRecord,
    TokenLogprob,
    TopLogprob,
    Trajectory,
    TrajectoryGroup,
)

text = st.text(max_size=24)  # any unicode (hypothesis leaves out lone surrogates, which UTF-8 cannot hold)
finite = st.floats(allow_nan=False, allow_infinity=False)
label = st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53), finite, text)
labels = st.dictionaries(text, label, max_size=4)
token_ids = st.lists(st.integers(0, 2**31 - 1), max_size=12)
content = st.one_of(
    st.none(), text, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}), max_size=3)
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "tool"]), "content": content},
    optional={"name": text, "tool_call_id": text},
)
tool_call = st.fixed_dictionaries(
    {
        "id": text,
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": text, "arguments": text.map(lambda s: json.dumps({"q": s}))}
        ),
    }
)
top = st.builds(
    TopLogprob, token=text, logprob=finite, bytes=st.none() | st.lists(st.integers(0, 255), max_size=4)
)
token_logprob = st.builds(
    TokenLogprob,
    token=text,
    logprob=st.floats(max_value=0, allow_nan=False),
    top_logprobs=st.lists(top, max_size=2),
)
choice = st.builds(
    Choice,
    index=st.integers(0, 7),
    finish_reason=st.sampled_from([None, "stop", "length", "tool_calls"]),
    message=st.fixed_dictionaries(
        {"role": st.just("assistant"), "content": st.none() | text},
        optional={"tool_calls": st.lists(tool_call, max_size=2)},
    ),
    logprobs=st.none() | st.builds(ChoiceLogprobs, content=st.lists(token_logprob, max_size=5)),
    token_ids=st.none() | token_ids,
    prompt_token_ids=st.none() | token_ids,
)
trajectory = st.builds(
    Trajectory,
    messages_and_choices=st.lists(st.one_of(message, choice), max_size=5),
    tools=st.none()
    | st.lists(
        st.fixed_dictionaries(
            {"type": st.just("function"), "function": st.fixed_dictionaries({"name": text})}
        ),
        max_size=2,
    ),
    reward=st.floats(allow_nan=True, allow_infinity=True),
    metrics=st.dictionaries(text, st.one_of(st.booleans(), st.integers(-1000, 1000), finite), max_size=3),
    metadata=labels,
    logs=st.lists(text, max_size=2),
    policy_step=st.none() | st.integers(0, 10_000),
)
exception = st.builds(ExceptionRecord, type=text, message=text, traceback=text)
group = st.builds(
    lambda trajs, excs, meta: TrajectoryGroup(trajs, exceptions=excs, metadata=meta),
    st.lists(trajectory, max_size=4),
    st.lists(exception, max_size=2),
    labels,
)


def same(a: list[TrajectoryGroup], b: list[TrajectoryGroup]) -> bool:
    # Everything (group metadata included) compared as JSON text: NaN != NaN as floats, but its text is equal.
    return [ts.record_json(g) for g in a] == [ts.record_json(g) for g in b]


def sample_groups() -> list[TrajectoryGroup]:
    def traj(i: int, reward: float) -> Trajectory:
        return Trajectory(
            messages_and_choices=[
                {"role": "system", "content": "You play 2048."},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": f"board {i} "}, {"type": "text", "text": "é"}],
                },
                Choice(
                    finish_reason="stop",
                    message={"role": "assistant", "content": "left"},
                    logprobs=ChoiceLogprobs(content=[TokenLogprob(token="left", logprob=-0.25)]),
                    token_ids=[17, 18],
                    prompt_token_ids=list(range(30)),
                ),
            ],
            reward=reward,
            policy_step=3,
            metadata={"scenario": f"s{i}"},
        )

    return [
        TrajectoryGroup([traj(0, 1.0), traj(1, 0.0)], metadata={"scenario": "s0"}),
        TrajectoryGroup([traj(2, 0.5), ValueError("env crashed")], metadata={"scenario": "s1"}),
        TrajectoryGroup([], metadata={"scenario": "empty"}),
    ]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(groups=st.lists(group, max_size=4), with_adv=st.booleans())
def test_round_trip_through_s3_is_exact(
    object_store: ObjectStore, groups: list[TrajectoryGroup], with_adv: bool
) -> None:
    advantages = [[float(i) - 0.5 for i in range(len(g.trajectories))] for g in groups] if with_adv else None
    key = f"prop/{uuid.uuid4().hex}.parquet"
    ref = ts.upload_groups(object_store, groups, "run-p", 7, key=key, advantages=advantages)
    assert ref.n_groups == len(groups) and ref.ref.uri == object_store.uri(key)
    assert ref.n_trajectories == sum(len(g.trajectories) for g in groups)
    back = ts.download_groups(object_store, ref.ref.uri)
    assert same(back, groups)
    expected_adv = advantages or [[None] * len(g.trajectories) for g in groups]
    assert ts.advantages_of(ts.download_table(object_store, key), key) == expected_adv


def test_default_key_and_summary(object_store: ObjectStore) -> None:
    groups = sample_groups()
    ref = ts.upload_groups(object_store, groups, "run-1", 4)
    assert ref.ref.uri == object_store.uri(layout.trajectories_key("run-1", 4))
    assert (ref.n_groups, ref.n_trajectories, ref.n_exceptions) == (3, 3, 1)
    assert ref.reward_mean == pytest.approx(0.5)
    assert same(ts.download_groups(object_store, layout.trajectories_key("run-1", 4)), groups)
    assert same(ts.load_groups(ref.ref.uri, object_store), groups)


def test_files_open_in_polars_and_duckdb(object_store: ObjectStore, tmp_path: Path) -> None:
    ts.upload_groups(object_store, sample_groups(), "run-a", 2, advantages=[[1.0, -1.0], [0.0], []])
    path = object_store.get_file(layout.trajectories_key("run-a", 2), tmp_path / "t.parquet")

    df = pl.read_parquet(path)
    assert df.columns == ts.ARROW_SCHEMA.names
    rows = df.filter(pl.col("kind") == "trajectory")
    assert rows["reward"].to_list() == [1.0, 0.0, 0.5]
    assert rows["advantage"].to_list() == [1.0, -1.0, 0.0]
    assert rows["completion_tokens"].to_list() == [2, 2, 2] and rows["prompt_tokens"].to_list() == [
        30,
        30,
        30,
    ]
    assert rows["messages"][0].to_list()[1] == {"role": "user", "content": "board 0 é"}
    assert set(df["run_id"].to_list()) == {"run-a"} and set(df["step"].to_list()) == {2}
    exc = df.filter(pl.col("kind") == "exception")
    assert exc["exception_type"].to_list() == ["ValueError"] and exc["group_index"].to_list() == [1]

    con = duckdb.connect()
    by_group = con.execute(
        "SELECT group_index, count(*), avg(reward) FROM read_parquet(?) WHERE kind = 'trajectory' "
        "GROUP BY 1 ORDER BY 1",
        [str(path)],
    ).fetchall()
    assert by_group == [(0, 2, 0.5), (1, 1, 0.5)]
    (role,) = con.execute("SELECT messages[3].role FROM read_parquet(?) LIMIT 1", [str(path)]).fetchone() or (
        "",
    )
    assert role == "assistant"
    kv = dict(pq.read_metadata(path).metadata)
    assert kv[b"dgrpo.schema_version"] == str(SCHEMA_VERSION).encode()
    assert kv[b"dgrpo.producer"].startswith(b"durable-grpo")


def test_local_files_round_trip(tmp_path: Path) -> None:
    groups = sample_groups()
    ref = ts.write_groups(groups, tmp_path / "x" / "t.parquet", advantages=[[0.1, 0.2], [0.3], []])
    assert ref.ref.uri == (tmp_path / "x" / "t.parquet").as_uri()
    assert same(ts.read_groups(tmp_path / "x" / "t.parquet"), groups)
    assert ts.read_advantages(tmp_path / "x" / "t.parquet") == [[0.1, 0.2], [0.3], []]
    assert same(ts.load_groups(ref.ref.uri), groups) and same(
        ts.load_groups(str(tmp_path / "x" / "t.parquet")), groups
    )
    with pytest.raises(ValueError, match="pass the ObjectStore"):
        ts.load_groups("s3://dgrpo/x.parquet")
    with pytest.raises(ValueError, match="advantages have shape"):
        ts.write_groups(groups, tmp_path / "y.parquet", advantages=[[0.1], [0.3], []])


def write_table(path: Path, table: pa.Table, meta: dict[bytes, bytes] | None) -> None:
    pq.write_table(table.replace_schema_metadata(meta), path)


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("not-parquet", "not a readable Parquet file"),
        ("truncated", "not a readable Parquet file"),
        ("foreign", "not written by durable-grpo"),
        ("newer", "schema version 99.*upgrade durable-grpo"),
        ("bad-json", "rows do not rebuild"),
        ("missing-file", "not a readable Parquet file"),
    ],
)
def test_corrupt_files_are_refused(tmp_path: Path, case: str, match: str) -> None:
    path = tmp_path / f"{case}.parquet"
    good = ts.groups_to_table(sample_groups())
    meta: dict[bytes, bytes] = dict(good.schema.metadata or {})
    if case == "not-parquet":
        path.write_text("kind,reward\ntrajectory,1.0\n")
    elif case == "truncated":
        ts.write_groups(sample_groups(), path)
        path.write_bytes(path.read_bytes()[:-100])
    elif case == "foreign":
        pq.write_table(pa.table({"reward": [1.0]}), path)
    elif case == "newer":
        write_table(path, good, {**meta, b"dgrpo.schema_version": b"99"})
    elif case == "bad-json":
        col = good.schema.get_field_index("trajectory_json")
        bad: Any = good.set_column(
            col, "trajectory_json", pa.array(['{"reward": "high"}'] * len(good), pa.string())
        )
        write_table(path, bad, meta)
    with pytest.raises(CorruptTrajectoriesError, match=match) as err:
        ts.read_groups(path)
    assert str(path) in str(err.value)


def test_corrupt_object_in_s3_names_its_uri(object_store: ObjectStore) -> None:
    object_store.put_bytes("bad/trajectories.parquet", b"PAR1 not really")
    with pytest.raises(
        CorruptTrajectoriesError, match=rf"s3://{object_store.bucket}/bad/trajectories.parquet"
    ):
        ts.download_groups(object_store, "bad/trajectories.parquet")


def test_non_finite_rewards_survive() -> None:
    groups = [TrajectoryGroup([Trajectory(reward=math.nan, metrics={"x": math.inf})])]
    back = ts.table_to_groups(ts.groups_to_table(groups), "memory")
    assert math.isnan(back[0].trajectories[0].reward) and back[0].trajectories[0].metrics["x"] == math.inf


def test_a_file_overwritten_after_it_was_recorded_is_refused(object_store: ObjectStore) -> None:
    groups = sample_groups()
    ref = ts.upload_groups(object_store, groups, "run-late", 1).ref
    assert [len(g.trajectories) for g in ts.read_ref_groups(object_store, ref)] == [
        len(g.trajectories) for g in groups
    ]
    late = ts.upload_groups(object_store, groups[:1], "run-late", 1).ref  # a late attempt, same key
    assert late.uri == ref.uri and late.sha256 != ref.sha256
    with pytest.raises(CorruptTrajectoriesError, match="overwritten after it was written"):
        ts.read_ref(object_store, ref)


def test_a_ref_outside_the_store_is_refused_before_anything_is_read(
    object_store: ObjectStore, tmp_path: Path
) -> None:
    """A worker reads only its own store: a ``file://`` ref (even to a real trajectories file, even one that
    would pass the sha256 check) or another bucket's object is refused, non-retryably, naming the store."""
    local = ts.write_groups(sample_groups(), tmp_path / "t.parquet").ref
    other = ts.upload_groups(object_store, sample_groups(), "run-x", 1).ref
    foreign = [
        local,
        local.model_copy(update={"uri": "file:///proc/self/environ"}),
        other.model_copy(update={"uri": other.uri.replace(object_store.bucket, "someone-elses", 1)}),
        other.model_copy(update={"uri": "http://169.254.169.254/latest/meta-data"}),
    ]
    for ref in foreign:
        with pytest.raises(
            ForeignObjectError, match=rf"not in this worker's object store \(s3://{object_store.bucket}/\)"
        ) as err:
            ts.read_ref_groups(object_store, ref)
        assert not err.value.retryable
        assert ref.sha256[:12] not in str(err.value)  # nothing about the file was read or reported
