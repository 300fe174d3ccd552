"""Copy files from a source to a target, several at once, each one checked against its sha256.

To a local folder a file is copied by ranges of ``PART_BYTES``, ``jobs`` ranges at a time across files,
into a ``RangeFile`` (every write's length checked, the bytes hashed from the disk as they land), then
synced, renamed into place and journaled; to a store a local file is uploaded whole (multipart) and the
hash of the bytes sent compared; URL to URL passes through a local scratch folder. A wrong hash is
copied again: damage in transit differs from try to try, and the same wrong hash twice is the source's.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, InvalidStateError
from pathlib import Path
from typing import Any, Callable

from imgpipe._sys.checksum import sha256_file
from imgpipe._sys.oserrors import describe
from imgpipe._sys.threads import DaemonPool
from imgpipe.errors import DatasetError
from imgpipe.format.files import SidecarError
from imgpipe.staging.plan import StagedFile
from imgpipe.staging.rangefile import RangeFile
from imgpipe.staging.target import LocalTarget, Target
from imgpipe.storage.local import LocalSource
from imgpipe.storage.source import ByteSource

logger = logging.getLogger(__name__)

PART_BYTES = 16 << 20  # one ranged copy
FILE_TRIES = 3  # copies of one file before a wrong hash is final
UPLOAD_FILES = 4  # files uploaded at once (each in parallel parts of its own)


class Copier:
    """Copies ``StagedFile``s from ``source`` to ``target``: ``run`` returns once all are in place and
    journaled, or raises the first failure once the copies in flight have stopped."""

    def __init__(self, source: ByteSource, target: Target, *, jobs: int, bar: Any, scratch: Path | None = None) -> None:
        self.source = source
        self.target = target
        self.jobs = jobs
        self.bar = bar
        self.scratch = scratch  # a local folder for files passing from one URL to another
        self.pool = DaemonPool(jobs, "imgpipe-stage")
        self.uploads = DaemonPool(UPLOAD_FILES, "imgpipe-upload")
        self.failure: BaseException | None = None
        self.copied_bytes = 0  # of the files copied (not those found right in place)
        self.found_in_place = 0  # files not journaled but already right in a local target
        self._room = threading.Condition()
        self._in_flight = 0  # ranges submitted and not finished

    def run(self, files: list[StagedFile], rehash: list[StagedFile] | None = None) -> None:
        """Copy ``files``. ``rehash``: files already in a local target but not journaled (a stage killed
        between a rename and its journal entry, or a copy made otherwise): hashed there, journaled when
        right, copied again when not."""
        try:
            started = [self._rehashed(staged) for staged in rehash or []]
            for staged in files:
                with self._room:
                    while self._in_flight >= 2 * self.jobs and self.failure is None:
                        self._room.wait()
                if self.failure is not None:
                    break
                started.append(self._start(staged))
            for future in started:
                future.exception()  # wait for each; the first failure is kept in self.failure
            with self._room:
                while self._in_flight:
                    self._room.wait()
            if self.failure is not None:
                raise self.failure
        except BaseException as e:  # an interrupt too: the copies not started yet stop at their start
            self.fail(e)
            raise
        finally:
            self.pool.close()
            self.uploads.close()

    def _start(self, staged: StagedFile) -> Future:
        """Copy one file; the Future is done when it is verified and journaled (or failed)."""
        if isinstance(self.target, LocalTarget):
            target = self.target
            return _Download(self, staged, target.part(staged.name), lambda path: self._place(target, staged, path)).start()
        if isinstance(self.source, LocalSource):
            return _Upload(self, staged, self.source.path(staged.name)).start()
        assert self.scratch is not None
        scratch = self.scratch / staged.name

        def upload(path: Path) -> None:
            try:
                _Upload(self, staged, path).run()
            finally:
                path.unlink(missing_ok=True)

        return _Download(self, staged, scratch, upload, counted=False).start()

    def _place(self, target: LocalTarget, staged: StagedFile, part: Path) -> None:
        target.commit(staged.name, part)
        target.record(staged.name, staged.size, staged.sha256)
        self.copied(staged.size)

    def copied(self, size: int) -> None:
        with self._room:
            self.copied_bytes += size

    def _rehashed(self, staged: StagedFile) -> Future:
        assert isinstance(self.target, LocalTarget)
        done: Future = Future()
        path = self.target.folder / staged.name

        def check() -> None:
            try:
                right = sha256_file(path) == staged.sha256
            except OSError:
                right = False
            try:
                if not right:
                    copy = self._start(staged)
                    copy.add_done_callback(lambda f: done.set_exception(f.exception()) if f.exception() else done.set_result(None))
                    return
                self.target.record(staged.name, staged.size, staged.sha256)  # type: ignore[union-attr]
            except BaseException as e:  # handed to the caller through the Future
                error = self.error(staged, e)
                done.set_exception(error)
                self.fail(error)
                return
            self.progress(staged.size)
            with self._room:
                self.found_in_place += 1
            done.set_result(None)

        self.submit(check)
        return done

    # ------------------------------------------------------------------ shared by the copies

    def fail(self, error: BaseException) -> None:
        with self._room:
            if self.failure is None:
                self.failure = error
            self._room.notify_all()

    def progress(self, size: int) -> None:
        with self._room:
            self.bar.update(size)

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` in the pool, counted as in flight until it returns."""
        with self._room:
            self._in_flight += 1
        self.pool.submit(self._counted, fn, *args)

    def _counted(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        finally:
            with self._room:
                self._in_flight -= 1
                self._room.notify_all()

    def error(self, staged: StagedFile, error: BaseException) -> BaseException:
        """An OSError of a copy as one line naming the file; imgpipe's own errors as they are."""
        if isinstance(error, OSError):
            detail = describe(error, writing=True) if error.errno else str(error)
            return DatasetError(f"copying {self.source.where(staged.name)} to {self.target.where(staged.name)}: {detail}")
        return error

    def check_unhashed(self, staged: StagedFile, path: Path) -> DatasetError | None:
        """A file whose sha256 the manifest lacks: its size, and for an index or a sidecar its parse; None when right."""
        where = self.source.where(staged.name)
        logger.warning(
            "%s: the manifest holds no sha256 for it: checked by its size%s only", where, " and by parsing it" if staged.parse else ""
        )
        size = path.stat().st_size
        if size != staged.size:
            return DatasetError(f"{where}: {size} bytes copied of {staged.size}; rerun")
        if staged.parse is not None:
            try:
                staged.parse(path.read_bytes())
            except SidecarError as e:
                return DatasetError(
                    f"{where}: {e} (the manifest holds no sha256 for it); run 'imgpipe verify {self.source.location or where}'"
                )
        return None

    def wrong_hash(self, staged: StagedFile, digest: str, wrong: set[str], tries: int) -> DatasetError | None:
        """None when the file is worth another copy; else why not, in one line."""
        where = self.source.where(staged.name)
        if digest in wrong:
            return DatasetError(
                f"{where}: sha256 differs from the manifest, twice alike: the file at the source is damaged or changed since "
                f"packing; run 'imgpipe verify {self.source.location or where}'"
            )
        if tries >= FILE_TRIES:
            return DatasetError(
                f"{where}: sha256 differs from the manifest in {tries} copies, each differently: bytes are damaged on the way; "
                "check the network or the disk, then rerun"
            )
        wrong.add(digest)
        return None


class _Download:
    """One file copied range by range into a local ``RangeFile``, hashed in order as the ranges land;
    ``then(path)`` runs once it hashes right (place it, or upload it on)."""

    def __init__(self, copier: Copier, staged: StagedFile, dest: Path, then: Callable[[Path], None], *, counted: bool = True) -> None:
        self.copier = copier
        self.staged = staged
        self.dest = dest
        self.then = then
        self.counted = counted  # the bar counts the bytes here (not when an upload follows)
        self.done: Future = Future()
        self.tries = 0
        self.wrong: set[str] = set()
        self.file: RangeFile | None = None

    def start(self) -> Future:
        self._begin()
        return self.done

    def _begin(self) -> None:
        self.tries += 1
        size = self.staged.size
        self.spans = [(start, min(start + PART_BYTES, size)) for start in range(0, size, PART_BYTES)]
        try:
            self.file = RangeFile(self.dest, size, writeback=True)
        except OSError as e:
            self._fail(e)
            return
        if not self.spans:
            self.copier.submit(self._landed, 0, 0)
        for k in range(len(self.spans)):
            self.copier.submit(self._copy, k)

    def _copy(self, k: int) -> None:
        if self.done.done():
            return
        if self.copier.failure is not None:  # another file failed: stop this one too
            self._fail(self.copier.failure)
            return
        start, end = self.spans[k]
        try:
            self.copier.source.download_range(self.staged.name, self.dest, start, end)
        except BaseException as e:  # handed to the caller through the Future
            self._fail(e)
            return
        if self.counted:
            self.copier.progress(end - start)
        self._landed(start, end)

    def _landed(self, start: int, end: int) -> None:
        file = self.file
        if self.done.done() or file is None:
            return
        try:
            last = file.landed(start, end)
        except BaseException as e:  # handed to the caller through the Future
            self._fail(e)
            return
        if last:
            self._verify(file)

    def _verify(self, file: RangeFile) -> None:
        if file.short:
            self._fail(DatasetError(f"{self.dest}: ends at byte {file.hashed}, before {file.size} (changed while being copied?)"))
            return
        digest = file.sha256()
        if not self.staged.sha256:
            why = self.copier.check_unhashed(self.staged, self.dest)
            if why is not None:
                self._fail(why)
                return
        elif digest != self.staged.sha256:
            why = self.copier.wrong_hash(self.staged, digest, self.wrong, self.tries)
            if why is not None:
                self._fail(why)
                return
            if self.counted:
                self.copier.progress(-self.staged.size)
            file.close()
            self._begin()
            return
        try:
            committed = file.commit(self.staged.sha256 or None)
            file.close()
            if not committed:
                raise DatasetError(f"{self.dest}: not all of it was written; rerun")
            self.then(self.dest)
        except BaseException as e:  # handed to the caller through the Future
            self._fail(e)
            return
        self.done.set_result(None)

    def _fail(self, error: BaseException) -> None:
        error = self.copier.error(self.staged, error)
        if self.done.done():
            return
        try:
            self.done.set_exception(error)
        except InvalidStateError:  # another range of this file failed at the same moment
            return
        if self.file is not None:
            self.file.close()
        self.copier.fail(error)


class _Upload:
    """One local file uploaded to a store, checked by the hash of the bytes sent and the size stored."""

    def __init__(self, copier: Copier, staged: StagedFile, path: Path) -> None:
        self.copier = copier
        self.staged = staged
        self.path = path

    def start(self) -> Future:
        return self.copier.uploads.submit(self._run_reporting)

    def _run_reporting(self) -> None:
        if self.copier.failure is not None:
            return
        try:
            self.run()
        except BaseException as e:
            error = self.copier.error(self.staged, e)
            self.copier.fail(error)
            raise error from None

    def run(self) -> None:
        target, staged = self.copier.target, self.staged
        wrong: set[str] = set()
        tries = 0
        while True:
            tries += 1
            if not staged.sha256:
                unhashed = self.copier.check_unhashed(staged, self.path)
                if unhashed is not None:
                    raise unhashed
            size, digest = target.upload(staged.name, self.path)  # type: ignore[union-attr]
            if (digest == staged.sha256 or not staged.sha256) and size == staged.size:
                break
            why = self.copier.wrong_hash(staged, digest, wrong, tries)
            if why is not None:
                target.remove([staged.name])
                raise why
        stored = target.size(staged.name)  # type: ignore[union-attr]
        if stored != size:
            raise DatasetError(f"{target.where(staged.name)}: the store holds {stored} bytes after an upload of {size}; rerun")
        target.record(staged.name, size, digest)
        self.copier.progress(size)
        self.copier.copied(size)
