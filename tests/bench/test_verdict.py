"""The verdict rules on hand-made measurements: each documented threshold decides something."""

from __future__ import annotations

import re

import pytest
from bench_helpers import DATA, HDD, SSD, rank_stats, recorded, result, run

from imgpipe.bench import verdict as rules
from imgpipe.bench.runner import RunResult, data_disk
from imgpipe.bench.system import summarize
from imgpipe.bench.verdict import decide


def test_recorded_47_percent_iowait_on_a_spinning_disk_is_io_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    samples = [recorded(DATA / "hdd_iowait" / "before", 0.0, monkeypatch), recorded(DATA / "hdd_iowait" / "after", 1.25, monkeypatch)]
    ranks = [rank_stats(0, wait=0.030, read=0.004, decode=0.006), rank_stats(1, wait=0.028, read=0.004, decode=0.006)]
    measured = run(ranks, iowait=0.0)
    measured.system = summarize(samples, "sdb1", 0.0, 1.25)
    v = decide(result([measured], disk=HDD))
    assert v.bound == "io"
    assert v.message.startswith("I/O bound: 47 % iowait on rotational /dev/sdb1")
    assert "imgpipe pack" in v.message and "SSD" in v.message


def test_slow_reads_without_iowait_are_io_bound_and_fast_disks_get_no_ssd_advice() -> None:
    ranks = [rank_stats(r, wait=0.03, read=0.04, decode=0.01) for r in range(2)]
    v = decide(result([run(ranks, iowait=2.0)], disk=SSD))
    assert v.bound == "io" and "reading takes 80 % of the loader's time" in v.message
    assert "SSD" not in v.message and "--workers" in v.message


def test_decode_bound_names_workers_dali_and_resize() -> None:
    ranks = [rank_stats(r, wait=0.05, read=0.001, decode=0.10, compute=0.02) for r in range(2)]
    v = decide(result([run(ranks, workers=1)], cpus=16))
    assert v.bound == "decode"
    # loader 101 ms per batch against 20 ms of compute: 6 workers keep up
    assert "raise workers to 6" in v.message
    assert "--backend dali" in v.message and "--resize 256" in v.message


def test_a_loader_only_run_does_not_size_workers_from_a_zero_compute_step() -> None:
    # no model and no --compute-ms: the rank's own time per batch is ~0, so no count keeps up
    ranks = [rank_stats(r, wait=0.10, read=0.002, decode=0.09, compute=0.00002) for r in range(2)]
    v = decide(result([run(ranks, workers=1)], cpus=2))
    assert v.bound == "decode"
    assert "raise workers," in v.message and "raise workers to" not in v.message


def test_decode_bound_beyond_the_cores_says_so_and_dali_runs_are_not_told_to_use_dali() -> None:
    ranks = [rank_stats(0, wait=0.05, read=0.001, decode=0.30, compute=0.02)]
    v = decide(result([run(ranks, workers=2)], cpus=4))
    assert "more than the 4 core(s) per rank" in v.message
    dali = [rank_stats(0, wait=0.05, timed=False)]
    v = decide(result([run(dali, backend="dali")], cpus=4, backends=("dali",)))
    assert v.bound == "decode" and "--backend dali" not in v.message and "--resize 256" in v.message


def test_decode_bound_after_more_workers_measured_slower_says_not_more_workers_but_more_cpus() -> None:
    # the demo's case: 2 workers on 2 cores for 2 ranks decoded slower than 1; "raise workers to 2" would contradict the table
    one = run([rank_stats(r, wait=0.02, read=0.002, decode=0.05, compute=0.04) for r in range(2)], workers=1)
    two = run([rank_stats(r, wait=0.03, read=0.002, decode=0.09, compute=0.04) for r in range(2)], workers=2)
    assert one.images_per_s > two.images_per_s
    v = decide(result([one, two], cpus=2))
    assert v.bound == "decode" and v.workers == 1
    assert "raise workers" not in v.message
    assert f"not more workers (2 workers gave {two.images_per_s:.0f} images/s against {one.images_per_s:.0f} with 1" in v.message
    assert "add CPUs" in v.message and "--backend dali" in v.message
    # with only the one worker count measured, the advice to raise it stands
    assert "raise workers to" in decide(result([one], cpus=2)).message


