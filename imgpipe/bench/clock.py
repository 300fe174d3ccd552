"""Phase boundaries that hold on a GPU: a clock read only once the queued device work is done.

CUDA kernels, copies and NCCL collectives return before they finish, so host timestamps around them
measure only the launch and their time is charged to whatever phase waits next. So every phase ends
with :meth:`PhaseClock.now`, which first waits for the work queued on the device's current stream (the
loader's side-stream copy of the next batch keeps running), then reads ``time.perf_counter``; on the
CPU it is ``perf_counter`` alone.
"""

from __future__ import annotations

import time
from typing import Any, Callable


class PhaseClock:
    """``now()``: seconds (``perf_counter``) after ``settle()`` has waited for the work queued so far.

    ``settle`` defaults to synchronizing ``device``'s current CUDA stream, and to nothing on the CPU.
    """

    def __init__(self, device: Any, settle: Callable[[], None] | None = None) -> None:
        if settle is None and getattr(device, "type", "cpu") == "cuda":
            import torch

            settle = lambda: torch.cuda.current_stream(device).synchronize()  # noqa: E731
        self._settle = settle

    def now(self) -> float:
        """The time at which everything queued before this call has finished."""
        if self._settle is not None:
            self._settle()
        return time.perf_counter()
