"""Bounds on the numbers a user gives that more than one layer checks (pack, train, the loaders)."""

from __future__ import annotations

MAX_SEED = 2**32 - 1  # the range of a user's seed (pack and train): numpy's global generator takes words below 2**32
