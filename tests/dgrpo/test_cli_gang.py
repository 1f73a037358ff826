"""The trainer's gang flags of ``dgrpo worker`` (docs/scaling-out.md), read as the CLI reads them: the operator's
ranks, devices, sharding and gang; a device list that does not fit the ranks refused with the flag's name; and
role ``all``'s trainer child started with its parent's."""

from __future__ import annotations

import pytest

from dgrpo.cli import build_parser
from dgrpo.cli.worker import worker_options
from schemas.errors import EngineSetupError
from schemas.settings import GangSettings
from workers.worker import gang_flags


def test_the_trainer_alone_by_default_and_a_gang_from_its_flags() -> None:
    assert worker_options(build_parser().parse_args(["worker", "trainer"])).gang == GangSettings()
    assert not GangSettings().enabled  # one rank, no gang: the trainer in the worker, as before
    flags = ["--ranks", "2", "--devices", "cuda:0,cuda:1", "--shard", "replicate", "--gang", "g1",
             "--gang-address", "10.0.0.7", "--collective-timeout-s", "30"]  # fmt: skip
    gang = worker_options(build_parser().parse_args(["worker", "all", *flags])).gang
    assert gang == GangSettings(ranks=2, devices=("cuda:0", "cuda:1"), shard="replicate", gang="g1",
                                address="10.0.0.7", collective_timeout_s=30)  # fmt: skip
    assert gang.enabled


def test_devices_that_do_not_fit_the_ranks_are_refused_naming_the_gang() -> None:
    with pytest.raises(
        EngineSetupError, match=r"the trainer's gang \(--ranks, --devices.*\): 2 devices for 3 ranks"
    ):
        worker_options(
            build_parser().parse_args(["worker", "trainer", "--ranks", "3", "--devices", "cuda:0,cuda:1"])
        )
    with pytest.raises(SystemExit):  # argparse: 0 is less than 1
        build_parser().parse_args(["worker", "trainer", "--ranks", "0"])


def test_role_all_gives_its_trainer_child_its_gang() -> None:
    flags = ["--ranks", "2", "--shard", "replicate", "--gang", "g1", "--collective-timeout-s", "12"]
    opts = worker_options(build_parser().parse_args(["worker", "all", *flags]))
    child = build_parser().parse_args(["worker", "trainer", *gang_flags(opts.gang)])  # the child's own flags
    assert worker_options(child).gang == opts.gang
    assert gang_flags(GangSettings()) == []  # a trainer alone: its child as before
