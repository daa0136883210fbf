"""``python -m tuneloop`` is the ``tuneloop`` command."""

from tuneloop.cli import main

main()
