"""imgpipe's RecordIO against the real MXNet 1.9.1: byte-identical files, each reads the other's, im2rec output.

MXNet runs in its own venv (``IMGPIPE_MXNET_PYTHON``, set by ``make test``) through
``mx_helper.py``, started once for the whole module.
"""

from __future__ import annotations

import base64
import json
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from _recordio_helpers import read_indexed
from PIL import Image

from imgpipe.format import recordio
from imgpipe.format.recordio import MAGIC_BYTES as M
from imgpipe.format.recordio import IRHeader

pytestmark = [pytest.mark.interop, pytest.mark.usefixtures("mxnet_python")]  # conftest: skip, or fail under make test

HERE = Path(__file__).parent

MAGIC_AS_FLOAT = struct.unpack("<f", M)[0]  # a label whose bits are the magic, at aligned offset 4
MAGIC_AS_ID = struct.unpack("<Q", M + b"\0\0\0\0")[0]  # an id whose low word is the magic, at aligned offset 8


def big_payload() -> bytes:
    data = bytearray(np.random.default_rng(7).integers(0, 256, (1 << 20) + 1, dtype=np.uint8).tobytes())
    for at in (0, 4096, 4096 + 4, 777_777, len(data) - 8):  # aligned and unaligned (777_777 + 24) magics
        data[at : at + 4] = M
    return bytes(data)


# (label, id, id2, payload); the IRHeader is 24 bytes, so payload offset p is record offset p + 24
RECORDS = [
    (0.0, 0, 0, b""),
    (1.0, 1, 0, b"a"),
    (2.0, 2, 0, b"ab"),
    (3.0, 3, 0, b"abc"),
    (4.0, 4, 0, b"abcd"),
    (5.0, 5, 0, b"abcde"),
    (6.0, 6, 0, M),
    (7.0, 7, 0, M + b"tail"),
    (8.0, 8, 0, b"abcd" + M),
    (9.0, 9, 0, b"a" + M + b"bc"),
    (10.0, 10, 0, b"ab" + M),
    (11.0, 11, 0, b"abc" + M + b"d" + M),
    (12.0, 12, 0, M * 4 + b"xyz"),
    ([1.0, 2.5, -3.0], 13, 0, b"multi"),
    ([7.0], 14, 0, M),
    ([], 15, 0, b"no labels"),
    ([0.5] * 100, 16, 0, b"q" * 401),
    (MAGIC_AS_FLOAT, 17, 0, b"label bits are the magic"),
    (18.0, MAGIC_AS_ID, 0, b"id bits are the magic"),
    (19.0, 2**64 - 1, 2**64 - 1, b"largest ids"),
    (1e9, 2**40, 3, big_payload()),
]
KEYS = [10 * i + 3 for i in range(len(RECORDS) - 1)] + [2**40]


def expected(label, rid, id2, payload) -> dict:
    """What ``mxnet.recordio.unpack`` reports for a record packed from these values."""
    if isinstance(label, list):
        if not label:
            return {"flag": 0, "label": 0.0, "id": rid, "id2": id2, "payload": payload}
        return {"flag": len(label), "label": [float(np.float32(x)) for x in label], "id": rid, "id2": id2, "payload": payload}
    return {"flag": 0, "label": float(np.float32(label)), "id": rid, "id2": id2, "payload": payload}


EXPECTED = [expected(*r) for r in RECORDS]


def from_mxnet(d: dict) -> dict:
    return dict(d, payload=base64.b64decode(d["payload"]))


def from_imgpipe(header: IRHeader, payload: bytes) -> dict:
    label = header.label.tolist() if isinstance(header.label, np.ndarray) else header.label
    return {"flag": header.flag, "label": label, "id": header.id, "id2": header.id2, "payload": payload}


def make_jpegs(root: Path) -> dict[str, bytes]:
    files = {}
    for c, wnid in enumerate(["n01", "n02", "n03"]):
        (root / wnid).mkdir(parents=True)
        for k in range(3):
            path = root / wnid / f"{wnid}_{k}.JPEG"
            color = (40 * c + 10 * k, 255 - 60 * c, 17 * k)
            Image.new("RGB", (20 + 7 * k, 16 + 5 * c), color).save(path, quality=90)
            files[path.relative_to(root).as_posix()] = path.read_bytes()
    return files


