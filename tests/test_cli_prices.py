"""``tuneloop prices load FILE`` on both backends: the file's rows become the table of every
scope it names, loading again changes nothing, and a bad file changes nothing and says in one
line which row and field."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from sqlalchemy import Engine
from sqlalchemy.orm import Session
from typer.testing import CliRunner, Result

from tests.api import price_fleet as fleet
from tests.helpers import cli_runner
from tuneloop import accounts, prices
from tuneloop.cli import app

FILE = """\
- {model: "NVIDIA H100*", capacity_type: on_demand, price_per_gpu_hour: 4.10, currency: USD}
- {model: "NVIDIA H100*", capacity_type: spot, price_per_gpu_hour: 1.6, currency: USD}
- model: NVIDIA A100-SXM4-80GB
  price_per_gpu_hour: 3.2
  currency: USD
  project: vision
  valid_from: 2026-12-01T00:00:00Z
"""


@pytest.fixture
def cli(engine: Engine, database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRunner]:
    with Session(engine) as session:
        accounts.create_project(session, "vision")
        session.commit()
    with cli_runner(database_url, monkeypatch) as runner:
        yield runner


def load(cli: CliRunner, tmp_path: Path, text: str) -> Result:
    path = tmp_path / "prices.yaml"
    path.write_text(text)
    return cli.invoke(app, ["prices", "load", str(path)])


def table(engine: Engine) -> list[tuple[str | None, str, str, Decimal]]:
    with Session(engine) as session:
        vision = accounts.get_project_by_name(session, "vision")
        assert vision is not None
        rows = [*prices.list_prices(session, None), *prices.list_prices(session, vision.id)]
        return [
            (
                None if row.project_id is None else "vision",
                row.model,
                row.capacity_type,
                prices.as_price(row).price_per_gpu_hour,
            )
            for row in rows
        ]


EXPECTED = [
    (None, "NVIDIA H100*", "on_demand", Decimal("4.100000")),
    (None, "NVIDIA H100*", "spot", Decimal("1.600000")),
    ("vision", "NVIDIA A100-SXM4-80GB", "on_demand", Decimal("3.200000")),
]


def test_load_replaces_the_scopes_it_names(cli: CliRunner, engine: Engine, tmp_path: Path) -> None:
    result = load(cli, tmp_path, FILE)
    assert result.exit_code == 0, result.output
    assert "3 prices, 0 host capacity types (server-wide, vision)" in result.output
    assert table(engine) == EXPECTED
    assert load(cli, tmp_path, FILE).exit_code == 0
    assert table(engine) == EXPECTED, "loading again changes nothing"

    only_spot = (
        '- {model: "NVIDIA H100*", capacity_type: spot, price_per_gpu_hour: 2, currency: USD}\n'
    )
    assert load(cli, tmp_path, only_spot).exit_code == 0
    assert table(engine) == [
        (None, "NVIDIA H100*", "spot", Decimal("2.000000")),
        EXPECTED[2],  # vision is not named: its rows stay
    ]


@pytest.mark.parametrize(
    ("row", "said"),
    [
        ("{model: x, price_per_gpu_hour: -1, currency: USD}", "row 2: price_per_gpu_hour:"),
        ("{model: x, price_per_gpu_hour: 1, currency: usd}", "row 2: currency: currency must be"),
        (
            "{model: x, capacity_type: preemptible, price_per_gpu_hour: 1, currency: USD}",
            "row 2: capacity_type: Input should be 'on_demand', 'spot' or 'reserved'",
        ),
        ("{model: x, price_per_gpu_hour: 1}", "row 2: currency: Field required"),
        ("{model: x, price_per_gpu_hour: 1, currency: USD, gpu: 0}", "row 2: gpu:"),
        ("{model: x, price_per_gpu_hour: 1, currency: USD, project: nope}", "'nope' does not"),
        ("{host: node-1, capacity_type: cheap}", "row 2: capacity_type: Input should be"),
        ("{host: '', capacity_type: spot}", "row 2: host: host must be 1 to 253"),
        ("[unclosed", "prices.yaml:"),
    ],
)
def test_a_bad_file_changes_nothing_and_says_where(
    cli: CliRunner, engine: Engine, tmp_path: Path, row: str, said: str
) -> None:
    assert load(cli, tmp_path, FILE).exit_code == 0
    good = '- {model: "*", price_per_gpu_hour: 1, currency: USD}\n'
    result = load(cli, tmp_path, f"{good}- {row}\n")
    assert result.exit_code == 1
    assert said in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert table(engine) == EXPECTED


def test_the_documented_example_loads(cli: CliRunner) -> None:
    result = cli.invoke(app, ["prices", "load", "docs/examples/prices.yml"])
    assert result.exit_code == 0, result.output
    assert "7 prices, 1 host capacity types (server-wide, vision)" in result.output


def test_cost_shows_money_next_to_gpu_hours(cli: CliRunner, engine: Engine, tmp_path: Path) -> None:
    with Session(engine) as session:
        vision = accounts.get_project_by_name(session, "vision")
        assert vision is not None
        fleet.fill(engine, vision.id)
    # node-1's GPUs without a capacity_type label are spot: the L4 has no spot price.
    rows = [*fleet.GLOBAL_PRICES, {"host": "node-1", "capacity_type": "spot"}]
    assert load(cli, tmp_path, yaml.safe_dump(rows)).exit_code == 0
    args = ["cost", "vision", "--start", "2026-11-25T09:00:00Z", "--end", "2026-11-25T10:00:00Z"]

    result = cli.invoke(app, args)

    assert result.exit_code == 0, result.output
    lines = [line.split() for line in result.stdout.splitlines()]
    assert lines == [
        ["team", "gpus", "gpu_hours", "idle_gpu_hours", "energy_kwh", "cost_USD", "idle_cost_USD"],
        ["nlp", "3", "3.000", "1.000", "0.000", "4.50", "1.50"],  # the H100 at 1.50 spot
        ["infer", "1", "1.000", "0.000", "0.000", "?", "?"],
        ["vision", "1", "1.000", "1.000", "0.000", "1.50", "1.50"],
        ["(total)", "5", "5.000", "2.000", "0.000", "?", "?"],
    ]
    assert "no price: node-1/2/GPU-l4 (NVIDIA L4, spot)" in result.stderr
    bad = cli.invoke(app, [*args[:3], "yesterday"])
    assert bad.exit_code == 2 and "--start" in bad.output


def test_cost_says_it_needs_the_built_in_store(cli: CliRunner) -> None:
    result = cli.invoke(
        app,
        ["cost", "vision", "--start", "0"],
        env={"TUNELOOP_TSDB_URL": "http://127.0.0.1:9/"},
    )
    assert result.exit_code == 2 and "TUNELOOP_TSDB_URL" in result.output
