"""Runnable examples of tuneloop in use (each folder has its README.md)."""
