"""One module per dashboard, each a function that builds its :class:`~dashboards.board.Board`."""
