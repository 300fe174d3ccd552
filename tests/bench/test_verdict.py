"""The verdict rules on hand-made measurements: each documented threshold decides something. The tests assert
on the verdict's data (bound, evidence, actions, observations); one test pins the words they are said in."""

from __future__ import annotations

import pytest
from bench_helpers import DATA, HDD, SSD, rank_stats, recorded, result, run

from imgpipe.bench.findings import (
    THRESHOLDS,
    AddCpus,
    ArrivedLast,
    BestRun,
    Bound,
    BuildRegionDecoder,
    Cause,
    CheckRankDisk,
    CheckRankNetwork,
    ComputeEvidence,
    DaliReadsUntimed,
    Evidence,
    GiveRankCpu,
    IoEvidence,
    KeepDataLocal,
    LoaderMs,
    LoaderOnly,
    MoreReadsInFlight,
    PackResized,
    PackToSsd,
    RaisePrefetch,
    RaiseWorkers,
    RemoteEvidence,
    StragglerEvidence,
    UseDali,
    WarmCache,
)
from imgpipe.bench.runner import RunResult, data_disk
from imgpipe.bench.stats import StoreIO
from imgpipe.bench.system import summarize
from imgpipe.bench.verdict import Verdict, decide

LOCAL = "/data/imagenet"  # bench_helpers.result's DATA


def approx(value: float) -> object:
    return pytest.approx(value, abs=0.005)


def test_recorded_47_percent_iowait_on_a_spinning_disk_is_io_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    samples = [recorded(DATA / "hdd_iowait" / "before", 0.0, monkeypatch), recorded(DATA / "hdd_iowait" / "after", 1.25, monkeypatch)]
    ranks = [rank_stats(0, wait=0.030, read=0.004, decode=0.006), rank_stats(1, wait=0.028, read=0.004, decode=0.006)]
    measured = run(ranks, iowait=0.0)
    measured.system = summarize(samples, "sdb1", 0.0, 1.25)
    v = decide(result([measured], disk=HDD))
    assert (v.bound, v.cause) == (Bound.IO, Cause.IO)
    assert isinstance(v.evidence, IoEvidence) and v.evidence.disk == "rotational /dev/sdb1"
    assert round(v.evidence.iowait_pct) == 47 and v.evidence.read_share is None  # iowait is the evidence
    assert v.actions == (PackToSsd(LOCAL),)


def test_slow_reads_without_iowait_are_io_bound_and_fast_disks_get_no_ssd_advice() -> None:
    ranks = [rank_stats(r, wait=0.03, read=0.04, decode=0.01) for r in range(2)]
    v = decide(result([run(ranks, iowait=2.0)], disk=SSD))
    assert v.bound == Bound.IO and v.evidence.iowait_pct is None and v.evidence.read_share == approx(0.8)
    assert v.actions == (MoreReadsInFlight(),)


def test_decode_bound_names_workers_dali_and_resize() -> None:
    ranks = [rank_stats(r, wait=0.05, read=0.001, decode=0.10, compute=0.02) for r in range(2)]
    v = decide(result([run(ranks, workers=1)], cpus=16))
    assert (v.bound, v.cause) == (Bound.DECODE, Cause.DECODE)
    assert v.evidence.loader_ms == LoaderMs(approx(1.0), approx(100.0), approx(20.0))
    # loader 101 ms per batch against 20 ms of compute: 6 workers keep up
    assert v.actions == (RaiseWorkers(6), UseDali(), PackResized(256))


def test_a_loader_only_run_does_not_size_workers_from_a_zero_compute_step() -> None:
    # no model and no --compute-ms: the rank's own time per batch is ~0, so no count keeps up
    ranks = [rank_stats(r, wait=0.10, read=0.002, decode=0.09, compute=0.00002) for r in range(2)]
    v = decide(result([run(ranks, workers=1)], cpus=2))
    assert v.bound == Bound.DECODE and v.actions[0] == RaiseWorkers(None)


