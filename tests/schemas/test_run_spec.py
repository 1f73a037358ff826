"""Malformed run specs fail with messages that name the field, from TOML and JSON files alike."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from schemas.activities import SftConfig
from schemas.config import RunSpec, load_run_spec, parse_run_spec
from schemas.errors import RunSpecError

VALID: dict[str, Any] = {
    "run_id": "demo-1",
    "steps": 3,
    "groups_per_step": 2,
    "group_size": 4,
    "model": {"name": "agent-001", "base_model": "smollm2-135m-instruct", "lora": {"rank": 8}},
    "task": {"rollout": "examples.tictactoe:rollout", "scenarios": [{"seed": 1}, {"seed": 2}]},
    "train": {"learning_rate": 1e-4},
}


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"


def to_toml(data: dict[str, Any], table: str = "") -> str:
    """Enough of a TOML writer for run specs: scalars and lists inline, nested dicts as [tables]."""
    lines = [f"[{table}]"] if table else []
    lines += [f"{k} = {toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for k, v in data.items():
        if isinstance(v, dict):
            lines += ["", to_toml(v, f"{table}.{k}" if table else k)]
    return "\n".join(lines)


def mutate(path: str, value: Any) -> dict[str, Any]:
    """VALID with ``path`` (dotted) set to ``value``, or deleted when value is DELETE."""
    data = copy.deepcopy(VALID)
    *parents, leaf = path.split(".")
    node = data
    for key in parents:
        node = node.setdefault(key, {})
    if value is DELETE:
        del node[leaf]
    else:
        node[leaf] = value
    return data


DELETE = object()
MALFORMED = [
    # (what to change, new value, text the error must contain)
    ("run_id", DELETE, "run_id: missing; this field is required"),
    ("run_id", "has spaces!", "run_id: use 1-128 letters"),
    ("steps", 0, "steps: Input should be greater than or equal to 1"),
    ("group_size", 1, "group_size: Input should be greater than or equal to 2"),
    ("groups_per_step", "two", "groups_per_step: Input should be a valid integer"),
    ("stepz", 3, "stepz: unknown field"),
    ("model.name", DELETE, "model.name: missing"),
    ("model.lora.rank", 0, "model.lora.rank: Input should be greater than or equal to 1"),
    ("model.lora.dropout", 1.5, "model.lora.dropout: Input should be less than 1"),
    ("task.rollout", "not a path", "task.rollout: use an import path"),
    ("task.scenarios", [], "task: Value error, scenarios is an empty list"),
    ("task.scenarios", "scenarios.csv", "task: Value error, scenarios must be"),
    ("train.learning_rate", -1e-4, "train.learning_rate: Input should be greater than 0"),
    ("train.importance_sampling", "ppo", "train.importance_sampling: Input should be 'ppo_clip' or 'cispo'"),
    ("train.lr", 1e-4, "train.lr: unknown field"),
    ("judge.kind", "gpt4", "judge.kind: Input should be 'rollout', 'ruler' or 'both'"),
    ("storage.bucket", "Bad_Bucket", "storage.bucket: String should match pattern"),
    ("mode", "async", "mode: Input should be 'sync', 'pipelined' or 'shared'"),
    # hostile numbers and sizes: refused here, naming the field, not later on a worker
    *((field, value, f"{field}: Input should be a finite number")
      for field in ("model.lora.alpha", "train.kl_coef", "train.weight_decay", "train.advantage_eps",
                    "train.max_grad_norm", "task.rollout_timeout_s")
      for value in (float("inf"), float("nan"))),
    ("train.weight_decay", 1e6, "train.weight_decay: Input should be less than or equal to 10"),
    ("seed", 2**64, "seed: Input should be less than or equal to 4294967295"),
    ("train.seed", 2**70, "train.seed: Input should be less than or equal to 4294967295"),
    ("task_queues.trainer", "", "task_queues.trainer: String should have at least 1 character"),
    ("judge.rubric", "x" * (3 << 20), "judge.rubric: String should have at most 65536 characters"),
    ("heartbeat_timeout_s", 8, "heartbeat_timeout_s: Input should be greater than or equal to 10"),
]  # fmt: skip


def numbers(
    schema: dict[str, Any], defs: dict[str, Any], path: str = ""
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every number and integer in a JSON schema, by field path (through $refs, unions and lists)."""
    if "$ref" in schema:
        yield from numbers(defs[schema["$ref"].rsplit("/", 1)[1]], defs, path)
    for option in schema.get("anyOf", []):
        yield from numbers(option, defs, path)
    if schema.get("type") in ("number", "integer"):
        yield path, schema
    if "items" in schema:
        yield from numbers(schema["items"], defs, f"{path}[]")
    for name, sub in schema.get("properties", {}).items():
        yield from numbers(sub, defs, f"{path}.{name}" if path else name)
    if isinstance(schema.get("additionalProperties"), dict):
        yield from numbers(schema["additionalProperties"], defs, f"{path}{{}}")


