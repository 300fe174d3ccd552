"""Step timing, per-rank summaries, the rank table and JSONL."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from imgpipe.train.metrics import (
    JsonlWriter,
    RankSummary,
    StepRecord,
    StepTimer,
    format_rank_table,
    gather_summaries,
    global_images_per_s,
    imbalance,
    percentile,
    summarize,
)


def slow_loader(n: int, delay: float):
    for i in range(n):
        time.sleep(delay)  # elapsed time is what is tested: the timer must count it as waiting for data
        yield i


def test_step_timer_separates_data_wait_from_compute() -> None:
    timer = StepTimer()
    for _ in timer.iterate(slow_loader(4, 0.03)):
        with timer.compute(images=8):
            time.sleep(0.01)  # elapsed time is what is tested: the timer must count it as compute
    assert len(timer.records) == 4
    assert all(r.data_s >= 0.025 and 0.008 <= r.compute_s < r.data_s + 0.5 for r in timer.records)
    summary = timer.summary(rank=3)
    assert summary.rank == 3 and summary.steps == 4 and summary.images == 32
    assert 0.5 < summary.data_wait_frac < 1.0
    assert summary.images_per_s == pytest.approx(32 / summary.wall_s)
    timer.reset()
    assert timer.records == [] and timer.summary(0).steps == 0


def test_summarize_percentiles() -> None:
    records = [StepRecord(0.0, float(s), 10) for s in range(1, 101)]
    summary = summarize(records, rank=0)
    assert summary.step_p50_s == pytest.approx(50.5) and summary.step_p95_s == pytest.approx(95.05)
    assert summary.images == 1000 and summary.data_wait_frac == 0.0
    assert percentile([], 50) == 0.0


def test_table_imbalance_and_global_rate() -> None:
    fast = RankSummary(0, 200.0, 0.05, 0.1, 0.12, 10, 2000, 10.0)
    slow = RankSummary(1, 100.0, 0.60, 0.2, 0.30, 10, 1000, 10.0)
    assert imbalance([fast, slow]) == 0.5 and imbalance([fast]) == 1.0
    assert global_images_per_s([fast, slow]) == 300.0
    lines = format_rank_table([fast, slow]).splitlines()
    assert lines[0].split() == ["rank", "images/s", "data-wait", "%", "step", "p50", "ms", "step", "p95", "ms", "steps", "images"]
    assert lines[1].split() == ["0", "200.0", "5.0", "100.0", "120.0", "10", "2000"]
    assert lines[2].split() == ["1", "100.0", "60.0", "200.0", "300.0", "10", "1000"]
    assert lines[3] == "global: 300.0 images/s over 2 rank(s); load balance (slowest/fastest images/s): 0.50"


def test_gather_without_process_group() -> None:
    summary = RankSummary(0, 1.0, 0.0, 0.0, 0.0, 1, 1, 1.0)
    assert gather_summaries(summary) == [summary]


def test_jsonl_appends_whole_lines_and_rank_nonzero_writes_nothing(tmp_path: Path) -> None:
    writer = JsonlWriter(tmp_path / "m" / "metrics.jsonl")
    writer.write({"step": 1, "loss": torch.tensor(0.5)})
    writer.write({"step": 2, "ranks": [RankSummary(0, 1.0, 0.0, 0.0, 0.0, 1, 1, 1.0)]})
    lines = (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    assert json.loads(lines[0])["loss"] == 0.5 and json.loads(lines[1])["ranks"][0]["rank"] == 0
    JsonlWriter(tmp_path / "other" / "metrics.jsonl", enabled=False).write({"step": 1})
    assert not (tmp_path / "other").exists()