def test_a_decode_bound_torch_run_without_the_region_decoder_is_told_to_build_it_first() -> None:
    ranks = [rank_stats(0, wait=0.05, read=0.001, decode=0.30, compute=0.02)]
    without = decide(result([run(ranks, workers=2)], cpus=4, region_decoder=False))
    assert without.bound == "decode" and without.message.index("libjpeg-turbo's headers") < without.message.index("raise workers")
    assert "libjpeg-turbo" not in decide(result([run(ranks, workers=2)], cpus=4)).message
    dali = [rank_stats(0, wait=0.05, timed=False)]
    assert "libjpeg-turbo" not in decide(result([run(dali, backend="dali")], cpus=4, backends=("dali",), region_decoder=False)).message


def test_compute_bound_reports_headroom() -> None:
    ranks = [rank_stats(r, wait=0.001, read=0.001, decode=0.009, compute=0.02) for r in range(2)]
    v = decide(result([run(ranks, workers=2)]))
    assert v.bound == "compute"
    # 2 workers x 20 ms compute / 10 ms of loader work = 4x: 300 % headroom
    assert v.message.startswith("compute bound: the loader has 300 % headroom")


def test_data_wait_threshold_is_the_boundary() -> None:
    below = rules.DATA_BOUND_WAIT * 0.9
    wait_s = below * 0.02 / (1 - below)  # wait / (wait + compute) = just below the threshold
    v = decide(result([run([rank_stats(0, wait=wait_s, decode=0.1)])]))
    assert v.bound == "compute"
    above = rules.DATA_BOUND_WAIT * 1.1
    wait_s = above * 0.02 / (1 - above)
    assert decide(result([run([rank_stats(0, wait=wait_s, decode=0.1)])])).bound == "decode"


def test_straggler_with_slow_reads_has_an_io_cause() -> None:
    ranks = [
        rank_stats(0, wait=0.001, read=0.001, sync=0.02),
        rank_stats(1, wait=0.0152, read=0.160),
        rank_stats(2, wait=0.0008, read=0.0012, sync=0.02),
    ]
    v = decide(result([run(ranks)]))
    assert v.bound == "straggler" and v.straggler == 1 and v.cause == "I/O"
    assert v.message.startswith("rank 1 is a straggler: it waits for data 43 % of the time, against 2 % on the others; I/O cause")
    assert "160.0 ms per batch against 1.1 ms" in v.message


def test_straggler_with_slow_decode() -> None:
    decode = [rank_stats(0, wait=0.001, sync=0.02), rank_stats(1, wait=0.02, decode=0.08)]
    v = decide(result([run(decode)]))
    assert v.straggler == 1 and v.cause == "decode"
    assert "decoding its images takes 80.0 ms per batch against 4.0 ms" in v.message


def test_a_rank_that_waits_longer_with_stages_no_slower_is_not_a_straggler() -> None:
    # equal stages: the wait only says who arrived last at the all-reduce; high iowait is the whole machine's
    even = [rank_stats(0, wait=0.001, sync=0.02), rank_stats(1, wait=0.02)]
    for iowait in (1.0, 35.0):
        v = decide(result([run(even, iowait=iowait)]))
        assert v.bound != "straggler" and v.straggler is None
        assert any(n.startswith("rank 1 waited for data") and "not a straggler" in n for n in v.notes)
    assert decide(result([run(even, iowait=35.0)])).bound == "io"
    dali = [rank_stats(0, wait=0.001, sync=0.02, timed=False), rank_stats(1, wait=0.02, timed=False)]
    assert decide(result([run(dali, backend="dali")], backends=("dali",))).bound != "straggler"  # stages unknown: no evidence


