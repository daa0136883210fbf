"""Plain functions behind the API routes that are not account management (see
``tuneloop.accounts`` for projects, tokens and the audit log)."""
