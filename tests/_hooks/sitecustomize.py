"""Installs the test hooks of ``faults.py`` in a process started with this folder on PYTHONPATH (see ``faults.hook_env``)."""

import faults

faults.install()
