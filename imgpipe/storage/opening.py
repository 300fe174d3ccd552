"""The byte source of a location: a local folder, or a folder at a URL."""

from __future__ import annotations

import os

from imgpipe.errors import DatasetError
from imgpipe.storage.local import LocalSource
from imgpipe.storage.source import URL_SCHEMES, ByteSource, url_scheme


def open_source(location: str | os.PathLike) -> ByteSource:
    """The byte source of a folder: a URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``) or a local path."""
    scheme = url_scheme(location)
    if scheme is None:
        return LocalSource(location)
    if scheme not in URL_SCHEMES:
        raise DatasetError(
            f"{location}: unsupported URL scheme {scheme!r}; imgpipe reads {', '.join(s + '://' for s in URL_SCHEMES)} or a local path"
        )
    from imgpipe.storage.objectstore import ObjectStoreSource

    return ObjectStoreSource(str(location))
