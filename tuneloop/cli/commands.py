"""Imports every command module so each registers itself on the app."""

from tuneloop.cli import serve  # noqa: F401
