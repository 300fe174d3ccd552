"""The JSON schema (keys and types), the terminal table and the PNG plot."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from bench_helpers import HDD, SCHEMA, check, rank_stats, result, run
from PIL import Image

from imgpipe.bench.report import SCHEMA_VERSION, format_report, to_dict, write_json, write_plot
from imgpipe.bench.verdict import decide
from imgpipe.errors import ConfigError


def sample_result() -> Any:
    ranks = [rank_stats(0, wait=0.001, sync=0.02), rank_stats(1, wait=0.02, read=0.09)]
    measured = run(ranks, workers=2, resident=0.25)
    slower = run([rank_stats(0, wait=0.05), rank_stats(1, wait=0.06)], workers=1, resident=None)
    slower.system = None
    return result([slower, measured], disk=HDD, backends=("torch",))


def test_json_document_matches_the_documented_schema(tmp_path: Path) -> None:
    res = sample_result()
    path = write_json(tmp_path / "bench.json", to_dict(res, decide(res)))
    document = json.loads(path.read_text())
    check(document, SCHEMA)
    assert document["schema_version"] == SCHEMA_VERSION == 1
    assert document["verdict"]["bound"] == "straggler" and document["verdict"]["straggler"] == 1
    evidence = document["verdict"]["evidence"]  # the data the message says
    assert (evidence["rank"], evidence["stage"], evidence["stage_ms"], evidence["iowait_pct"]) == (1, "read", 90.0, None)
    assert set(evidence["loader_ms"]) == {"read", "decode", "consume"}
    assert document["verdict"]["actions"] == [{"action": "pack_to_ssd", "data": "/data/imagenet"}]
    assert document["best"]["torch"]["workers"] == 2
    assert len(document["runs"][1]["ranks"][0]["timeline"]) == 10
    assert document["runs"][0]["system"] is None and document["data"]["disk"]["rotational"] is True


def test_schema_check_catches_a_missing_key() -> None:
    res = sample_result()
    document = to_dict(res, decide(res))
    del document["runs"][0]["ranks"][1]["data_wait_frac"]
    with pytest.raises(AssertionError, match="data_wait_frac"):
        check(document, SCHEMA)


def test_schema_is_documented() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "bench-json.md").read_text()
    for key in (
        "schema_version",
        "page_cache_resident_before",
        "own_images_per_s",
        "stages_ms",
        "timeline",
        "iowait_pct",
        "straggler",
        "store_io",
        "latency_ms",
        "evidence",
        "actions",
    ):
        assert f"`{key}`" in doc, key


def test_table_shows_runs_ranks_and_verdict() -> None:
    res = sample_result()
    text = format_report(res, decide(res))
    assert "on rotational /dev/sdb1" in text
    assert "verdict: rank 1 is a straggler" in text
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("rank "))
    assert lines[header + 2].split()[0] == "1" and len(lines[header + 2].split()) == 11


@pytest.mark.timeout(60)
def test_plot_writes_a_png(tmp_path: Path) -> None:
    res = sample_result()
    path = write_plot(tmp_path / "bench.png", res, decide(res))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(path) as img:
        img.verify()
        assert img.width >= 600 and img.height >= 400
    assert not list(tmp_path.glob(".*.tmp"))


def test_plot_without_matplotlib_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an environment without it looks like to import
    res = sample_result()
    with pytest.raises(ConfigError, match=r"pip install 'imgpipe\[plot\]'"):
        write_plot(tmp_path / "bench.png", res, decide(res))
    assert not (tmp_path / "bench.png").exists()
