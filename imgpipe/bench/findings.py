"""What a bench verdict is made of, as data: the bound, the thresholds its rules use, the evidence (named
numbers), the actions and the observations. ``wording`` turns them into sentences; ``verdict`` decides them."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import ClassVar, NamedTuple, Union

from imgpipe.bench.stats import StoreIO
from imgpipe.storage.objectstore import FETCH_THREADS


class Bound(str, Enum):
    """What limits the judged run; the value is bench.json's ``bound``."""

    IO = "io"
    REMOTE = "remote"
    DECODE = "decode"
    INPUT = "input"  # input bound, read and decode untimed (DALI): which of the two is unknown
    COMPUTE = "compute"
    STRAGGLER = "straggler"

    def __str__(self) -> str:
        return self.value


class Cause(str, Enum):
    """Why the input is slow (bench.json's ``cause``)."""

    IO = "I/O"
    REMOTE_IO = "remote I/O"
    DECODE = "decode"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Thresholds:
    """Every threshold of the rules (docs/bench-json.md, "How the verdict is reached")."""

    data_bound_wait: float = 0.20  # the job's data-wait fraction from which it is input bound
    straggler_wait_gap: float = 0.15  # a straggler waits this much more of its step time than every other rank
    slow_phase_ratio: float = 3.0  # ... and its read or decode takes this many times the others' median
    iowait_high_pct: float = 20.0  # system iowait from which I/O is the evidence
    read_share_io: float = 0.5  # reading's share of the loader's worker time from which it is I/O (or remote) bound
    warm_cache: float = 0.9  # DATA's fraction in the page cache from which the disk was barely measured
    min_phase_ms: float = 0.05  # phase times below this are noise: a floor for the ratios
    min_consume_ms: float = 1.0  # a rank's own time per batch below this: too small to size workers from
    latency_bound_mb_s: float = 20.0  # a store request bringing its bytes slower than this waits on round trips
    max_batches_ahead: int = FETCH_THREADS - 1  # a process fetches at most this many batches ahead of the one it reads
    max_headroom_shown: float = 10.0  # beyond 1000 % the exact headroom says nothing more


THRESHOLDS = Thresholds()


class LoaderMs(NamedTuple):
    """Mean ms per batch over the ranks: the workers' ``read`` and ``decode``, and ``consume``, the rank's own
    work on a batch (collate + h2d + compute): the time a worker has to produce the next one."""

    read: float
    decode: float
    consume: float

    @property
    def work(self) -> float:
        """A worker's ms per batch."""
        return self.read + self.decode

    @property
    def read_share(self) -> float | None:
        """Reading's share of a worker's time per batch; None when it spends none."""
        return self.read / self.work if self.work > 0 else None


@dataclass(frozen=True)
class Evidence:
    """What every verdict rests on: ``data_wait``, the job's data-wait fraction (per step, the longest wait of
    any rank, over the step time), and the loader's phase times (None without them, as with DALI)."""

    data_wait: float
    loader_ms: LoaderMs | None


@dataclass(frozen=True)
class StragglerEvidence(Evidence):
    """Rank ``rank`` waits ``wait`` of its time against at most ``others_wait`` on the others, and its ``phase``
    ("read" or "decode") takes ``phase_ms`` per batch against the others' median ``others_ms``; ``iowait_pct``
    (on ``disk``) when it is high and the cause is I/O. bench.json calls ``phase`` and ``phase_ms`` ``stage`` and ``stage_ms``."""

    rank: int
    wait: float
    others_wait: float
    phase: str
    phase_ms: float
    others_ms: float
    iowait_pct: float | None
    disk: str


@dataclass(frozen=True)
class IoEvidence(Evidence):
    """DATA on ``disk``: ``iowait_pct`` when it is the evidence (high), else ``read_share``."""

    disk: str
    iowait_pct: float | None
    read_share: float | None


@dataclass(frozen=True)
class RemoteEvidence(Evidence):
    """Fetching records from ``data`` takes ``read_share`` of the loader's time; what the store did (``store``),
    and the MB/s one request brings (``request_mb_s``)."""

    data: str
    read_share: float
    store: StoreIO | None
    request_mb_s: float | None