@pytest.fixture(scope="module")
def mx(tmp_path_factory, packed_dir: Path, mxnet_python: str) -> dict:
    """Write imgpipe's shard, run MXNet once: it writes the same records, reads both shards and
    every shard of a real ``imgpipe pack`` output, and runs im2rec."""
    tmp = tmp_path_factory.mktemp("mx")
    ours = {"rec": str(tmp / "ours.rec"), "idx": str(tmp / "ours.idx")}
    theirs = {"rec": str(tmp / "mx.rec"), "idx": str(tmp / "mx.idx")}
    with recordio.IndexedRecordWriter(ours["rec"], ours["idx"]) as writer:
        for key, (label, rid, id2, payload) in zip(KEYS, RECORDS):
            writer.write(key, recordio.pack_header(IRHeader(0, label, rid, id2), payload))
    records = [
        {"key": key, "label": label, "id": rid, "id2": id2, "payload": base64.b64encode(payload).decode()}
        for key, (label, rid, id2, payload) in zip(KEYS, RECORDS)
    ]
    images = tmp / "images"
    jpegs = make_jpegs(images)
    prefix = str(tmp / "im2rec" / "data")
    Path(prefix).parent.mkdir()
    im2rec = [[prefix, str(images), "--list", "--recursive"], [prefix, str(images), "--pass-through"]]
    packed = [{"rec": str(rec), "idx": str(rec.with_suffix(".idx"))} for rec in sorted(packed_dir.glob("*.rec"))]
    job = {"write": [dict(theirs, records=records)], "read": [ours, theirs, *packed], "im2rec": im2rec}
    (tmp / "job.json").write_text(json.dumps(job))
    proc = subprocess.run(
        [mxnet_python, str(HERE / "mx_helper.py"), str(tmp / "job.json"), str(tmp / "result.json")],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp / "result.json").read_text())
    assert result["mxnet"] == "1.9.1"
    return {"ours": ours, "theirs": theirs, "result": result, "prefix": prefix, "jpegs": jpegs, "packed": packed}


@pytest.mark.timeout(300)
def test_rec_and_idx_are_byte_identical_to_mxnet(mx) -> None:
    ours, theirs = mx["ours"], mx["theirs"]
    assert Path(ours["idx"]).read_bytes() == Path(theirs["idx"]).read_bytes()
    ours_rec, theirs_rec = Path(ours["rec"]).read_bytes(), Path(theirs["rec"]).read_bytes()
    assert len(ours_rec) == len(theirs_rec) and ours_rec == theirs_rec


@pytest.mark.timeout(300)
def test_mxnet_reads_imgpipe_files_exactly(mx) -> None:
    seen = mx["result"]["read"][0]
    _, offsets = recordio.read_index(mx["ours"]["idx"])
    assert seen["keys"] == KEYS and seen["offsets"] == offsets.tolist()
    assert [from_mxnet(d) for d in seen["by_key"]] == [dict(e, key=k) for e, k in zip(EXPECTED, KEYS)]
    assert [from_mxnet(d) for d in seen["sequential"]] == EXPECTED


@pytest.mark.timeout(300)
def test_imgpipe_reads_mxnet_files_exactly(mx) -> None:
    theirs = mx["theirs"]
    read = list(read_indexed(theirs["rec"], theirs["idx"]))
    assert [key for key, _, _ in read] == KEYS
    assert [from_imgpipe(h, p) for _, h, p in read] == EXPECTED
    frames = list(recordio.iter_frames(theirs["rec"]))
    assert [from_imgpipe(*recordio.unpack_header(r)) for _, r in frames] == EXPECTED
    assert [o for o, _ in frames] == mx["result"]["read"][1]["offsets"]


@pytest.mark.timeout(300)
def test_im2rec_pass_through_output_reads_with_labels_and_exact_jpeg_bytes(mx) -> None:
    prefix = mx["prefix"]
    lst = [line.split("\t") for line in Path(prefix + ".lst").read_text().splitlines()]
    assert sorted(path for _, _, path in lst) == sorted(mx["jpegs"])
    wnid_label = {"n01": 0.0, "n02": 1.0, "n03": 2.0}
    read = list(read_indexed(prefix + ".rec", prefix + ".idx"))
    assert len(read) == len(lst) == 9
    for (key, header, payload), (index, label, path) in zip(read, lst):
        assert key == header.id == int(index)
        assert header.flag == 0 and header.label == float(label) == wnid_label[path.split("/")[0]]
        assert payload == mx["jpegs"][path]


@pytest.mark.timeout(300)
def test_mxnet_reads_every_shard_of_imgpipe_pack_like_imgpipe(mx, packed_dir: Path) -> None:
    shards = mx["packed"]
    assert {Path(s["rec"]).name.split("-")[0] for s in shards} == {"train", "val"}
    for shard, seen in zip(shards, mx["result"]["read"][2:]):
        ours = [dict(from_imgpipe(h, p), key=k) for k, h, p in read_indexed(shard["rec"], shard["idx"])]
        assert ours and [from_mxnet(d) for d in seen["by_key"]] == ours
        assert [from_mxnet(d) for d in seen["sequential"]] == [{k: v for k, v in d.items() if k != "key"} for d in ours]
        assert all(d["flag"] == 0 and d["id"] == d["key"] and d["payload"][:2] == b"\xff\xd8" for d in ours)
    for split in ("train", "val"):
        labels = np.load(packed_dir / f"{split}.labels.npy")
        mx_labels = [
            d["label"]
            for shard, seen in zip(shards, mx["result"]["read"][2:])
            if Path(shard["rec"]).name.startswith(split)
            for d in seen["sequential"]
        ]
        assert mx_labels == labels.astype(float).tolist()
