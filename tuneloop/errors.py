"""The errors tuneloop raises on purpose, in two kinds: temporary (retrying later may
succeed: the database is away, a queue is full) and permanent (the same request fails the
same way until someone changes it). Components subclass the kind their error is, the API maps
the kinds to HTTP answers in one place (``api/errors.py``), and a retry loop decides by class,
never by message. ``str()`` of each is a one-line message safe to show to the caller."""

from __future__ import annotations


class TuneloopError(Exception):
    """Base of every error below."""


class TemporaryError(TuneloopError):
    """Retrying later may succeed; nothing of the request was kept."""

    retry_after_s: float = 5.0
    """How long a caller should wait before retrying (HTTP ``Retry-After``)."""


class PermanentError(TuneloopError):
    """Retrying the same request fails the same way; someone has to change something."""


class InvalidInput(PermanentError, ValueError):
    """A name, value or configuration that tuneloop does not accept."""


class NotFound(PermanentError):
    """The thing does not exist, or the caller may not know that it exists."""


class Conflict(PermanentError):
    """The thing already exists (a unique name is taken), or changed under the caller."""


class PermissionDenied(PermanentError):
    """The caller is known and sees the thing, but its role does not allow the action."""


class Unavailable(TemporaryError):
    """A service tuneloop depends on (the database, the store, a queue) cannot take the
    request now."""
