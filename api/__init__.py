"""tuneloop api component."""
