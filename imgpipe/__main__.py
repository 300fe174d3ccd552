"""``python -m imgpipe``."""

from imgpipe.cli import main

main()
