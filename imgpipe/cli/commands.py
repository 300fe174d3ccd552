"""Import every command module so that each registers itself on the ``cli`` group (one line each)."""

# ruff: noqa: F401
from imgpipe.cli import bench, data, stage, synth, train
