"""Imports every command module so each registers itself on the app."""