def test_decode_bound_beyond_the_cores_says_so() -> None:
    ranks = [rank_stats(0, wait=0.05, read=0.001, decode=0.30, compute=0.02)]
    v = decide(result([run(ranks, workers=2)], cpus=4))
    assert v.actions[0] == RaiseWorkers(16, cores_per_rank=4)  # 301 ms of loader work per 20 ms step


def test_a_starved_dali_run_is_input_bound_with_only_what_helps_reads_and_decodes_alike() -> None:
    """DALI times neither phase: not 'decode bound' (no evidence says so), no cause, no advice to use DALI; from a URL the
    data on the node comes first, and the untimed reads are said in the message, not again in a note."""
    dali = [rank_stats(0, wait=0.05, timed=False)]
    v = decide(result([run(dali, backend="dali")], cpus=4, backends=("dali",)))
    assert (v.bound, v.cause, v.evidence.loader_ms) == (Bound.INPUT, None, None)
    assert v.actions == (RaiseWorkers(None), PackResized(256))
    untimed = remote_run(read=0.0, decode=0.0, backend="dali", timed=False)
    remote = decide(result([untimed], disk=data_disk(URL), data=URL, backends=("dali",)))
    assert (remote.bound, remote.actions) == (Bound.INPUT, (KeepDataLocal(URL), RaiseWorkers(None), PackResized(256)))
    assert DaliReadsUntimed() not in remote.observations
    iowait = decide(result([run(dali, backend="dali", iowait=47.0)], disk=HDD, backends=("dali",)))
    assert (iowait.bound, iowait.actions) == (Bound.IO, (PackToSsd(LOCAL),))  # iowait is evidence without phase times


def test_decode_bound_after_more_workers_measured_slower_says_not_more_workers_but_more_cpus() -> None:
    # the demo's case: 2 workers on 2 cores for 2 ranks decoded slower than 1; "raise workers to 2" would contradict the table
    one = run([rank_stats(r, wait=0.02, read=0.002, decode=0.05, compute=0.04) for r in range(2)], workers=1)
    two = run([rank_stats(r, wait=0.03, read=0.002, decode=0.09, compute=0.04) for r in range(2)], workers=2)
    assert one.images_per_s > two.images_per_s
    v = decide(result([one, two], cpus=2))
    assert v.bound == Bound.DECODE and v.workers == 1
    assert v.actions == (AddCpus(2, two.images_per_s, 1, one.images_per_s, 2), UseDali(), PackResized(256))
    # with only the one worker count measured, the advice to raise it stands
    assert decide(result([one], cpus=2)).actions[0] == RaiseWorkers(2, cores_per_rank=1)


def test_a_decode_bound_torch_run_without_the_region_decoder_is_told_to_build_it_first() -> None:
    ranks = [rank_stats(0, wait=0.05, read=0.001, decode=0.30, compute=0.02)]
    without = decide(result([run(ranks, workers=2)], cpus=4, region_decoder=False))
    assert without.bound == Bound.DECODE and without.actions[:2] == (BuildRegionDecoder(), RaiseWorkers(16, cores_per_rank=4))
    assert BuildRegionDecoder() not in decide(result([run(ranks, workers=2)], cpus=4)).actions
    dali = [rank_stats(0, wait=0.05, timed=False)]
    assert BuildRegionDecoder() not in decide(result([run(dali, backend="dali")], cpus=4, backends=("dali",), region_decoder=False)).actions


def test_compute_bound_reports_headroom() -> None:
    ranks = [rank_stats(r, wait=0.001, read=0.001, decode=0.009, compute=0.02) for r in range(2)]
    v = decide(result([run(ranks, workers=2)]))
    assert (v.bound, v.cause, v.actions) == (Bound.COMPUTE, None, ())
    # 2 workers x 20 ms compute / 10 ms of loader work = 4x: 300 % headroom
    assert isinstance(v.evidence, ComputeEvidence) and v.evidence.headroom == approx(3.0)


