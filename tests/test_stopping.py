"""Every command stops within a few seconds of SIGTERM (143), SIGINT (130) or SIGHUP (129) with one line, whatever its
threads are doing: a real ``imgpipe pack`` whose Parquet listing never ends and whose threads keep it from ending."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "train"))
from proctree import descendants, wait_gone  # noqa: E402

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

HERE = Path(__file__).parent
STOPPED_WITHIN_S = 15  # the grace is 5 s; a loaded machine adds its start-up and scheduling


@pytest.fixture(scope="module")
def parquet_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("hf")
    (src / "data").mkdir()
    from PIL import Image

    photo = io.BytesIO()
    Image.new("RGB", (32, 24), (200, 100, 50)).save(photo, "JPEG")
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    rows = [{"bytes": photo.getvalue(), "path": f"{k}_n01440764.JPEG"} for k in range(4)]
    table = pa.table({"image": pa.array(rows, type=image), "label": [0] * 4})
    pq.write_table(table, src / "data" / "train-00000-of-00001.parquet")
    return src


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["spinning", "blocked", "main-in-c", "workers"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])  # SIGHUP: the terminal closed
def test_a_command_whose_threads_never_end_stops_within_seconds(kind: str, signum: int, parquet_src: Path, tmp_path: Path) -> None:
    marker = tmp_path / "stuck"
    run = subprocess.Popen(
        [sys.executable, str(HERE / "_stuck_command.py"), kind, str(marker), "pack", str(parquet_src), str(tmp_path / "out"),
         "--workers", "1", "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.02)
    assert marker.exists(), run.communicate()[1]
    workers = descendants(run.pid)
    assert len(workers) == (2 if kind == "workers" else 0)
    os.killpg(run.pid, signum) if signum == signal.SIGINT else run.send_signal(signum)  # Ctrl-C reaches the whole group
    try:
        _, err = run.communicate(timeout=STOPPED_WITHIN_S)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        run.communicate()
        pytest.fail(f"{kind}: still running {STOPPED_WITHIN_S} s after {signal.Signals(signum).name}")
    assert run.returncode == 128 + signum, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    lines = [line for line in err.splitlines() if not line.startswith("imgpipe: INFO") and not line.startswith("imgpipe: WARNING")]
    assert len(lines) == 1 and lines[0].startswith(f"imgpipe: stopped by {signal.Signals(signum).name}"), err
    left = wait_gone(workers, 10)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"workers {left} outlived the command"


@pytest.mark.timeout(60)
def test_under_nohup_sighup_is_left_ignored(parquet_src: Path, tmp_path: Path) -> None:
    """nohup (SIGHUP ignored) keeps a command running when its terminal closes: the command does not take SIGHUP back."""
    marker = tmp_path / "stuck"
    run = subprocess.Popen(
        [sys.executable, str(HERE / "_stuck_command.py"), "blocked", str(marker), "pack", str(parquet_src), str(tmp_path / "out"),
         "--workers", "1", "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.02)
    assert marker.exists(), run.communicate()[1]
    run.send_signal(signal.SIGHUP)
    run.send_signal(signal.SIGTERM)  # the SIGHUP, sent first and a lower number, is handled (or not) before it
    try:
        _, err = run.communicate(timeout=STOPPED_WITHIN_S)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 143, err
    assert "imgpipe: stopped by SIGTERM" in err and "SIGHUP" not in err, err


def test_a_library_call_leaves_the_signal_handlers_as_it_found_them(parquet_src: Path, tmp_path: Path) -> None:
    """pack (listing in threads, packing in worker processes) installs no handler and no wakeup fd in its caller."""
    from imgpipe.packing.packer import pack

    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD)}
    wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup)
    pack(parquet_src, tmp_path / "out", workers=2, progress=False)
    assert {signum: signal.getsignal(signum) for signum in before} == before
    assert signal.set_wakeup_fd(wakeup) == wakeup


def imgpipe_command(*args: str, **hooks: str) -> subprocess.Popen:
    sys.path.insert(0, str(HERE))
    from _hooks.faults import hook_env

    env = hook_env({**os.environ, "OMP_NUM_THREADS": "1"}, **hooks)
    return subprocess.Popen([sys.executable, "-m", "imgpipe", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def the_one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if not line.startswith(("imgpipe: INFO", "imgpipe: WARNING"))]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("when", ["early", "late"])  # the hook that gets the signal runs before imgpipe's fork hooks, or after
@pytest.mark.parametrize("command", ["pack", "verify"])
def test_a_signal_that_arrives_while_the_command_forks_its_workers_stops_it_at_once(
    command: str, when: str, synth_tree: Path, packed_dir: Path, tmp_path: Path
) -> None:
    """Raised in a fork hook, the stop was printed ("Exception ignored in: <function _releaseLock>") and lost."""
    if command == "pack":
        args = ["pack", str(synth_tree), str(tmp_path / "out"), "--workers", "2", "--no-progress"]
    else:
        args = ["verify", str(packed_dir), "--workers", "2", "--no-progress"]
    run = imgpipe_command(*args, IMGPIPE_TEST_SIGNAL_IN_FORK=f"SIGTERM,{when}")
    seen: set[int] = set()
    deadline = time.monotonic() + 60
    while run.poll() is None and time.monotonic() < deadline:
        seen.update(descendants(run.pid))
        time.sleep(0.02)
    if run.poll() is None:
        run.kill()
        pytest.fail("the signal did not end the command within 60 s")
    err = run.stderr.read()
    assert run.returncode == 143, err
    assert "Exception ignored" not in err and "Traceback" not in err, err
    assert the_one_line(err).startswith("imgpipe: stopped by SIGTERM"), err
    assert wait_gone(sorted(seen), 10) == []


@pytest.mark.timeout(60)
def test_ctrl_c_while_the_arguments_are_read_is_one_line_without_an_empty_one() -> None:
    """click's own main prints an empty line before it turns Ctrl-C into Abort."""
    ctrl_c_in_parse = (
        "import signal, click; parse = click.Command.parse_args; "
        "click.Command.parse_args = lambda self, ctx, args: (signal.raise_signal(signal.SIGINT), parse(self, ctx, args))[1]; "
        "from imgpipe.cli import main; main(['info', '.'])"
    )
    done = subprocess.run([sys.executable, "-c", ctrl_c_in_parse], capture_output=True, text=True, timeout=50)
    assert done.returncode == 130
    assert done.stderr == "imgpipe: aborted\n"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("module", ["psutil", "imgpipe._sys.procs"])  # what the guard imports once its handlers are set
