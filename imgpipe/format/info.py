"""``imgpipe info``: what a packed dataset holds, from its manifest alone (no shard is read); a folder or a URL."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imgpipe._sys.diskinfo import format_bytes
from imgpipe.format.manifest import Skipped, load_manifest
from imgpipe.storage.source import is_url


@dataclass
class SplitSummary:
    name: str
    records: int
    bytes: int
    shards: int


@dataclass
class DatasetInfo:
    """A packed dataset in brief."""

    path: Path | str  # a local path, or a URL
    source: str
    classes: list[str]
    splits: list[SplitSummary]
    options: dict[str, Any]
    skipped: list[Skipped]
    format_version: int
    layout: str = ""


def describe(dst: str | os.PathLike) -> DatasetInfo:
    """Read ``dst/manifest.json`` (``dst`` may be a URL) into a DatasetInfo (DatasetError if it is missing or malformed)."""
    manifest = load_manifest(dst)
    splits = [SplitSummary(name, s.records, s.bytes, len(s.shards)) for name, s in manifest.splits.items()]
    return DatasetInfo(
        str(dst) if is_url(dst) else Path(dst),
        manifest.source,
        manifest.classes,
        splits,
        manifest.options,
        manifest.skipped,
        manifest.version,
        manifest.layout,
    )


def resize_line(options: dict[str, Any], resizer_here: str | None = None) -> str | None:
    """Which resizer made a pack's resized images (``options["resizer"]``), and whether ``resizer_here`` (this
    installation's) is the same: another one gives other bytes. None for a pack that kept its images' sizes."""
    resize, made = options.get("resize"), options.get("resizer")
    if resize is None:
        return None
    line = f"resized: shorter side {resize} px by {made or 'a resizer not recorded'}"
    if resizer_here is not None and made:
        alike = " too" if resizer_here == made else ": a pack made here would have other bytes"
        line += f"; this installation resizes with {resizer_here}{alike}"
    return line


def format_info(info: DatasetInfo, *, show_classes: int = 10, show_skipped: int = 20, resizer_here: str | None = None) -> str:
    """Human-readable lines for ``imgpipe info``; ``resizer_here``: the resizer this installation uses (``resize_line``)."""
    layout = f", {info.layout} layout" if info.layout else ""
    lines = [f"{info.path}  (imgpipe-recordio v{info.format_version}, packed from {info.source}{layout})"]
    lines.append("splits:")
    for s in info.splits:
        avg = format_bytes(s.bytes // s.records) if s.records else "-"
        lines.append(f"  {s.name:<8} {s.records:>10,} records  {format_bytes(s.bytes):>10}  {s.shards:>5} shard(s)  avg {avg}/record")
    shown = ", ".join(info.classes[:show_classes]) + (
        f", ... ({len(info.classes) - show_classes} more)" if len(info.classes) > show_classes else ""
    )
    lines.append(f"classes: {len(info.classes)}: {shown}")
    lines.append("options: " + ", ".join(f"{k}={v}" for k, v in sorted(info.options.items())))
    if (resized := resize_line(info.options, resizer_here)) is not None:
        lines.append(resized)
    lines.append(f"skipped: {len(info.skipped)}")
    lines += [f"  {s}" for s in info.skipped[:show_skipped]]
    if len(info.skipped) > show_skipped:
        lines.append(f"  ... and {len(info.skipped) - show_skipped} more")
    return "\n".join(lines)
