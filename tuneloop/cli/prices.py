"""``tuneloop prices load FILE``: the price table from a YAML file (no running API needed).

The file is a list of rows, each as the API takes it (``api.schemas.prices.PriceIn``), with
``project: NAME`` for a project's own row (absent: server-wide); a row with ``host`` gives the
capacity type of that host's GPUs whose series carry no ``capacity_type`` label::

    - {model: "NVIDIA H100*", capacity_type: on_demand, price_per_gpu_hour: 4.10, currency: USD}
    - {model: "NVIDIA H100*", capacity_type: spot, price_per_gpu_hour: 1.60, currency: USD}
    - {model: "NVIDIA H100*", price_per_gpu_hour: 3.20, currency: USD, project: vision}
    - {host: gpu-node-7, capacity_type: spot}

Loading makes the file's rows the whole table of every scope it names (server-wide, and each
project named): loading the same file again changes nothing. All or nothing: a bad row is
reported in one line naming the row and the field, and nothing is changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import yaml
from pydantic import ValidationError

from api.schemas.prices import HostFileRow, PriceFileRow
from tuneloop import prices
from tuneloop.cli import app
from tuneloop.cli.common import db_session, fail, project_or_fail

prices_app = typer.Typer(help="The GPU price table.", no_args_is_help=True)
app.add_typer(prices_app, name="prices")

Row = PriceFileRow | HostFileRow


def read_price_file(path: Path) -> list[Row]:
    """The file's rows, or :func:`fail` with one line naming the row and the field."""
    try:
        loaded = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        fail(f"{path}: {' '.join(str(exc).split())}", 1)
    if not isinstance(loaded, list | None):
        fail(f"{path}: a price file is a list of rows", 1)
    rows: list[Row] = []
    for number, item in enumerate(loaded or [], 1):
        kind = HostFileRow if isinstance(item, dict) and "host" in item else PriceFileRow
        try:
            rows.append(kind.model_validate(item))
        except ValidationError as exc:
            error = exc.errors()[0]
            field = ".".join(str(part) for part in error["loc"]) or "the row"
            message = error["msg"].removeprefix("Value error, ")
            fail(f"{path}: row {number}: {field}: {message}", 1)
    return rows


@prices_app.command("load")
def load(
    file: Annotated[Path, typer.Argument(help="YAML price file", exists=True, dir_okay=False)],
) -> None:
    """Make the file's rows the prices and host capacity types of every scope it names
    (server-wide, projects)."""
    rows = read_price_file(file)
    with db_session() as session:
        scopes: dict[str | None, int | None] = {}
        for row in rows:
            if row.project not in scopes:
                scopes[row.project] = (
                    None if row.project is None else project_or_fail(session, row.project).id
                )
        loaded = prices.replace_prices(
            session,
            scopes.values(),
            [row.to_price(scopes[row.project]) for row in rows if isinstance(row, PriceFileRow)],
            [
                prices.HostAssignment(scopes[row.project], row.host, row.capacity_type)
                for row in rows
                if isinstance(row, HostFileRow)
            ],
        )
    named = ", ".join("server-wide" if name is None else name for name in scopes)
    hosts = len(rows) - loaded
    typer.echo(f"{file}: {loaded} prices, {hosts} host capacity types ({named})")
