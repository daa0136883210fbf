"""tuneloop tuner component."""