@pytest.mark.parametrize("model", [RunSpec, SftConfig], ids=lambda m: m.__name__)
def test_every_number_is_bounded_on_both_sides_and_finite(model: type[BaseModel]) -> None:
    """What a run (or an SFT call) sets reaches an optimizer, a seeded generator, a timedelta: each number has
    a floor and a ceiling, and a float is finite (the model refuses inf and nan)."""
    schema = model.model_json_schema()
    found = list(numbers(schema, schema.get("$defs", {})))
    assert len(found) > 5
    unbounded = [
        path for path, s in found
        if not ({"minimum", "exclusiveMinimum"} & set(s) and {"maximum", "exclusiveMaximum"} & set(s))
    ]  # fmt: skip
    assert not unbounded, f"numbers without a floor or a ceiling: {unbounded}"
    assert model.model_config.get("allow_inf_nan") is False


@pytest.mark.parametrize("rates", [[-1e-4], [float("nan")], [1e-4, float("inf")], [2.0]])
def test_sft_learning_rates_are_within_zero_and_one(rates: list[float]) -> None:
    """A negative learning rate climbs the loss; a NaN one made every adapter weight NaN on the trainer."""
    with pytest.raises(ValidationError, match="learning_rates"):
        SftConfig(learning_rates=rates)
    assert SftConfig(learning_rates=[2e-4, 0.0]).learning_rates == [2e-4, 0.0]  # a schedule ends at 0


def test_valid_spec_loads_from_toml_and_json(tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text(to_toml(VALID))
    (tmp_path / "run.json").write_text(json.dumps(VALID))
    from_toml, from_json = load_run_spec(tmp_path / "run.toml"), load_run_spec(tmp_path / "run.json")
    assert from_toml == from_json == parse_run_spec(VALID)
    assert from_toml.model.lora.rank == 8 and from_toml.task_queues.control == "dgrpo-control"


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    MALFORMED,
    ids=[f"{c[0]}=<deleted>" if c[1] is DELETE else f"{c[0]}={c[1]!r}" for c in MALFORMED],
)
@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_malformed_spec_names_the_field(
    tmp_path: Path, field: str, value: Any, expected: str, suffix: str
) -> None:
    data = mutate(field, value)
    path = tmp_path / f"run{suffix}"
    path.write_text(to_toml(data) if suffix == ".toml" else json.dumps(data))
    with pytest.raises(RunSpecError) as err:
        load_run_spec(path)
    message = str(err.value)
    assert message.startswith(f"{path}: 1 problem(s)"), message
    assert expected in message, message


def test_pipelined_on_a_shared_device_is_refused() -> None:
    with pytest.raises(RunSpecError, match=r"mode 'pipelined' needs dedicated.*shared_device is true"):
        parse_run_spec({**VALID, "mode": "pipelined", "shared_device": True})


def test_every_problem_is_listed_once() -> None:
    with pytest.raises(RunSpecError) as err:
        parse_run_spec({**VALID, "steps": 0, "group_size": 0, "extra": 1})
    lines = str(err.value).splitlines()
    assert lines[0] == "run spec: 3 problem(s) in the run spec:"
    assert [line.split(":")[0].strip(" -") for line in lines[1:]] == ["steps", "group_size", "extra"]


def test_file_level_problems(tmp_path: Path) -> None:
    cases = {
        "missing.toml": None,
        "bad.toml": 'run_id = "x"\nsteps = ',
        "bad.json": '{"run_id": "x",',
        "run.yaml": "run_id: x",
    }
    expected = {
        "missing.toml": "no such run spec file",
        "bad.toml": "not valid TOML",
        "bad.json": "not valid JSON",
        "run.yaml": "ends in .toml or .json",
    }
    for name, text in cases.items():
        if text is not None:
            (tmp_path / name).write_text(text)
        with pytest.raises(RunSpecError, match=expected[name]) as err:
            load_run_spec(tmp_path / name)
        assert name in str(err.value)
    with pytest.raises(RunSpecError, match="a run spec is a table/object of fields, got list"):
        parse_run_spec([VALID])


def test_overrides_are_validated_too(tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text(to_toml(VALID))
    assert load_run_spec(tmp_path / "run.toml", {"train.learning_rate": 3e-4}).train.learning_rate == 3e-4
    with pytest.raises(RunSpecError, match=r"train\.epochs: Input should be less than or equal to 16"):
        load_run_spec(tmp_path / "run.toml", {"train.epochs": 99})


def test_dgrpo_schema_exports_the_run_spec_schema(tmp_path: Path) -> None:
    dgrpo = str(Path(sys.executable).parent / "dgrpo")
    out = tmp_path / "schema.json"
    subprocess.run([dgrpo, "schema", "--out", str(out)], check=True, timeout=60)
    schema = json.loads(out.read_text())
    assert schema == RunSpec.model_json_schema()
    assert {"run_id", "model", "task", "steps", "group_size"} <= set(schema["required"])
    printed = subprocess.run([dgrpo, "schema"], check=True, capture_output=True, text=True, timeout=60).stdout
    assert json.loads(printed) == schema


@pytest.mark.parametrize(
    ("fields", "named"),
    [({"shared_device": True}, "shared_device"), ({"storage": {"bucket": "other-bucket"}}, "storage.bucket")],
)
def test_deprecated_settings_are_accepted_and_warned_about(fields: dict[str, Any], named: str) -> None:
    with pytest.warns(FutureWarning, match=named):
        spec = parse_run_spec({**VALID, **fields})
    assert [line for line in spec.deprecations() if named in line]


def test_a_spec_without_deprecated_settings_warns_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert parse_run_spec(VALID).deprecations() == []