@pytest.mark.parametrize(("signum", "line"), [(signal.SIGTERM, "imgpipe: stopped by SIGTERM"), (signal.SIGINT, "imgpipe: aborted")])
def test_a_signal_while_the_stop_guard_installs_itself_is_one_line(module: str, signum: int, line: str) -> None:
    """It was a traceback of Stopped, then one of the exit handler ('StopGuard' object has no attribute '_exit_now'), exit 1."""
    signal_in_import = (
        "import importlib.abc, signal, sys\n"
        "class Hook(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        f"        if name == {module!r}:\n"
        "            sys.meta_path.remove(self)\n"
        f"            signal.raise_signal({int(signum)})\n"
        "sys.meta_path.insert(0, Hook())\n"
        "from imgpipe.cli import main\n"
        f"assert {module!r} not in sys.modules\n"
        "main(['info', '.'])\n"
    )
    done = subprocess.run([sys.executable, "-c", signal_in_import], capture_output=True, text=True, timeout=50)
    assert (done.returncode, done.stderr) == (128 + signum, f"{line}\n")


@pytest.mark.timeout(120)
def test_the_command_ends_with_its_exit_handlers_not_in_the_teardown_where_a_signal_kills_without_a_word(
    packed_dir: Path, tmp_path: Path
) -> None:
    """After the exit handlers, Python gives signals back to the OS: SIGTERM while a command's interpreter tore down its
    modules (torch's, for seconds after `imgpipe bench`) killed it with -15 and no line. It now ends before that."""
    marker = tmp_path / "teardown"
    run = imgpipe_command("info", str(packed_dir), IMGPIPE_TEST_SLOW_EXIT=f"{marker},teardown")
    deadline = time.monotonic() + 60
    while run.poll() is None and not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    if run.poll() is None:
        run.send_signal(signal.SIGTERM)  # in its teardown: this is the moment that killed it without a word
    _, err = run.communicate(timeout=30)
    assert not marker.exists(), f"the interpreter's teardown ran (exit {run.returncode}): {err}"
    assert run.returncode == 0, err


@pytest.mark.timeout(120)
def test_a_command_ends_after_multiprocessing_has_ended_its_daemonic_children(packed_dir: Path, tmp_path: Path) -> None:
    """The command's own exit handler ends the process after multiprocessing's, which ends the daemonic children left
    running, not before it (a child of 60 s was left orphaned)."""
    marker = tmp_path / "daemon.pid"
    run = imgpipe_command("info", str(packed_dir), IMGPIPE_TEST_SLOW_EXIT=f"{marker},daemon")
    assert run.wait(timeout=60) == 0  # info's output is small: it fits the pipe unread
    child = int(marker.read_text())
    try:
        assert wait_gone([child], timeout=10) == [], "the daemonic child outlived the command"
    finally:
        if wait_gone([child], timeout=0):
            os.kill(child, signal.SIGKILL)
        run.communicate(timeout=30)


@pytest.mark.timeout(120)
def test_a_signal_during_the_exit_handlers_is_one_line_and_143(packed_dir: Path, tmp_path: Path) -> None:
    marker = tmp_path / "exiting"
    run = imgpipe_command("info", str(packed_dir), IMGPIPE_TEST_SLOW_EXIT=f"{marker},handler")
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        assert run.poll() is None, run.communicate()[1]
        time.sleep(0.02)
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=STOPPED_WITHIN_S)
    assert run.returncode == 143, err
    assert the_one_line(err) == "imgpipe: stopped by SIGTERM", err
