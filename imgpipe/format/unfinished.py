"""What a folder looks like while a writer still works on it, and the one line that says so.

A packed folder is complete only when its ``manifest.json`` exists: every writer writes it last. Until
then each writer keeps its state in a folder of its own inside DST (``.imgpipe-pack/``,
``.imgpipe-stage/``, ``.imgpipe-cache/``: docs/format.md), and every reader (the loaders, ``verify``,
``info``, ``stage``) that finds one without a manifest refuses the folder with that writer's line. The
writers take these names from here; their files inside are theirs.
"""

from __future__ import annotations

import os
from pathlib import Path

from imgpipe._sys.jsonfile import loads
from imgpipe._sys.regular import read_regular
from imgpipe.format.files import MANIFEST_NAME, MAX_SHARDS, SHARD_FILE

JOURNAL_DIR = ".imgpipe-pack"
PLAN_NAME = "plan.json"  # in the pack journal: options, fingerprint, planned shard count
STAGE_DIR = ".imgpipe-stage"
STAGED_SUFFIX = ".done"  # a file verified in place, in STAGE_DIR
CACHE_STATE_DIR = ".imgpipe-cache"


def unfinished_pack(folder: str | os.PathLike) -> str | None:
    """A one-line 'incomplete pack' message when ``folder`` holds a pack journal but no manifest, else None.

    Shards beside a journal are a pack that was killed, ran out of disk, is still running, or
    waits for other nodes.
    """
    folder = Path(folder)
    journal = folder / JOURNAL_DIR
    if (folder / MANIFEST_NAME).exists() or not journal.is_dir():
        return None
    done = sum(1 for p in journal.iterdir() if (m := SHARD_FILE.match(p.name)) and m["ext"] == "json")
    try:
        plan = loads(read_regular(journal / PLAN_NAME))
    except OSError:
        if not done:  # only the lock of a pack that stopped before planning (e.g. refused this DST)
            return None
        plan = None
    except ValueError as e:
        return (
            f"{folder}: incomplete pack, no {MANIFEST_NAME}, and its journal {JOURNAL_DIR}/{PLAN_NAME} is unreadable ({e}); "
            "rerun 'imgpipe pack' with --overwrite (with --num-nodes: empty DST, then start every node) to start again"
        )
    total = _planned_shards(plan, done)
    rerun = "rerun the same 'imgpipe pack' (with --num-nodes: every --node-rank, then --finalize)"
    if total is None:
        state = f"{done} shard(s) finished, the planned count is unknown"
    elif done < total:
        state = f"{total - done} of {total} shards missing"
    else:
        state = f"all {total} shards written"
    return f"{folder}: incomplete pack: {state}, no {MANIFEST_NAME}; {rerun}"


def _planned_shards(plan: object, done: int) -> int | None:
    """plan.json's shard count where it can be true: no fewer than the ``done`` shards journaled, and no more than its
    splits' shard names can number (``MAX_SHARDS`` each); else None (-1, 0 or 2**64 written by hand)."""
    if not isinstance(plan, dict) or not isinstance(plan.get("options"), dict):
        return None
    total, splits = plan.get("shards"), plan["options"].get("splits")
    if type(total) is not int or not isinstance(splits, list):
        return None
    return total if max(done, 1) <= total <= MAX_SHARDS * len(splits) else None


def unfinished_copy(folder: str | os.PathLike) -> str | None:
    """A one-line 'incomplete copy' message when ``folder`` holds the journal of an ``imgpipe stage`` but no manifest, else None."""
    folder = Path(folder)
    journal = folder / STAGE_DIR
    if (folder / MANIFEST_NAME).exists() or not journal.is_dir():
        return None
    done = sum(1 for p in journal.iterdir() if p.name.endswith(STAGED_SUFFIX))
    return (
        f"{folder}: incomplete copy: {done} file(s) staged and checked, no {MANIFEST_NAME}; "
        f"rerun the same 'imgpipe stage SRC {folder}' to finish it"
    )


def unfinished_cache(folder: str | os.PathLike) -> str | None:
    """A one-line 'incomplete node cache' message when ``folder`` is a node cache not yet complete, else None."""
    folder = Path(folder)
    if (folder / MANIFEST_NAME).exists() or not (folder / CACHE_STATE_DIR).is_dir():
        return None
    return (
        f"{folder}: an incomplete node cache ({CACHE_STATE_DIR}/, no {MANIFEST_NAME}): its shards may still lack records; "
        f"read its dataset's URL with cache_dir={folder}, which finishes it"
    )


def incomplete_folder(folder: str | os.PathLike) -> str | None:
    """One line when ``folder`` is an unfinished pack, copy or node cache (no manifest yet), else None."""
    return unfinished_pack(folder) or unfinished_copy(folder) or unfinished_cache(folder)