def test_data_wait_threshold_is_the_boundary() -> None:
    below = THRESHOLDS.data_bound_wait * 0.9
    wait_s = below * 0.02 / (1 - below)  # wait / (wait + compute) = just below the threshold
    v = decide(result([run([rank_stats(0, wait=wait_s, decode=0.1)])]))
    assert v.bound == Bound.COMPUTE and v.evidence.data_wait == pytest.approx(below)
    above = THRESHOLDS.data_bound_wait * 1.1
    wait_s = above * 0.02 / (1 - above)
    assert decide(result([run([rank_stats(0, wait=wait_s, decode=0.1)])])).bound == Bound.DECODE


def test_straggler_with_slow_reads_has_an_io_cause() -> None:
    ranks = [
        rank_stats(0, wait=0.001, read=0.001, sync=0.02),
        rank_stats(1, wait=0.0152, read=0.160),
        rank_stats(2, wait=0.0008, read=0.0012, sync=0.02),
    ]
    v = decide(result([run(ranks)]))
    assert (v.bound, v.straggler, v.cause) == (Bound.STRAGGLER, 1, Cause.IO)
    e = v.evidence
    assert isinstance(e, StragglerEvidence) and (e.rank, e.phase, e.iowait_pct) == (1, "read", None)
    assert (e.wait, e.others_wait) == (approx(0.43), approx(0.024))
    assert (e.phase_ms, e.others_ms) == (approx(160.0), approx(1.1))  # the others' median
    assert v.actions == (CheckRankDisk(1),)  # on an SSD


def test_straggler_with_slow_decode() -> None:
    decode = [rank_stats(0, wait=0.001, sync=0.02), rank_stats(1, wait=0.02, decode=0.08)]
    v = decide(result([run(decode)]))
    assert (v.straggler, v.cause, v.evidence.phase) == (1, Cause.DECODE, "decode")
    assert (v.evidence.phase_ms, v.evidence.others_ms) == (approx(80.0), approx(4.0))
    assert v.actions == (GiveRankCpu(1),)


def test_a_rank_that_waits_longer_with_phases_no_slower_is_not_a_straggler() -> None:
    # equal phases: the wait only says who arrived last at the all-reduce; high iowait is the whole machine's
    even = [rank_stats(0, wait=0.001, sync=0.02), rank_stats(1, wait=0.02)]
    for iowait in (1.0, 35.0):
        v = decide(result([run(even, iowait=iowait)]))
        assert v.bound != Bound.STRAGGLER and v.straggler is None
        arrived = [o for o in v.observations if isinstance(o, ArrivedLast)]
        assert len(arrived) == 1 and arrived[0].rank == 1 and (arrived[0].wait, arrived[0].others) == (approx(0.5), approx(0.024))
    assert decide(result([run(even, iowait=35.0)])).bound == Bound.IO
    dali = [rank_stats(0, wait=0.001, sync=0.02, timed=False), rank_stats(1, wait=0.02, timed=False)]
    assert decide(result([run(dali, backend="dali")], backends=("dali",))).bound != Bound.STRAGGLER  # phases unknown: no evidence


def test_a_saturated_shared_disk_is_io_bound_whichever_rank_waited_in_the_all_reduce() -> None:
    """Throttled disk, cold cache, 2 ranks: both read ~800 ms per batch; one waits in next(loader), the other in the all-reduce."""
    read, compute = 0.80, 0.01
    for waiter in (0, 1):
        ranks = [
            rank_stats(r, wait=0.79 if r == waiter else 0.002, read=read + 0.01 * r, compute=compute, sync=0.0 if r == waiter else 0.788)
            for r in range(2)
        ]
        v = decide(result([run(ranks, iowait=60.0)], disk=HDD))
        assert (v.bound, v.straggler) == (Bound.IO, None), v.message
        assert (v.evidence.iowait_pct, v.evidence.data_wait, v.evidence.disk) == (60.0, approx(0.99), "rotational /dev/sdb1")
    # 8 ranks, one of them waiting at a time: the job is still input bound (a mean over ranks said 13 %)
    ranks = [rank_stats(r, wait=0.79 if r == 3 else 0.002, read=read, compute=compute, sync=0.0 if r == 3 else 0.788) for r in range(8)]
    v = decide(result([run(ranks, iowait=2.0)]))
    assert (v.bound, v.straggler) == (Bound.IO, None) and v.evidence.read_share == approx(0.995)