@dataclass(frozen=True)
class ComputeEvidence(Evidence):
    """``headroom``: workers x the rank's own time / the loader's time - 1 (None without phase times)."""

    headroom: float | None


# ----------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class PackToSsd:
    """Pack to (or copy ``data`` to) an SSD and bench again."""

    kind: ClassVar[str] = "pack_to_ssd"
    data: str


@dataclass(frozen=True)
class MoreReadsInFlight:
    """More workers, so more reads are in flight, or faster storage."""

    kind: ClassVar[str] = "more_reads_in_flight"


@dataclass(frozen=True)
class CheckRankDisk:
    """Check the disk that serves ``rank`` and put its data on a local SSD."""

    kind: ClassVar[str] = "check_rank_disk"
    rank: int


@dataclass(frozen=True)
class CheckRankNetwork:
    """Check ``rank``'s network path to the store, or keep ``data`` on its node."""

    kind: ClassVar[str] = "check_rank_network"
    rank: int
    data: str


@dataclass(frozen=True)
class GiveRankCpu:
    """More CPU for ``rank`` (other processes on its cores?) or more workers."""

    kind: ClassVar[str] = "give_rank_cpu"
    rank: int


@dataclass(frozen=True)
class KeepDataLocal:
    """A node-local copy of the URL ``data``: a cache dir, or ``imgpipe stage``."""

    kind: ClassVar[str] = "keep_data_local"
    data: str


@dataclass(frozen=True)
class RaiseWorkers:
    """More workers: ``to`` (None when unknown), more than the ``cores_per_rank`` here when that is given."""

    kind: ClassVar[str] = "raise_workers"
    to: int | None
    cores_per_rank: int | None = None


@dataclass(frozen=True)
class AddCpus:
    """Not more workers: ``tried_workers`` gave ``tried_images_per_s`` against ``images_per_s`` with ``workers``
    on ``cpus`` cores."""

    kind: ClassVar[str] = "add_cpus"
    tried_workers: int
    tried_images_per_s: float
    workers: int
    images_per_s: float
    cpus: int


@dataclass(frozen=True)
class UseDali:
    kind: ClassVar[str] = "use_dali"


@dataclass(frozen=True)
class PackResized:
    kind: ClassVar[str] = "pack_resized"
    size: int = 256


@dataclass(frozen=True)
class BuildRegionDecoder:
    """Reinstall imgpipe where libjpeg-turbo's headers are, so the torch loader decodes only each crop."""

    kind: ClassVar[str] = "build_region_decoder"


@dataclass(frozen=True)
class RaisePrefetch:
    """``prefetch_factor`` to ``to``, so each worker fetches ``to - 1`` batches ahead (round trips bound the reads)."""

    kind: ClassVar[str] = "raise_prefetch_factor"
    to: int


Action = Union[
    PackToSsd,
    MoreReadsInFlight,
    CheckRankDisk,
    CheckRankNetwork,
    GiveRankCpu,
    KeepDataLocal,
    RaiseWorkers,
    AddCpus,
    UseDali,
    PackResized,
    BuildRegionDecoder,
    RaisePrefetch,
]


# ----------------------------------------------------------------------------- observations (the notes)


@dataclass(frozen=True)
class ArrivedLast:
    """``rank`` waited ``wait`` against ``others`` on the others, with no slower read or decode: not a straggler."""

    rank: int
    wait: float
    others: float


@dataclass(frozen=True)
class LoaderOnly:
    """No compute was given: every rank waits for data by construction."""


@dataclass(frozen=True)
class WarmCache:
    """``resident`` of DATA was in the page cache before the run."""

    resident: float


@dataclass(frozen=True)
class DaliReadsUntimed:
    """DALI reads and decodes inside its pipeline, untimed: reading (a disk, the store) and decoding cannot be told apart."""


@dataclass(frozen=True)
class BestRun:
    backend: str
    workers: int
    images_per_s: float


Observation = Union[ArrivedLast, LoaderOnly, WarmCache, DaliReadsUntimed, BestRun]
