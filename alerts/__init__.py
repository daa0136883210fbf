"""tuneloop alerts component."""
