"""The embedded stack: the session fixture's servers, and `dgrpo up/env/down` through the real CLI."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from temporalio.client import Client, WorkflowExecutionStatus

from activities.object_store import ObjectStore
from schemas.errors import StoreError
from schemas.settings import S3Settings, TemporalSettings
from workers.stack import (
    DEFAULT_S3_PORT,
    DEFAULT_TEMPORAL_PORT,
    DEFAULT_UI_PORT,
    LOG_TAIL_CHARS,
    EmbeddedStack,
    PortTaken,
    StackState,
    start_failure,
)

DGRPO = str(Path(sys.executable).parent / "dgrpo")


def test_session_stack_state_and_reuse(stack: EmbeddedStack) -> None:
    assert stat.S_IMODE(stack.credentials_path.stat().st_mode) == 0o600
    state = StackState.model_validate_json(stack.state_path.read_text())
    assert state.temporal_port not in (DEFAULT_TEMPORAL_PORT, DEFAULT_UI_PORT, DEFAULT_S3_PORT)
    assert (stack.home / "temporal.db").exists() and (stack.home / "logs" / "seaweed.log").exists()
    env = stack.env()
    assert env["DGRPO_TEMPORAL_ADDRESS"] == env["TEMPORAL_ADDRESS"] == state.temporal_address
    assert S3Settings.from_env(env) == stack.s3_settings
    again = EmbeddedStack(stack.home, free_ports=True).start()  # a second start reuses, starts nothing
    assert (again.temporal.pid, again.seaweed.pid) == (state.temporal.pid, state.seaweed.pid)


async def test_temporal_client_fixture(temporal_client: Client, task_queue: str) -> None:
    assert task_queue.startswith("tq-test_temporal_client_fixture-")
    handle = await temporal_client.start_workflow(
        "NoWorkerHere", id=f"wf-{task_queue}", task_queue=task_queue
    )
    assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
    await handle.terminate()


def dgrpo(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([DGRPO, *args], env=env, capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"dgrpo {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def exports(stdout: str) -> dict[str, str]:
    """What `eval "$(dgrpo env)"` sets, read back by a real shell."""
    names = [line.split("=", 1)[0].removeprefix("export ") for line in stdout.splitlines()]
    script = f'eval "$1"; for n in {" ".join(names)}; do printf "%s=%s\\n" "$n" "${{!n}}"; done'
    out = subprocess.run(
        ["bash", "-c", script, "-", stdout], capture_output=True, text=True, check=True
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


@contextlib.contextmanager
def defaults_taken() -> Iterator[None]:
    """Hold the standard ports (or find them held by a developer's stack): `up` must pick others."""
    held = []
    for port in (DEFAULT_TEMPORAL_PORT, DEFAULT_UI_PORT, DEFAULT_S3_PORT):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
            held.append(s)
        except OSError:
            s.close()  # already in use: just as good
    try:
        yield
    finally:
        for s in held:
            s.close()


async def start_and_describe(address: str, workflow_id: str, start: bool) -> WorkflowExecutionStatus | None:
    client = await Client.connect(address)
    if start:
        await client.start_workflow("Durable", id=workflow_id, task_queue="tq-cli-restart")
    return (await client.get_workflow_handle(workflow_id).describe()).status


def test_cli_up_env_down_and_state_survives_restart(tmp_path: Path) -> None:
    env = {**os.environ, "DGRPO_HOME": str(tmp_path / "home")}
    for name in ("DGRPO_TEMPORAL_ADDRESS", "TEMPORAL_ADDRESS", "DGRPO_S3_ENDPOINT"):
        env.pop(name, None)
    with defaults_taken():
        up = dgrpo(env, "up", "--headless")
        assert "started" in up.stdout and 'eval "$(dgrpo env)"' in up.stdout
        again = dgrpo(env, "up", "--headless")
        assert "already running" in again.stdout
        first = exports(dgrpo(env, "env").stdout)
        assert not first["DGRPO_TEMPORAL_ADDRESS"].endswith(f":{DEFAULT_TEMPORAL_PORT}")
        assert not first["DGRPO_S3_ENDPOINT"].endswith(f":{DEFAULT_S3_PORT}")
        assert f"Temporal address: {first['DGRPO_TEMPORAL_ADDRESS']}" in up.stdout
        assert first["TEMPORAL_ADDRESS"] == first["DGRPO_TEMPORAL_ADDRESS"]

        address = TemporalSettings.from_env(first).address
        assert (
            asyncio.run(start_and_describe(address, "wf-survives", True)) == WorkflowExecutionStatus.RUNNING
        )
        store = ObjectStore(S3Settings.from_env(first))
        store.put_bytes("kept/x", b"before down")

        down = dgrpo(env, "down")
        assert "stopped" in down.stdout
        started = time.monotonic()
        with pytest.raises(StoreError, match="cannot reach the S3 store"):
            store.get_bytes("kept/x")
        assert time.monotonic() - started < 10
        missing = dgrpo(env, "env", check=False)
        assert missing.returncode != 0 and missing.stdout == "" and "dgrpo up" in missing.stderr

        dgrpo(env, "up", "--headless")
        second = exports(dgrpo(env, "env").stdout)
        try:
            assert second["DGRPO_S3_SECRET_KEY"] == first["DGRPO_S3_SECRET_KEY"]
            address = TemporalSettings.from_env(second).address
            assert (
                asyncio.run(start_and_describe(address, "wf-survives", False))
                == WorkflowExecutionStatus.RUNNING
            )
            assert ObjectStore(S3Settings.from_env(second)).get_bytes("kept/x") == b"before down"
        finally:
            dgrpo(env, "down")
    assert json.loads((tmp_path / "home" / "s3-identities.json").read_text())["identities"]
    assert not (tmp_path / "home" / "stack.json").exists()


async def test_a_crashed_stack_restarts_on_the_ports_it_had(tmp_path: Path) -> None:
    home = tmp_path / "crash-home"
    embedded = EmbeddedStack(home, free_ports=True, ui=False, tied_to_parent=True)
    before = embedded.start()
    try:
        status = await start_and_describe(before.temporal_address, "wf-crash", True)
        assert status == WorkflowExecutionStatus.RUNNING
        ObjectStore(embedded.s3_settings).put_bytes("kept/y", b"before the crash")
        for info in (before.temporal, before.seaweed):  # a crash: no clean shutdown, stack.json stays
            psutil.Process(info.pid).kill()
            psutil.Process(info.pid).wait(10)
        restarted = EmbeddedStack(home, free_ports=True, ui=False, tied_to_parent=True)
        assert restarted.load_state() is None
        after = restarted.start()
        embedded = restarted
        assert (after.temporal_port, after.s3_port, after.weed_ports) == (
            before.temporal_port,
            before.s3_port,
            before.weed_ports,
        )
        status = await start_and_describe(after.temporal_address, "wf-crash", False)
        assert status == WorkflowExecutionStatus.RUNNING
        assert ObjectStore(restarted.s3_settings).get_bytes("kept/y") == b"before the crash"
    finally:
        embedded.stop()


@pytest.mark.parametrize("server", ["temporal", "s3"])
def test_a_port_taken_as_the_stack_starts_gets_a_fresh_start_on_other_ports(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Temporal picks some ports itself, so it can lose one to weed or another program between the check and
    the bind: the stack starts again on fresh ports. Here the first pick for Temporal (or weed's S3) is a port
    this test holds, so Temporal exits with "address already in use" (weed: "Port allocation failed")."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    held = holder.getsockname()[1]
    embedded = EmbeddedStack(tmp_path / "race-home", free_ports=True, ui=False, tied_to_parent=True)
    real_pick, picks = embedded._pick, []

    def pick(name: str, *args: object) -> int:
        picks.append(name)
        return held if picks.count(server) == 1 and name == server else real_pick(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(embedded, "_pick", pick)
    try:
        state = embedded.start()
        # at least twice: a third start when a port of the second was taken meanwhile, as on a busy machine
        assert held not in (state.temporal_port, state.s3_port) and picks.count(server) >= 2
        ObjectStore(embedded.s3_settings).put_bytes("race/x", b"up")
    finally:
        embedded.stop()
        holder.close()


def test_weed_running_on_after_one_of_its_parts_lost_its_port_gets_a_fresh_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """weed checks its ports before it binds them; a port taken between the check and the bind (by another
    stack starting on this machine) costs only that part (here its admin server), weed runs on and its S3
    may never serve. The first weed here starts behind a line saying so, as weed logs it: the stack starts
    again on fresh ports instead of waiting out its start timeout."""
    embedded = EmbeddedStack(tmp_path / "lost-home", free_ports=True, ui=False, tied_to_parent=True)
    real_args, starts = embedded._weed_args, []

    def weed_args(s3_port: int, weed_ports: dict[str, int]) -> list[str]:
        args = real_args(s3_port, weed_ports)
        starts.append(weed_ports["admin.port"])
        if len(starts) > 1:
            return args
        lost = f"admin server: listen tcp 127.0.0.1:{weed_ports['admin.port']}: bind: address already in use"
        return ["sh", "-c", f'echo "E1127 mini.go:1673 Admin server error: {lost}"; exec "$@"', "weed", *args]

    monkeypatch.setattr(embedded, "_weed_args", weed_args)
    try:
        state = embedded.start()
        assert len(starts) == 2 and state.weed_ports["admin.port"] == starts[1]
        ObjectStore(embedded.s3_settings).put_bytes("lost/x", b"up")
    finally:
        embedded.stop()


def test_a_taken_port_is_seen_anywhere_in_this_starts_log_and_only_there(tmp_path: Path) -> None:
    """The sign of a taken port may come first, with more than a tail's worth of log after it (the race the
    retry once missed reading only the last 2000 characters); an earlier start's lines in the same (appended)
    log are not this start's."""
    log = tmp_path / "temporal.log"
    earlier = "Error: can't set frontend port 1: listen tcp: bind: address already in use\n"
    now = (
        "Error: listen tcp 127.0.0.1:7243: bind: address already in use\n" + "shutting down a service\n" * 300
    )
    log.write_text(earlier + now)
    assert len(now) > LOG_TAIL_CHARS
    err = start_failure("temporal", str(log), since=len(earlier))
    assert isinstance(err, PortTaken) and "127.0.0.1:7243: bind: address already in use" in str(err)
    log.write_text(earlier + "panic: the database is locked\n")
    assert not isinstance(start_failure("temporal", str(log), since=len(earlier)), PortTaken)
