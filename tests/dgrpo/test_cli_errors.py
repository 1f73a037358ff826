"""Wrong calls of the ``dgrpo`` command: each ends with one line saying what to fix, and exit status 2, never a
traceback (and never exit 0). The calls fail before anything starts, so ``main`` runs them in this process;
one goes through the console script too."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dgrpo.cli import main

REPO = Path(__file__).resolve().parents[2]
SPEC = str(REPO / "examples" / "run.json")
LATIN1 = "latin1.toml"
"""A spec file written in Latin-1 (made in ``tmp_path``)."""

WRONG_CALLS = [
    # (argv, words the one line must contain)
    (["serve", "--model", "no-such-model"], ["serve", "no-such-model"]),
    (["serve", "--model", "smollm2-135m-instruct", "--port", "99999"], ["--port 99999", "65535"]),
    (["serve", "--model", "smollm2-135m-instruct", "--max-batch", "0"], ["--max-batch 0", "greater than"]),
    (["worker", "inference", "--max-loras", "0"], ["--max-loras 0", "greater than or equal to 1"]),
    (["worker", "inference", "--gpu-memory-utilization", "2"], ["--gpu-memory-utilization 2.0"]),
    (["worker", "inference", "--unanswered-probes", "0"], ["--unanswered-probes 0"]),
    (["worker", "control", "--grace-s", "-5"], ["--grace-s -5.0", "greater than or equal to 0"]),
    (["worker", "trainer", "--temporal-wait-s", "-1"], ["--temporal-wait-s -1.0"]),
    (["worker", "inference", "--serve-port", "70000"], ["--serve-port", "70000 is not a port"]),
    (["up", "--temporal-port", "99999"], ["--temporal-port", "99999 is not a port (0 to 65535)"]),
    (["demo", "--steps", "-3"], ["--steps", "-3 is less than 1"]),
    (["train", SPEC, "--set", "steps.x=1", "--dry-run"], ["--set steps.x", "steps is 3, not a table"]),
    (["train", LATIN1, "--dry-run"], ["not UTF-8", "save it as UTF-8"]),
    (
        ["schema", "--out", "/no-such-dir/schema.json"],
        ["No such file or directory", "/no-such-dir/schema.json"],
    ),
    (["train", SPEC, "--set", "train.weight_decay=Infinity", "--dry-run"], ["train.weight_decay", "finite"]),
    (["train", SPEC, "--set", "seed=18446744073709551616", "--dry-run"], ["seed", "less than or equal"]),
]


@pytest.mark.parametrize(("argv", "says"), WRONG_CALLS, ids=[" ".join(a[:3]) for a, _ in WRONG_CALLS])
def test_a_wrong_call_ends_in_one_line_and_exit_2(
    argv: list[str], says: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    (tmp_path / LATIN1).write_bytes('run_id = "café"\n'.encode("latin-1"))
    try:
        code = main(argv)
    except SystemExit as usage:  # argparse's own refusal of a flag's value
        code = usage.code  # type: ignore[assignment]
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert "Traceback" not in err
    last = err.splitlines()[-1]
    for words in says:
        assert words in last, (words, err)


def test_the_console_script_says_the_same_in_one_line(tmp_path: Path) -> None:
    """What a user's shell sees: the installed ``dgrpo`` script, exit 2, the reason on stderr."""
    dgrpo = str(Path(sys.executable).parent / "dgrpo")
    spec = tmp_path / "run.json"
    spec.write_text(json.dumps({**json.loads(Path(SPEC).read_text()), "train": {"kl_coef": 1e999}}))
    done = subprocess.run(
        [dgrpo, "train", str(spec), "--dry-run"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and not done.stdout, done
    assert "train.kl_coef: Input should be a finite number" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("task", ["arithmetic", "tool_agent"])
def test_each_demo_task_names_a_run_spec_that_loads(task: str) -> None:
    """``dgrpo demo`` (the README's first command) trains from these files: moving the CLI once left them
    pointing into ``dgrpo/examples``, which does not exist."""
    from dgrpo.cli.demo import DEMO_TASKS
    from schemas.config import load_run_spec

    spec = load_run_spec(DEMO_TASKS[task], {})
    assert DEMO_TASKS[task].parent.name == "examples" and spec.steps >= 1
