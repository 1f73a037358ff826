"""Processes that are busy at once split the host's cores; one that stops working or dies gives its share back."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from host import cpu_share
from host.cpu_share import CpuShare
from tests.cpu_neighbour import Neighbour


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[Neighbour]:
    h = Neighbour(tmp_path)
    yield h
    h.kill()


@pytest.fixture(autouse=True)
def look_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_share, "RECHECK_S", 0.0)


def test_a_busy_process_halves_the_others_threads_until_it_is_idle(tmp_path: Path, holder: Neighbour) -> None:
    share = CpuShare(tmp_path, cores=4)
    holder.say("idle")
    assert share.threads() == 4
    holder.say("busy")
    assert share.busy_others() == 1
    assert share.threads() == 2
    holder.say("idle")
    assert share.threads() == 4
    share.close()


def test_a_killed_process_gives_its_cores_back_and_its_file_is_removed(
    tmp_path: Path, holder: Neighbour
) -> None:
    share = CpuShare(tmp_path, cores=2)
    holder.say("busy")
    assert share.threads() == 1
    holder.kill()
    assert share.threads() == 2
    assert [p.name for p in tmp_path.glob("*.busy")] == [f"{os.getpid()}.busy"]


def test_apply_sets_the_torch_threads_of_the_thread_that_calls_it(tmp_path: Path, holder: Neighbour) -> None:
    share = CpuShare(tmp_path, cores=2)
    holder.say("busy")
    seen: list[int] = []

    def work() -> None:
        share.apply()
        seen.append(torch.get_num_threads())

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert seen == [1]


def test_a_directory_of_another_user_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_share.os, "getuid", lambda: 4242)
    with pytest.raises(PermissionError, match="another user"):
        CpuShare(tmp_path, cores=2)
    monkeypatch.setenv(cpu_share.ENV_CPU_SHARE_DIR, str(tmp_path))
    assert CpuShare.for_host(cores=2) is None  # the process keeps all its threads


def test_sharing_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_share.ENV_CPU_SHARE_DIR, "off")
    assert CpuShare.for_host(cores=2) is None
