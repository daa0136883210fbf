"""Request and response bodies of the HTTP API, one module per area, kept apart from the
tables.

One naming scheme: ``XCreate`` is the body that creates an X, ``XUpdate`` the body that
changes or replaces one, ``XIn`` any other request body or part of one (an action such as
``AckIn``, a nested input such as ``SpaceIn``), and ``XOut`` every response body or part of
one. :class:`api.schemas.common.Page` wraps the items of a list.
"""