def test_a_true_straggler_on_a_saturated_disk_is_still_named() -> None:
    ranks = [rank_stats(0, wait=0.002, read=0.20, sync=0.60), rank_stats(1, wait=0.60, read=0.80)]
    v = decide(result([run(ranks, iowait=60.0)], disk=HDD))
    assert (v.bound, v.straggler, v.cause) == (Bound.STRAGGLER, 1, Cause.IO)
    e = v.evidence
    assert (e.phase_ms, e.others_ms, e.iowait_pct, e.disk) == (approx(800.0), approx(200.0), 60.0, "rotational /dev/sdb1")


def test_the_two_day_story_one_rank_starved_by_a_spinning_disk() -> None:
    """One GPU busy, the other waiting, 47 % iowait on an HDD: the straggler, its cause and the SSD fix."""
    ranks = [rank_stats(0, wait=0.002, read=0.002, sync=0.05), rank_stats(1, wait=0.05, read=0.4)]
    v = decide(result([run(ranks, iowait=47.4)], disk=HDD))
    assert (v.bound, v.straggler, v.cause) == (Bound.STRAGGLER, 1, Cause.IO)
    assert (v.evidence.iowait_pct, v.evidence.disk) == (47.4, "rotational /dev/sdb1")
    assert v.actions == (PackToSsd(LOCAL),)


def test_small_wait_differences_are_not_stragglers() -> None:
    gap = THRESHOLDS.straggler_wait_gap * 0.5
    ranks = [rank_stats(0, wait=0.001), rank_stats(1, wait=0.001 + gap * 0.02)]
    assert decide(result([run(ranks)])).bound != Bound.STRAGGLER


def test_when_every_rank_starves_it_is_input_bound_not_a_straggler() -> None:
    ranks = [rank_stats(0, wait=0.3, decode=0.4, compute=0.01), rank_stats(1, wait=0.04, decode=0.4, compute=0.01)]
    v = decide(result([run(ranks)]))  # 97 % against 80 %: both starve
    assert v.bound == Bound.DECODE and v.straggler is None


def test_notes_warm_cache_and_best_workers() -> None:
    fast = run([rank_stats(0, wait=0.001, compute=0.01)], workers=4, resident=1.0)
    slow = run([rank_stats(0, wait=0.001, compute=0.03)], workers=1, resident=1.0)
    v = decide(result([slow, fast]))
    assert v.workers == 4  # the fastest run is judged
    assert v.observations == [WarmCache(1.0), BestRun("torch", 4, fast.images_per_s)]
    v = decide(result([run([rank_stats(0, wait=0.001)], resident=1.0)], cold=True))
    assert v.observations == []
    v = decide(result([run([rank_stats(0, wait=0.02, compute=0.0)])], compute_ms=0.0))
    assert v.observations == [LoaderOnly()]


URL = "s3://bucket/imagenet"


def remote_run(
    *, read: float, decode: float, iowait: float = 1.0, backend: str = "torch", timed: bool = True, record_bytes: int = 110_000
) -> RunResult:
    """2 ranks reading a URL: 8 records a batch, each batch 8 requests of 50 ms and ``record_bytes`` each."""
    ranks = [
        rank_stats(r, wait=0.05, read=read, decode=decode, compute=0.02, requests=8, request_s=0.4, fetched=8 * record_bytes, timed=timed)
        for r in range(2)
    ]
    return run(ranks, workers=2, iowait=iowait, backend=backend)


