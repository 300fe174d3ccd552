"""Runs inside the MXNet 1.9.1 reference venv: writes and reads RecordIO with mxnet's own code.

Usage: python mx_helper.py JOB.json RESULT.json

JOB.json: {"write": [{"rec", "idx", "records": [{"key", "label", "id", "id2", "payload"}]}],
           "read": [{"rec", "idx"}], "im2rec": [[ARG, ...], ...]}
``label`` is a number or a list of numbers; ``payload`` is base64. RESULT.json holds, for each
"read" entry, what ``MXIndexedRecordIO`` sees (keys, offsets, records by key) and what a
sequential ``MXRecordIO.read()`` sees, with headers from ``mxnet.recordio.unpack``. Each
"im2rec" entry runs mxnet's own ``tools/im2rec.py`` with those arguments, in this process.
"""

import base64
import json
import os
import runpy
import sys

import mxnet as mx
import numpy as np


def write(job):
    writer = mx.recordio.MXIndexedRecordIO(job["idx"], job["rec"], "w")
    for r in job["records"]:
        header = mx.recordio.IRHeader(0, r["label"], r["id"], r["id2"])
        writer.write_idx(r["key"], mx.recordio.pack(header, base64.b64decode(r["payload"])))
    writer.close()


def describe(record):
    header, payload = mx.recordio.unpack(record)
    label = header.label.tolist() if isinstance(header.label, np.ndarray) else float(header.label)
    return {
        "flag": int(header.flag),
        "label": label,
        "id": int(header.id),
        "id2": int(header.id2),
        "payload": base64.b64encode(payload).decode("ascii"),
    }


def read(job):
    indexed = mx.recordio.MXIndexedRecordIO(job["idx"], job["rec"], "r")
    by_key = [dict(describe(indexed.read_idx(key)), key=key) for key in indexed.keys]
    offsets = [indexed.idx[key] for key in indexed.keys]
    indexed.close()
    stream = mx.recordio.MXRecordIO(job["rec"], "r")
    sequential = []
    while True:
        record = stream.read()
        if record is None:
            break
        sequential.append(describe(record))
    stream.close()
    return {"keys": list(indexed.keys), "offsets": offsets, "by_key": by_key, "sequential": sequential}


def im2rec(args):
    script = os.path.join(os.path.dirname(mx.__file__), "tools", "im2rec.py")
    saved = sys.argv
    sys.argv = [script] + list(args)
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv = saved


def main():
    with open(sys.argv[1]) as f:
        job = json.load(f)
    for spec in job.get("write", []):
        write(spec)
    for args in job.get("im2rec", []):
        im2rec(args)
    result = {"mxnet": mx.__version__, "read": [read(spec) for spec in job.get("read", [])]}
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
