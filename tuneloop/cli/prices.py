"""``tuneloop prices load FILE``: the price table from a YAML file (no running API needed).

The file is a list of rows, each as the API takes it (``api.schemas.prices.PriceIn``), with
``project: NAME`` for a project's own row (absent: server-wide)::

    - {model: "NVIDIA H100*", capacity_type: on_demand, price_per_gpu_hour: 4.10, currency: USD}
    - {model: "NVIDIA H100*", capacity_type: spot, price_per_gpu_hour: 1.60, currency: USD}
    - {model: "NVIDIA H100*", price_per_gpu_hour: 3.20, currency: USD, project: vision}

Loading makes the file's rows the whole table of every scope it names (server-wide, and each
project named): loading the same file again changes nothing. All or nothing: a bad row is
reported in one line naming the row and the field, and nothing is changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import yaml
from pydantic import TypeAdapter, ValidationError

from api.schemas.prices import PriceFileRow
from tuneloop import prices
from tuneloop.cli import app
from tuneloop.cli.common import db_session, fail, project_or_fail

prices_app = typer.Typer(help="The GPU price table.", no_args_is_help=True)
app.add_typer(prices_app, name="prices")

_ROWS = TypeAdapter(list[PriceFileRow])


def read_price_file(path: Path) -> list[PriceFileRow]:
    """The file's rows, or :func:`fail` with one line naming the row and the field."""
    try:
        loaded = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        fail(f"{path}: {' '.join(str(exc).split())}", 1)
    try:
        return _ROWS.validate_python([] if loaded is None else loaded)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = list(error["loc"])
        row = f"row {int(where.pop(0)) + 1}: " if where and isinstance(where[0], int) else ""
        field = ".".join(str(part) for part in where) or "the file"
        message = error["msg"].removeprefix("Value error, ")
        fail(f"{path}: {row}{field}: {message}", 1)


@prices_app.command("load")
def load(
    file: Annotated[Path, typer.Argument(help="YAML price file", exists=True, dir_okay=False)],
) -> None:
    """Make the file's rows the prices of every scope it names (server-wide, projects)."""
    rows = read_price_file(file)
    with db_session() as session:
        scopes: dict[str | None, int | None] = {}
        for row in rows:
            if row.project is not None and row.project not in scopes:
                scopes[row.project] = project_or_fail(session, row.project).id
            elif row.project is None:
                scopes[None] = None
        loaded = prices.replace_prices(
            session, scopes.values(), [row.to_price(scopes[row.project]) for row in rows]
        )
    named = ", ".join("server-wide" if name is None else name for name in scopes)
    typer.echo(f"{file}: {loaded} prices ({named})")