def test_a_url_whose_reads_dominate_is_remote_io_bound_with_the_store_figures_and_what_to_change() -> None:
    v = decide(result([remote_run(read=0.06, decode=0.01)], disk=data_disk(URL), data=URL))
    assert (v.bound, v.cause) == (Bound.REMOTE, Cause.REMOTE_IO)
    e = v.evidence
    assert isinstance(e, RemoteEvidence) and (e.data, e.read_share, e.data_wait) == (URL, approx(0.857), approx(0.714))
    # 2 ranks x 10 steps x 8 requests in 10 x 70 ms; 0.4 s of calls per 8 requests; 160 x 110 KB
    assert (e.store.requests, e.store.latency_ms, e.store.requests_per_s, e.store.mb_per_s) == (
        160,
        approx(50),
        approx(228.571),
        approx(25.143),
    )
    # 110 KB in 50 ms: round trips; 5 batches of 10 ms decoding cover one, the default prefetch_factor 2 fetches 1 ahead
    assert e.request_mb_s == approx(2.2)
    assert v.actions == (KeepDataLocal(URL), RaiseWorkers(4), RaisePrefetch(6))  # 70 ms of loader work per 20 ms step


def test_a_larger_prefetch_factor_is_advised_only_where_round_trips_bound_the_reads_and_the_batches_ahead_do_not_cover_one() -> None:
    def advice(run: RunResult, **config: object) -> int | None:
        v = decide(result([run], disk=data_disk(URL), data=URL, **config))
        assert v.bound == Bound.REMOTE
        return next((act.to for act in v.actions if isinstance(act, RaisePrefetch)), None)

    assert advice(remote_run(read=0.06, decode=0.01)) == 6
    assert advice(remote_run(read=0.06, decode=0.01, record_bytes=4_000_000)) is None  # 4 MB in 50 ms: bandwidth, not round trips
    assert advice(remote_run(read=0.2, decode=0.06)) is None  # one batch ahead already decodes for longer than a round trip
    assert advice(remote_run(read=0.06, decode=0.01), train_overrides=("data.prefetch_factor=6",)) is None  # already there
    assert advice(remote_run(read=0.06, decode=0.01), train_overrides=("data.prefetch_factor=3",)) == 6
    assert advice(remote_run(read=0.06, decode=0.001)) == THRESHOLDS.max_batches_ahead + 1  # 50 round trips' worth: capped


def test_a_url_is_remote_bound_only_when_reading_dominates_and_local_iowait_is_not_its_evidence() -> None:
    share = THRESHOLDS.read_share_io
    at = 0.01 * share / (1 - share)  # the read time that makes the share of 10 ms of decode the threshold
    below = decide(result([remote_run(read=0.99 * at, decode=0.01, iowait=80.0)], disk=data_disk(URL), data=URL))
    assert below.bound == Bound.DECODE  # 80 % iowait on this machine is not the bucket's
    above = decide(result([remote_run(read=1.01 * at, decode=0.01)], disk=data_disk(URL), data=URL))
    assert above.bound == Bound.REMOTE


def test_the_same_measurements_from_a_local_folder_are_io_bound_not_remote() -> None:
    v = decide(result([remote_run(read=0.06, decode=0.01)]))
    assert v.bound == Bound.IO and v.actions == (MoreReadsInFlight(),)


def test_dali_from_a_url_says_its_reads_are_not_timed() -> None:
    # the loader keeps up: compute bound, and a note says what the DALI loader's times cannot show
    ranks = [rank_stats(r, wait=0.0001, read=0.0, decode=0.0, timed=False) for r in range(2)]
    v = decide(result([run(ranks, workers=2, backend="dali")], disk=data_disk(URL), data=URL, backends=("dali",)))
    assert v.bound == Bound.COMPUTE and v.observations == [DaliReadsUntimed()]


