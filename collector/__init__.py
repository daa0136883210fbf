"""tuneloop collector component."""
