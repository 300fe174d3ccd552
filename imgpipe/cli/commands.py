"""Import every command module so that each registers itself on the ``cli`` group."""

from imgpipe.cli import data  # noqa: F401
