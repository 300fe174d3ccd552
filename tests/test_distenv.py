"""DistEnv.detect: arguments, then torch.distributed, then torchrun's and SLURM's variables, else one process."""

from __future__ import annotations

import re

import pytest

from imgpipe.distenv import DistEnv
from imgpipe.errors import DistributedError

TORCHRUN = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
SLURM = {"SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_LOCALID": "2", "SLURM_NTASKS_PER_NODE": "3(x2)"}


def test_nothing_set_is_one_process() -> None:
    env = DistEnv.detect(environ={})
    assert (env.rank, env.world_size, env.local_rank, env.source, env.is_main) == (0, 1, 0, "single", True)


def test_torchrun_variables() -> None:
    env = DistEnv.detect(environ=TORCHRUN)
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size, env.source) == (3, 8, 1, 2, "torchrun")


def test_slurm_variables_including_the_compressed_tasks_per_node() -> None:
    env = DistEnv.detect(environ=SLURM)
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size, env.source) == (5, 6, 2, 3, "slurm")


def test_torchrun_wins_over_slurm_and_arguments_win_over_both() -> None:
    assert DistEnv.detect(environ={**SLURM, **TORCHRUN}).source == "torchrun"
    env = DistEnv.detect(rank=1, world_size=4, environ={**SLURM, **TORCHRUN})
    assert (env.rank, env.world_size, env.source) == (1, 4, "arguments")


def test_a_partial_launcher_environment_is_not_a_key_error() -> None:
    # RANK alone (a script started by hand with one variable exported) is not torchrun's set
    assert DistEnv.detect(environ={"RANK": "1"}).source == "single"
    assert DistEnv.detect(environ={"SLURM_PROCID": "0"}).source == "single"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"environ": {"RANK": "one", "WORLD_SIZE": "2"}}, "RANK='one' is not an integer"),
        ({"environ": {"RANK": "2", "WORLD_SIZE": "2"}}, "rank 2 is outside world size 2 (from torchrun)"),
        ({"rank": 0, "world_size": 0}, "world size must be >= 1"),
        ({"rank": 1}, "give both rank and world_size, or neither"),
    ],
)
def test_bad_values_are_one_clear_error(kwargs: dict, message: str) -> None:
    with pytest.raises(DistributedError, match=re.escape(message)) as caught:
        DistEnv.detect(**kwargs)
    assert "\n" not in str(caught.value)
