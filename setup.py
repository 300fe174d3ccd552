"""The optional C extensions over libjpeg-turbo: the loaders' region decoder and pack's JPEG shrinker
and scan check (everything else is in pyproject.toml).

It builds where a C compiler and libjpeg-turbo's headers are found (``libjpeg-turbo8-dev`` or
``libjpeg62-turbo-dev`` on Debian/Ubuntu, ``libjpeg-turbo-devel`` on RHEL, ``libjpeg-turbo``
from conda-forge); elsewhere the install goes on without them: the torch loader decodes whole
JPEGs with torchvision, ``pack --resize`` resizes with Pillow, and pack checks the JPEGs it keeps
with Pillow's whole decode.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "imgpipe.image._jpeg_region",
            ["imgpipe/image/_jpeg_region.c"],
            libraries=["jpeg"],
            extra_compile_args=["-O2", "-Wall"],
            optional=True,
        ),
        Extension(
            "imgpipe.image._jpeg_shrink",
            ["imgpipe/image/_jpeg_shrink.c"],
            libraries=["jpeg"],
            extra_compile_args=["-O3", "-Wall"],  # -O3: the vertical resize pass vectorizes
            optional=True,
        ),
    ]
)
