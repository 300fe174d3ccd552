"""The optional C extensions over libjpeg-turbo: the loaders' region decoder and pack's JPEG shrinker
and scan check (everything else is in pyproject.toml).

``make wheel`` builds a manylinux wheel with libjpeg-turbo inside (docs/install.md). A build from
source compiles them where a C compiler and libjpeg-turbo's headers are found; elsewhere it goes on
without them and prints one warning (pip shows a successful build's output only with ``-v``, so the
warning also goes to the terminal, and the first loader of a process warns again at run time).
``IMGPIPE_REQUIRE_EXTENSIONS=1`` (``make wheel`` sets it) makes a failed compile fail the build.
"""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import BaseError, CCompilerError

REQUIRED = os.environ.get("IMGPIPE_REQUIRE_EXTENSIONS", "") not in ("", "0")
NOT_BUILT = """
WARNING: imgpipe's C extensions over libjpeg-turbo were not built: {failures} (`pip install -v` shows why).
imgpipe works without them, only slower: the torch loader decodes whole JPEGs, pack checks the JPEGs it keeps
with a whole decode, and pack --resize resizes with Pillow (other bytes).
For the fast path, install imgpipe's manylinux wheel (libjpeg-turbo inside; `make wheel` builds it), or install
a C compiler and libjpeg-turbo's headers (Debian/Ubuntu: libjpeg62-turbo-dev or libjpeg-turbo8-dev;
RHEL/Fedora: libjpeg-turbo-devel; conda: conda install -c conda-forge libjpeg-turbo), then reinstall imgpipe.
"""


def say(text: str) -> None:
    """``text`` on stderr and, when stderr is not the terminal (pip captures it), on the terminal too, if there is one."""
    sys.stderr.write(text)
    if sys.stderr.isatty():
        return
    try:
        with open("/dev/tty", "w") as tty:
            tty.write(text)
    except OSError:  # no controlling terminal (CI, a daemon): stderr, in the build log, is all there is
        pass


class BuildExt(build_ext):
    """``build_ext`` that names the optional extensions that failed to build, once, after trying them all."""

    def run(self) -> None:
        self.failures: list[str] = []
        super().run()
        if self.failures:
            say(NOT_BUILT.format(failures=", ".join(self.failures)))

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except (CCompilerError, BaseError):
            if not ext.optional:
                raise
            self.failures.append(ext.name)


setup(
    cmdclass={"build_ext": BuildExt},
    ext_modules=[
        Extension(
            "imgpipe.image._jpeg_region",
            ["imgpipe/image/_jpeg_region.c"],
            libraries=["jpeg"],
            extra_compile_args=["-O2", "-Wall"],
            optional=not REQUIRED,
        ),
        Extension(
            "imgpipe.image._jpeg_shrink",
            ["imgpipe/image/_jpeg_shrink.c"],
            libraries=["jpeg"],
            extra_compile_args=["-O3", "-Wall"],  # -O3: the vertical resize pass vectorizes
            optional=not REQUIRED,
        ),
    ],
)