def test_a_saturated_shared_disk_is_io_bound_whichever_rank_waited_in_the_all_reduce() -> None:
    """Throttled disk, cold cache, 2 ranks: both read ~800 ms per batch; one waits in next(loader), the other in the all-reduce."""
    read, compute = 0.80, 0.01
    for waiter in (0, 1):
        ranks = [
            rank_stats(r, wait=0.79 if r == waiter else 0.002, read=read + 0.01 * r, compute=compute, sync=0.0 if r == waiter else 0.788)
            for r in range(2)
        ]
        v = decide(result([run(ranks, iowait=60.0)], disk=HDD))
        assert (v.bound, v.straggler) == ("io", None), v.message
        assert v.message.startswith("I/O bound: 60 % iowait on rotational /dev/sdb1; ranks wait for data 99 % of the time")
    # 8 ranks, one of them waiting at a time: the job is still input bound (a mean over ranks said 13 %)
    ranks = [rank_stats(r, wait=0.79 if r == 3 else 0.002, read=read, compute=compute, sync=0.0 if r == 3 else 0.788) for r in range(8)]
    v = decide(result([run(ranks, iowait=2.0)]))
    assert (v.bound, v.straggler) == ("io", None) and "reading takes 100 % of the loader's time" in v.message


def test_a_true_straggler_on_a_saturated_disk_is_still_named() -> None:
    ranks = [rank_stats(0, wait=0.002, read=0.20, sync=0.60), rank_stats(1, wait=0.60, read=0.80)]
    v = decide(result([run(ranks, iowait=60.0)], disk=HDD))
    assert (v.bound, v.straggler, v.cause) == ("straggler", 1, "I/O")
    assert "800.0 ms per batch against 200.0 ms" in v.message and "60 % iowait on rotational /dev/sdb1" in v.message


def test_the_two_day_story_one_rank_starved_by_a_spinning_disk() -> None:
    """One GPU busy, the other waiting, 47 % iowait on an HDD: the straggler, its cause and the SSD fix."""
    ranks = [rank_stats(0, wait=0.002, read=0.002, sync=0.05), rank_stats(1, wait=0.05, read=0.4)]
    v = decide(result([run(ranks, iowait=47.4)], disk=HDD))
    assert (v.bound, v.straggler, v.cause) == ("straggler", 1, "I/O")
    assert "47 % iowait on rotational /dev/sdb1" in v.message
    assert "pack to an SSD with `imgpipe pack" in v.message


def test_small_wait_differences_are_not_stragglers() -> None:
    gap = rules.STRAGGLER_WAIT_GAP * 0.5
    ranks = [rank_stats(0, wait=0.001), rank_stats(1, wait=0.001 + gap * 0.02)]
    assert decide(result([run(ranks)])).bound != "straggler"


def test_when_every_rank_starves_it_is_input_bound_not_a_straggler() -> None:
    ranks = [rank_stats(0, wait=0.3, decode=0.4, compute=0.01), rank_stats(1, wait=0.04, decode=0.4, compute=0.01)]
    v = decide(result([run(ranks)]))  # 97 % against 80 %: both starve
    assert v.bound == "decode" and v.straggler is None


