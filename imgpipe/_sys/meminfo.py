"""The memory this machine's processes can still get, through psutil: what bounds the torch loader's shared-memory ring."""

from __future__ import annotations

import psutil


def available_memory() -> int | None:
    """Available memory in bytes (free memory plus what the kernel can reclaim: MemAvailable on Linux); None where it cannot be read."""
    try:
        return int(psutil.virtual_memory().available)
    except (OSError, RuntimeError):
        return None
