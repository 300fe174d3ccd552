"""The JSON schema (keys and types), the terminal table and the PNG plot."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from bench_helpers import HDD, rank_stats, result, run
from PIL import Image

from imgpipe.bench.report import SCHEMA_VERSION, format_report, to_dict, write_json, write_plot
from imgpipe.bench.verdict import decide
from imgpipe.errors import ConfigError

NUM = (int, float)
OPT_NUM = (int, float, type(None))
STAGES = {k: OPT_NUM for k in ("read", "decode", "collate", "h2d", "compute", "sync")}
RANK = {
    "rank": int, "images_per_s": NUM, "own_images_per_s": NUM, "data_wait_frac": NUM, "batch_ms_p50": NUM,
    "batch_ms_p95": NUM, "steps": int, "images": int, "stages_ms": STAGES, "timeline": list,
}
SYSTEM = {
    "seconds": NUM, "samples": int, "cpu_util_pct": NUM, "iowait_pct": NUM, "iowait_max_pct": NUM, "read_mb_s": OPT_NUM,
    "mem_available_mb": NUM, "cached_mb": NUM,
}
RUN = {
    "backend": str, "workers": int, "images_per_s": NUM, "imbalance": NUM, "page_cache_resident_before": OPT_NUM,
    "system": (SYSTEM, type(None)), "ranks": [RANK],
}
# docs/bench-json.md, schema_version 1: a key that disappears or changes type fails here
SCHEMA: dict[str, Any] = {
    "schema_version": int,
    "imgpipe_version": str,
    "data": {
        "path": str, "split": str, "records": int, "bytes": int,
        "disk": {"device": str, "mountpoint": str, "fstype": str, "rotational": (bool, type(None)), "network": bool},
    },
    "config": {
        "ranks": int, "gpus": int, "device": str, "cpus": int, "backends": [str], "workers": [int], "steps": int, "warmup": int,
        "batch_size": int, "image_size": int, "model": (str, type(None)), "compute_ms": NUM, "cold": bool,
    },
    "runs": [RUN],
    "best": {"*": {"workers": int, "images_per_s": NUM}},
    "verdict": {
        "bound": str, "message": str, "backend": str, "workers": int, "straggler": (int, type(None)),
        "cause": (str, type(None)), "notes": [str],
    },
}


def check(value: Any, spec: Any, where: str = "$") -> None:
    """Assert ``value`` matches ``spec``: a dict of keys, a one-item list, a type or a tuple of alternatives."""
    if isinstance(spec, tuple) and any(isinstance(s, dict) for s in spec):
        if value is None and type(None) in spec:
            return
        spec = next(s for s in spec if isinstance(s, dict))
    if isinstance(spec, dict):
        assert isinstance(value, dict), f"{where} is not an object"
        if set(spec) == {"*"}:
            for key, item in value.items():
                check(item, spec["*"], f"{where}.{key}")
            return
        assert set(value) == set(spec), f"{where}: keys {sorted(set(value) ^ set(spec))} differ from the schema"
        for key, sub in spec.items():
            check(value[key], sub, f"{where}.{key}")
    elif isinstance(spec, list):
        assert isinstance(value, list), f"{where} is not a list"
        for i, item in enumerate(value):
            check(item, spec[0], f"{where}[{i}]")
    else:
        assert isinstance(value, spec) and not (spec in (int, NUM) and isinstance(value, bool)), f"{where}={value!r} is not {spec}"


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
    for key in ("schema_version", "page_cache_resident_before", "own_images_per_s", "stages_ms", "timeline", "iowait_pct", "straggler"):
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
