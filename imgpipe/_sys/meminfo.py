"""``/proc/meminfo``, read: what the bench samples and what bounds the torch loader's shared-memory ring."""

from __future__ import annotations

MEMINFO = "/proc/meminfo"


def parse_meminfo(text: str) -> dict[str, int]:
    """Map /proc/meminfo keys to bytes."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            scale = 1024 if len(parts) > 1 and parts[1] == "kB" else 1
            values[key.strip()] = int(parts[0]) * scale
    return values


def available_memory(path: str = MEMINFO) -> int | None:
    """MemAvailable in bytes (free memory plus what the kernel can reclaim); None where it cannot be read."""
    try:
        with open(path) as f:
            return parse_meminfo(f.read()).get("MemAvailable")
    except OSError:
        return None
