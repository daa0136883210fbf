"""``tuneloop store compact`` on both backends: nothing before the rollups have run (and it
says why), then every closed span outside the hot window, one progress line per batch."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine
from typer.testing import CliRunner

from tests.helpers import cli_runner
from tests.storage_compaction.fleet import NOW, counts, fleet, make_project, write
from tuneloop.cli import app
from tuneloop.storage.timeseries.rollups import update_rollups


@pytest.fixture
def cli(database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRunner]:
    with cli_runner(database_url, monkeypatch) as runner:
        yield runner


def test_compact_reports_progress_and_waits_for_the_rollups(engine: Engine, cli: CliRunner) -> None:
    write(engine, make_project(engine), fleet(hours=2))
    total = counts(engine)[0]

    waiting = cli.invoke(app, ["store", "compact", "--hot-window-s", "0"])
    assert waiting.exit_code == 0, waiting.output
    assert "the 1-minute rollups have not run yet" in waiting.output
    assert counts(engine) == (total, 0, 0)

    update_rollups(engine, now=NOW)
    done = cli.invoke(app, ["store", "compact", "--batch-series", "5"])
    assert done.exit_code == 0, done.output
    assert done.output.count("series done") == 3  # 12 series, 5 a batch
    assert f"done: {total} samples into 24 chunks" in done.output
    assert counts(engine) == (0, 24, total)


def test_a_bad_option_is_one_line(cli: CliRunner) -> None:
    result = cli.invoke(app, ["store", "compact", "--batch-series", "0"])
    assert result.exit_code == 2


def test_vacuum_shrinks_a_sqlite_file_and_is_not_needed_on_postgresql(
    engine: Engine, cli: CliRunner
) -> None:
    write(engine, make_project(engine), fleet(hours=2))
    update_rollups(engine, now=NOW)
    done = cli.invoke(app, ["store", "compact", "--vacuum"])
    assert done.exit_code == 0, done.output
    if engine.dialect.name == "sqlite":
        assert "vacuuming: rewriting" in done.output
        given = done.output.split("vacuumed: ")[1].split(" MiB")[0]
        assert float(given) > 0, done.output
        with engine.connect() as connection:
            pages = connection.exec_driver_sql("PRAGMA freelist_count").scalar_one()
        assert pages == 0  # nothing left free in the file
    else:
        assert "reclaimed samples_p" in done.output
        assert "--vacuum: nothing to do on PostgreSQL" in done.output