def test_the_words_of_every_bound_action_and_observation() -> None:
    """The one test of the sentences: what the report, bench.json's message and notes and the plot say for each piece of data."""
    ms = LoaderMs(4.0, 6.0, 20.0)
    local = (
        "a cache dir (`cache_dir=DIR`, in the trainer `data.cache: DIR`) fills a copy on the node as it streams, "
        f"or `imgpipe stage {URL} /local/dir` copies it there once (`data.stage: DIR`)"
    )

    def said(bound: Bound, evidence: Evidence, *actions: object) -> str:
        return Verdict(bound, "torch", 2, evidence, actions).message  # type: ignore[arg-type]

    slow_reads = StragglerEvidence(0.5, ms, 1, 0.71, 0.03, "read", 400.0, 2.0, 47.4, "rotational /dev/sdb1")
    assert said(Bound.STRAGGLER, slow_reads, PackToSsd(LOCAL)) == (
        "rank 1 is a straggler: it waits for data 71 % of the time, against 3 % on the others; I/O cause: reading its records takes "
        "400.0 ms per batch against 2.0 ms on the others (47 % iowait on rotational /dev/sdb1); "
        "pack to an SSD with `imgpipe pack SRC /ssd/imagenet` (or copy /data/imagenet there) and bench again"
    )
    slow_decode = StragglerEvidence(0.5, ms, 1, 0.5, 0.02, "decode", 80.0, 4.0, None, "non-rotational /dev/nvme0n1p2")
    assert said(Bound.STRAGGLER, slow_decode, GiveRankCpu(1)) == (
        "rank 1 is a straggler: it waits for data 50 % of the time, against 2 % on the others; decode cause: decoding its images takes "
        "80.0 ms per batch against 4.0 ms on the others; give rank 1 more CPU (other processes on its cores?) or more workers"
    )
    no_iowait = StragglerEvidence(0.5, ms, 1, 0.71, 0.03, "read", 400.0, 2.0, None, "s3")
    assert said(Bound.STRAGGLER, no_iowait, CheckRankNetwork(1, URL)).endswith(
        f"on the others; check rank 1's network path to the store, or keep the data on its node ({local})"
    )
    assert said(Bound.STRAGGLER, no_iowait, CheckRankDisk(1)).endswith(
        "; check the disk that serves rank 1 (a slow or failing disk, a network mount) and put its data on a local SSD"
    )
    assert said(Bound.IO, IoEvidence(0.6, ms, "rotational /dev/sdb1", 47.4, None), PackToSsd(LOCAL)) == (
        "I/O bound: 47 % iowait on rotational /dev/sdb1; ranks wait for data 60 % of the time; "
        "pack to an SSD with `imgpipe pack SRC /ssd/imagenet` (or copy /data/imagenet there) and bench again"
    )
    assert said(Bound.IO, IoEvidence(0.6, ms, "non-rotational /dev/nvme0n1p2", None, 0.8), MoreReadsInFlight()) == (
        "I/O bound: reading takes 80 % of the loader's time on non-rotational /dev/nvme0n1p2; ranks wait for data 60 % of the time; "
        "raise --workers so more reads are in flight, or move DATA to faster storage"
    )
    store = StoreIO(requests=160, calls=160, request_s=8.0, fetched_bytes=17_600_000, seconds=0.7)
    remote = RemoteEvidence(0.714, LoaderMs(60.0, 10.0, 20.0), URL, 0.857, store, 2.2)
    assert said(Bound.REMOTE, remote, KeepDataLocal(URL), RaiseWorkers(4), RaisePrefetch(6)) == (
        f"remote I/O bound: fetching records from {URL} takes 86 % of the loader's time and ranks wait for data 71 % of the time; "
        f"the store answered 160 requests, 50 ms each on average (229 requests/s, 25.1 MB/s); keep the data on each node: {local}; "
        "or raise --workers to 4 (each worker keeps the requests of its next prefetch_factor - 1 batches in flight); "
        "round trips, not bandwidth, bound the reads (50 ms a request, 2.2 MB/s each) and a worker decodes a batch in 10 ms: "
        "raise prefetch_factor to 6 (`--set data.prefetch_factor=6`, make_torch_loader's prefetch_factor) "
        "so each worker fetches 5 batches ahead"
    )
    assert said(Bound.REMOTE, RemoteEvidence(0.714, ms, URL, 0.857, None, None), KeepDataLocal(URL), RaiseWorkers(None)).endswith(
        "71 % of the time; keep the data on each node: " + local + "; or raise --workers (each worker keeps the requests of its next "
        "prefetch_factor - 1 batches in flight)"
    )
    decode = said(Bound.DECODE, Evidence(0.71, ms), BuildRegionDecoder(), RaiseWorkers(16, 4), UseDali(), PackResized(256))
    assert decode == (
        "decode bound: ranks wait for data 71 % of the time while decoding dominates the loader; install imgpipe's manylinux wheel "
        "(libjpeg-turbo inside; `make wheel` builds it), or install a C compiler and libjpeg-turbo's headers (Debian/Ubuntu "
        "libjpeg62-turbo-dev or libjpeg-turbo8-dev, RHEL/Fedora libjpeg-turbo-devel, conda-forge libjpeg-turbo) and reinstall "
        "imgpipe from source, so the torch loader decodes only each crop, raise --workers to 16 "
        "(more than the 4 core(s) per rank here: add CPUs), "
        "use `--backend dali`, or pack with `--resize 256`"
    )
    assert said(Bound.DECODE, Evidence(0.33, ms), AddCpus(2, 229.4, 1, 266.7, 2), RaiseWorkers(None), RaiseWorkers(6), PackResized()) == (
        "decode bound: ranks wait for data 33 % of the time while decoding dominates the loader; not more workers (2 workers gave "
        "229 images/s against 267 with 1: the 2 core(s) are busy, add CPUs), raise --workers, raise --workers to 6, "
        "or pack with `--resize 256`"
    )
    assert said(Bound.INPUT, Evidence(0.71, None), KeepDataLocal(URL), RaiseWorkers(None), PackResized(256)) == (
        "input bound: ranks wait for data 71 % of the time; the DALI loader reads and decodes inside its pipeline, untimed, so whether "
        "reading or decoding holds it back is unknown (`--backend torch` measures both); keep the data on each node: " + local + "; "
        "raise --workers; pack with `--resize 256`"
    )
    assert (
        said(Bound.COMPUTE, ComputeEvidence(0.05, ms, 3.0))
        == "compute bound: the loader has 300 % headroom (ranks wait for data 5 % of the time)"
    )
    assert said(Bound.COMPUTE, ComputeEvidence(0.02, ms, 12.0)).startswith("compute bound: the loader has over 1000 % headroom")
    assert (
        said(Bound.COMPUTE, ComputeEvidence(0.0, None, None)) == "compute bound: the loader keeps up (ranks wait for data 0 % of the time)"
    )
    observations = [ArrivedLast(1, 0.5, 0.02), LoaderOnly(), WarmCache(1.0), DaliReadsUntimed(), BestRun("torch", 1, 266.7)]
    assert Verdict(Bound.COMPUTE, "torch", 2, ComputeEvidence(0.0, None, None), (), observations).notes == [
        "rank 1 waited for data 50 % of the time against 2 % on the others, but its own read and decode are no slower (or unknown): "
        "it arrived last at the all-reduce, not a straggler",
        "loader-only run: with no compute every rank waits for data by construction; give --model NAME or --compute-ms T to see "
        "whether the loader keeps up with your training step",
        "100 % of DATA was in the page cache, so the disk was barely read; rerun with --cold to measure the disk",
        "the DALI loader's reads are not timed, so waiting for the store and decoding cannot be told apart; "
        "`--backend torch` measures both",
        "best for torch: 1 worker, 267 images/s",
    ]
