"""Whether this install has imgpipe's C extensions over libjpeg-turbo, what to do when it has not, and
one warning per process when the torch loader would decode without its region decoder (docs/install.md).
"""

from __future__ import annotations

import functools
import logging

logger = logging.getLogger(__name__)

HEADER_PACKAGES = "Debian/Ubuntu libjpeg62-turbo-dev or libjpeg-turbo8-dev, RHEL/Fedora libjpeg-turbo-devel, conda-forge libjpeg-turbo"
INSTALL_FIX = (
    "install imgpipe's manylinux wheel (libjpeg-turbo inside; `make wheel` builds it), or install a C compiler and "
    f"libjpeg-turbo's headers ({HEADER_PACKAGES}) and reinstall imgpipe from source"
)


def region_decoder_problem() -> str | None:
    """None when ``imgpipe.image._jpeg_region`` imports; else why not (not built, or its libjpeg missing)."""
    try:
        import imgpipe.image._jpeg_region  # noqa: F401
    except ImportError as e:
        return str(e)
    return None


@functools.cache
def warn_if_no_region_decoder() -> None:
    """Log one WARNING, the first time in this process, when the region decoder cannot be imported."""
    problem = region_decoder_problem()
    if problem is not None:
        logger.warning(
            "imgpipe's region decoder (imgpipe.image._jpeg_region) cannot be imported (%s): the torch loader decodes "
            "whole JPEGs instead, at about 1.3x the CPU per image; %s",
            problem,
            INSTALL_FIX,
        )