def test_notes_warm_cache_and_best_workers() -> None:
    fast = run([rank_stats(0, wait=0.001, compute=0.01)], workers=4, resident=1.0)
    slow = run([rank_stats(0, wait=0.001, compute=0.03)], workers=1, resident=1.0)
    v = decide(result([slow, fast]))
    assert v.workers == 4  # the fastest run is judged
    assert any("rerun with --cold" in n for n in v.notes)
    assert "best for torch: 4 workers" in " ".join(v.notes)
    v = decide(result([run([rank_stats(0, wait=0.001)], resident=1.0)], cold=True))
    assert not any("--cold" in n for n in v.notes)
    assert not any("loader-only" in n for n in v.notes)
    v = decide(result([run([rank_stats(0, wait=0.02, compute=0.0)])], compute_ms=0.0))
    assert any(n.startswith("loader-only run") for n in v.notes)


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
    assert v.bound == "remote" and v.cause == "remote I/O"
    assert v.message.startswith(
        f"remote I/O bound: fetching records from {URL} takes 86 % of the loader's time and ranks wait for data 71 % of the time"
    )
    # 2 ranks x 10 steps x 8 requests in 10 x 70 ms; 0.4 s of calls per 8 requests; 160 x 110 KB
    assert "the store answered 160 requests, 50 ms each on average (229 requests/s, 25.1 MB/s)" in v.message
    assert "`cache_dir=DIR`" in v.message and "`data.cache: DIR`" in v.message
    assert f"`imgpipe stage {URL} /local/dir`" in v.message and "`data.stage: DIR`" in v.message
    assert "raise --workers to 4" in v.message  # 70 ms of loader work per 20 ms step
    # 110 KB in 50 ms: round trips; 5 batches of 10 ms decoding cover one, the default prefetch_factor 2 fetches 1 ahead
    assert v.message.endswith(
        "; round trips, not bandwidth, bound the reads (50 ms a request, 2.2 MB/s each) and a worker decodes a batch in 10 ms: "
        "raise prefetch_factor to 6 (`--set data.prefetch_factor=6`, make_torch_loader's prefetch_factor) "
        "so each worker fetches 5 batches ahead"
    )


def test_a_larger_prefetch_factor_is_advised_only_where_round_trips_bound_the_reads_and_the_batches_ahead_do_not_cover_one() -> None:
    def advice(run: RunResult, **config: object) -> str | None:
        v = decide(result([run], disk=data_disk(URL), data=URL, **config))
        assert v.bound == "remote"
        found = re.search(r"raise prefetch_factor to (\d+)", v.message)
        return found and found[1]

    assert advice(remote_run(read=0.06, decode=0.01)) == "6"
    assert advice(remote_run(read=0.06, decode=0.01, record_bytes=4_000_000)) is None  # 4 MB in 50 ms: bandwidth, not round trips
    assert advice(remote_run(read=0.2, decode=0.06)) is None  # one batch ahead already decodes for longer than a round trip
    assert advice(remote_run(read=0.06, decode=0.01), train_overrides=("data.prefetch_factor=6",)) is None  # already there
    assert advice(remote_run(read=0.06, decode=0.01), train_overrides=("data.prefetch_factor=3",)) == "6"
    assert advice(remote_run(read=0.06, decode=0.001)) == str(rules.MAX_BATCHES_AHEAD + 1)  # 50 round trips' worth: capped


def test_a_url_is_remote_bound_only_when_reading_dominates_and_local_iowait_is_not_its_evidence() -> None:
    at = 0.01 * rules.READ_SHARE_IO / (1 - rules.READ_SHARE_IO)  # the read time that makes the share of 10 ms of decode the threshold
    below = decide(result([remote_run(read=0.99 * at, decode=0.01, iowait=80.0)], disk=data_disk(URL), data=URL))
    assert below.bound == "decode"  # 80 % iowait on this machine is not the bucket's
    above = decide(result([remote_run(read=1.01 * at, decode=0.01)], disk=data_disk(URL), data=URL))
    assert above.bound == "remote"


def test_the_same_measurements_from_a_local_folder_are_io_bound_not_remote() -> None:
    v = decide(result([remote_run(read=0.06, decode=0.01)]))
    assert v.bound == "io" and "cache_dir" not in v.message


def test_dali_from_a_url_says_its_reads_are_not_timed() -> None:
    v = decide(result([remote_run(read=0.0, decode=0.0, backend="dali", timed=False)], disk=data_disk(URL), data=URL, backends=("dali",)))
    assert any("`--backend torch` measures both" in note for note in v.notes)
