"""Which part of a pack a run writes: --num-nodes/--node-rank, srun's node, or a SLURM array task.

A pack in N parts gives part i the shards whose global index is i mod N. An array task's part
comes from its task id: ``(id - first id) / step``, times the nodes of one task, plus
SLURM_NODEID. The first run of a pack in several parts records its ``Parts`` in the journal, so
that a failed task resubmitted alone (``sbatch --array=3``, whose own SLURM_ARRAY_TASK_COUNT is
1) still writes part 3 of 8, and so that no two runs split one pack two ways and write a shard twice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable, Mapping

from imgpipe._sys.jsonfile import as_dataclass
from imgpipe.errors import PackError


@dataclass(frozen=True)
class ArrayTask:
    """A SLURM array task as its environment describes it, and the nodes within the task (srun -N)."""

    task_id: int
    first_id: int
    step: int
    count: int
    nodes: int = 1
    node_id: int = 0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> "ArrayTask | None":
        """The array task of this process, or None outside a SLURM array job."""
        if not environ.get("SLURM_ARRAY_TASK_ID"):
            return None
        task_id = _int(environ, "SLURM_ARRAY_TASK_ID", 0)
        first_id = _int(environ, "SLURM_ARRAY_TASK_MIN", task_id)
        step = _int(environ, "SLURM_ARRAY_TASK_STEP", 1)
        if step < 1:
            raise PackError(f"SLURM_ARRAY_TASK_STEP={step} is not an array's step (1 or more); give --num-nodes and --node-rank")
        last_id = _int(environ, "SLURM_ARRAY_TASK_MAX", task_id)
        count = _int(environ, "SLURM_ARRAY_TASK_COUNT", (last_id - first_id) // step + 1)
        nodes = _int(environ, "SLURM_NNODES", 1)
        task = cls(task_id, first_id, step, count, nodes, _int(environ, "SLURM_NODEID", 0))
        if count < 1 or nodes < 1 or not 0 <= task.node_id < nodes:
            raise PackError(f"SLURM's array variables do not fit together ({task.describe()}); give --num-nodes and --node-rank")
        return task

    def describe(self) -> str:
        within = f", SLURM_NODEID={self.node_id} of SLURM_NNODES={self.nodes}" if self.nodes > 1 else ""
        return f"SLURM_ARRAY_TASK_ID={self.task_id} (MIN {self.first_id}, STEP {self.step}, COUNT {self.count}){within}"


@dataclass(frozen=True)
class Parts:
    """How a pack is split: ``count`` parts; with ``first_id``, array task ids map to parts (``step``, ``nodes`` per task)."""

    count: int
    first_id: int | None = None
    step: int = 1
    nodes: int = 1

    @classmethod
    def of_array(cls, task: ArrayTask) -> "Parts":
        return cls(task.count * task.nodes, task.first_id, task.step, task.nodes)

    def part_of(self, task: ArrayTask) -> int:
        """The part an array task writes; one line when the task is not one of this pack's."""
        if self.first_id is None:
            raise PackError(f"this pack was split by node ranks, not array tasks; give --num-nodes {self.count} and --node-rank")
        index, rest = divmod(task.task_id - self.first_id, self.step)
        part = index * self.nodes + task.node_id
        if rest or task.nodes != self.nodes or not 0 <= part < self.count:
            raise PackError(
                f"{task.describe()} is not one of this pack's {self.count} part(s) (array tasks {self.every_task_id()}"
                f"{f', {self.nodes} nodes each' if self.nodes > 1 else ''}); submit those task ids, or give --num-nodes and --node-rank"
            )
        return part

    def task_ids(self, parts: Iterable[int]) -> str:
        """The array task ids that write ``parts``, as sbatch's --array takes them (``3,5`` or ``0-7``)."""
        ids = sorted({self._task_id(part) for part in parts})
        if len(ids) > 2 and ids == list(range(ids[0], ids[-1] + self.step, self.step)):
            return self._span(ids[0], ids[-1])
        return ",".join(map(str, ids))

    def every_task_id(self) -> str:
        """``task_ids`` of every part, from the first and the last (an array may count a trillion tasks)."""
        first, last = self._task_id(0), self._task_id(self.count - 1)
        return self._span(first, last) if last - first > self.step else ",".join(map(str, sorted({first, last})))

    def _task_id(self, part: int) -> int:
        assert self.first_id is not None
        return self.first_id + (part // self.nodes) * self.step

    def _span(self, first: int, last: int) -> str:
        return f"{first}-{last}" + (f":{self.step}" if self.step > 1 else "")

    def to_json(self) -> bytes:
        fields = {"count": self.count, "first_id": self.first_id, "step": self.step, "nodes": self.nodes}
        return (json.dumps(fields, sort_keys=True) + "\n").encode()

    @classmethod
    def from_value(cls, value: object) -> "Parts":
        """The split ``to_json`` wrote, from its decoded JSON; a ValueError for anything else."""
        parts = as_dataclass(cls, value)
        if parts.count < 1 or parts.step < 1 or parts.nodes < 1:
            raise ValueError(f"count {parts.count}, step {parts.step} and nodes {parts.nodes} must be 1 or more")
        return parts


def choose_part(num_nodes: int, node_rank: int, task: ArrayTask | None, recorded: Parts | None) -> tuple[int, int, Parts]:
    """(parts, this run's part, the split to record): from the array task if there is one, else the node options.

    An array task maps through the split recorded by the pack's first run when that was an array
    too, so a rerun of some tasks writes the parts their ids had in the first run.
    """
    if task is None:
        return num_nodes, node_rank, Parts(num_nodes)
    split = recorded if recorded is not None and recorded.first_id is not None else Parts.of_array(task)
    return split.count, split.part_of(task), split


def missing_parts_advice(split: Parts, missing: list[int]) -> str:
    """Which parts are missing, and the commands that write them."""
    return f"part(s) {', '.join(map(str, missing))} of {split.count} are missing; {rerun_parts_advice(split, missing)}"


def rerun_parts_advice(split: Parts, parts: list[int]) -> str:
    """The commands that write ``parts``, then finalize."""
    ranks = " then ".join(f"--node-rank {part}" for part in parts[:3]) + (" ..." if len(parts) > 3 else "")
    again = f"the same imgpipe pack command with --num-nodes {split.count} and {ranks}"
    if split.first_id is not None:
        tasks = split.task_ids(parts)
        again = f"resubmit array task(s) {tasks} (sbatch --array={tasks} YOUR_PACK_SCRIPT) or run {again}"
    else:
        again = f"run {again}"
    return f"{again}, then --finalize"


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name, "")
    if raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise PackError(f"{name}={raw!r} is not an integer; give --num-nodes and --node-rank") from None
