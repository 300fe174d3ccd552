"""DaemonPool: calls run in daemon threads; close() lets the threads end once the calls submitted have run."""

from __future__ import annotations

import threading

import pytest

from imgpipe._sys.threads import DaemonPool


@pytest.mark.timeout(30)
def test_close_ends_the_threads_after_the_calls_already_submitted() -> None:
    pool = DaemonPool(3, "test-pool")
    release = threading.Event()
    futures = [pool.submit(lambda k=k: (release.wait(10), k)[1]) for k in range(6)]
    threads = [t for t in threading.enumerate() if t.name.startswith("test-pool-")]
    assert len(threads) == 3 and all(t.daemon for t in threads)
    pool.close()  # three calls running, three queued
    assert not any(f.done() for f in futures)
    release.set()
    assert [f.result(timeout=10) for f in futures] == list(range(6))
    for thread in threads:
        thread.join(timeout=10)
    assert not any(t.is_alive() for t in threads)
