"""Series lookup, range queries and latest values on real SQLite and real PostgreSQL."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, delete, func, insert, select, text

from tuneloop.storage.models import Project, Series, samples
from tuneloop.storage.timeseries.partitions import list_partitions
from tuneloop.storage.timeseries.query import (
    MAX_POINTS_PER_SERIES,
    find_series,
    latest,
    latest_statement,
    query_range,
)
from tuneloop.storage.timeseries.types import Aggregation, Matcher, MatchOp, SeriesBatch
from tuneloop.storage.timeseries.writer import SampleWriter
from tuneloop.storage.types import from_micros, to_micros

T0 = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)
METRIC = "DCGM_FI_DEV_GPU_UTIL"
HOSTILE = "'; DROP TABLE series; --"
QUOTES = 'it\'s "quoted"; \\ back'

Points = Sequence[tuple[datetime, float]]


def make_project(engine: Engine, name: str = "p") -> int:
    with engine.begin() as connection:
        key = connection.execute(insert(Project).values(name=name)).inserted_primary_key
    assert key is not None
    return int(key[0])


def write(
    engine: Engine, project_id: int, labels: Mapping[str, str], points: Points, metric: str = METRIC
) -> None:
    batch = SeriesBatch(metric, labels, [ts for ts, _ in points], [value for _, value in points])
    result = SampleWriter(engine).write(project_id, [batch])
    assert not result.rejected


def at(*offsets_s: float) -> list[datetime]:
    return [T0 + timedelta(seconds=offset) for offset in offsets_s]


def query(engine: Engine, project_id: int, **kwargs: object) -> list[list[tuple[datetime, float]]]:
    defaults: dict[str, object] = {"start": T0, "end": T0 + timedelta(minutes=2), "step_s": 60}
    found = query_range(engine, project_id, METRIC, **(defaults | kwargs))  # type: ignore[arg-type]
    return [series.points for series in found]


# --------------------------------------------------------------------------- range queries


def test_buckets_align_to_epoch_multiples_of_step(engine: Engine) -> None:
    project = make_project(engine)
    times = at(-400, -1, 0, 5, 59, 60, 61, 299.5, 300, 3599, 3600, 4000)
    write(engine, project, {"gpu": "0"}, [(ts, 1.0) for ts in times])
    start, end = T0 + timedelta(seconds=3), T0 + timedelta(seconds=3600)

    for step_s in (7, 60, 300, 3600):
        step_us = step_s * 1_000_000
        expected: dict[datetime, float] = defaultdict(float)
        for ts in times:
            if start <= ts < end:
                expected[from_micros(to_micros(ts) // step_us * step_us)] += 1.0

        (points,) = query(
            engine, project, start=start, end=end, step_s=step_s, aggregation=Aggregation.COUNT
        )

        assert points == sorted(expected.items()), step_s
        assert all(to_micros(ts) % step_us == 0 for ts, _ in points), step_s
        if step_s % 60 == 0:
            # The first bucket starts before `start`, at an epoch multiple, as Grafana's
            # $__timeGroup does, and holds only the samples from `start` on.
            assert points[0][0] == T0, step_s


# Bucket T0: 1, 5, 3 at +0, +10, +20 s. Bucket T0+60: 8 at +70, 2 at +60, written in that
# order so that "last" must follow timestamps, not insertion order.
AGGREGATION_CASES = [
    (Aggregation.AVG, None, [3.0, 5.0]),
    (Aggregation.MIN, None, [1.0, 2.0]),
    (Aggregation.MAX, None, [5.0, 8.0]),
    (Aggregation.SUM, None, [9.0, 10.0]),
    (Aggregation.COUNT, None, [3.0, 2.0]),
    (Aggregation.LAST, None, [3.0, 8.0]),
    (Aggregation.QUANTILE, 0.5, [3.0, 5.0]),
    (Aggregation.QUANTILE, 0.25, [2.0, 3.5]),
    (Aggregation.QUANTILE, 0.0, [1.0, 2.0]),
    (Aggregation.QUANTILE, 1.0, [5.0, 8.0]),
]


def test_each_aggregation_matches_hand_computed_values(engine: Engine) -> None:
    project = make_project(engine)
    times = at(0, 10, 20, 70, 60)
    write(engine, project, {"gpu": "0"}, list(zip(times, [1.0, 5.0, 3.0, 8.0, 2.0], strict=True)))

    for aggregation, q, expected in AGGREGATION_CASES:
        (points,) = query(engine, project, aggregation=aggregation, q=q)

        assert [ts for ts, _ in points] == [T0, T0 + timedelta(minutes=1)]
        assert [value for _, value in points] == pytest.approx(expected), (aggregation, q)


def test_quantile_interpolates_linearly_on_both_backends(engine: Engine) -> None:
    project = make_project(engine)
    values = [10.0, 1.0, 4.0, 2.0, 3.0]
    write(engine, project, {"gpu": "0"}, list(zip(at(1, 2, 3, 4, 5), values, strict=True)))

    # Same numbers as PostgreSQL's percentile_cont: sorted [1, 2, 3, 4, 10], interpolated.
    for q, expected in [(0.5, 3.0), (0.9, 7.6), (0.1, 1.4), (0.99, 9.76)]:
        (points,) = query(engine, project, aggregation=Aggregation.QUANTILE, q=q)
        assert [ts for ts, _ in points] == [T0]
        assert points[0][1] == pytest.approx(expected), q


def test_series_without_samples_in_range_are_left_out(engine: Engine) -> None:
    project = make_project(engine)
    write(engine, project, {"gpu": "0"}, [(T0, 1.0)])
    write(engine, project, {"gpu": "1"}, [(T0 - timedelta(hours=1), 1.0)])

    found = query_range(
        engine, project, METRIC, start=T0, end=T0 + timedelta(minutes=1), step_s=60,
        aggregation=Aggregation.MAX,
    )  # fmt: skip

    assert [series.series.labels for series in found] == [{"gpu": "0"}]


BAD_QUERIES: list[tuple[dict[str, object], str]] = [
    ({"end": T0}, "must be after start"),
    ({"end": T0 - timedelta(seconds=1)}, "must be after start"),
    ({"step_s": 0}, "step_s must be a positive"),
    ({"step_s": -60}, "step_s must be a positive"),
    ({"aggregation": Aggregation.QUANTILE}, r"quantile needs q in \[0, 1\]"),
    ({"aggregation": Aggregation.QUANTILE, "q": 1.5}, r"quantile needs q in \[0, 1\]"),
    ({"aggregation": Aggregation.QUANTILE, "q": -0.1}, r"quantile needs q in \[0, 1\]"),
    ({"q": 0.5}, "q is only meaningful for quantile"),
    ({"end": T0 + timedelta(days=2), "step_s": 15}, "more than 11000"),
    ({"start": datetime(2024, 3, 1), "end": datetime(2024, 3, 2)}, "naive datetime"),
    ({"end": datetime(2024, 3, 2)}, "naive datetime"),
]


def test_bad_queries_raise_value_error(engine: Engine) -> None:
    project = make_project(engine)
    for kwargs, message in BAD_QUERIES:
        with pytest.raises(ValueError, match=message):
            query(engine, project, **({"aggregation": Aggregation.AVG} | kwargs))


def test_bucket_cap_allows_exactly_the_limit(engine: Engine) -> None:
    project = make_project(engine)
    end = T0 + timedelta(seconds=MAX_POINTS_PER_SERIES)
    assert query(engine, project, end=end, step_s=1, aggregation=Aggregation.AVG) == []


def test_range_over_partition_boundary_returns_every_sample_once(engine: Engine) -> None:
    project = make_project(engine)
    midnight = datetime(2024, 3, 2, tzinfo=UTC)
    times = [midnight + timedelta(seconds=15 * i) for i in range(-40, 40)]
    write(engine, project, {"gpu": "0"}, [(ts, float(i)) for i, ts in enumerate(times)])
    if engine.dialect.name == "postgresql":
        with engine.connect() as connection:
            names = {partition.name for partition in list_partitions(connection)}
        assert {"samples_p20240301", "samples_p20240302"} <= names

    start, end = times[0], times[-1] + timedelta(seconds=1)
    (per_sample,) = query(
        engine, project, start=start, end=end, step_s=1, aggregation=Aggregation.COUNT
    )
    (per_minute,) = query(
        engine, project, start=start, end=end, step_s=60, aggregation=Aggregation.SUM
    )

    assert per_sample == [(ts, 1.0) for ts in times]
    assert sum(value for _, value in per_minute) == sum(range(80))
    (newest,) = latest(engine, project, METRIC)
    assert (newest.ts, newest.value) == (times[-1], 79.0)


def test_series_of_other_projects_and_metrics_are_not_read(engine: Engine) -> None:
    mine, theirs = make_project(engine, "mine"), make_project(engine, "theirs")
    write(engine, mine, {"gpu": "0"}, [(T0, 1.0)])
    write(engine, theirs, {"gpu": "0"}, [(T0, 100.0)])
    write(engine, mine, {"gpu": "0"}, [(T0, 1000.0)], metric="other")

    assert query(engine, mine, aggregation=Aggregation.SUM) == [[(T0, 1.0)]]


# --------------------------------------------------------------------------- label matching

LABEL_SETS: list[dict[str, str]] = [
    {"gpu": "0", "host": "node-1"},
    {"gpu": "1", "host": "node-2"},
    {"gpu": "10"},
    {"gpu": "2", "host": HOSTILE},
    {"gpu": "3", "host": QUOTES},
]
A, B, C, D, E = range(5)

MATCH_CASES: list[tuple[list[Matcher], set[int]]] = [
    ([], {A, B, C, D, E}),
    ([Matcher("gpu", MatchOp.EQ, "1")], {B}),
    ([Matcher("gpu", MatchOp.NE, "1")], {A, C, D, E}),
    ([Matcher("gpu", MatchOp.RE, "1")], {B}),  # anchored: not "10"
    ([Matcher("gpu", MatchOp.RE, "1.*")], {B, C}),
    ([Matcher("gpu", MatchOp.RE, "0|2")], {A, D}),  # alternation stays inside the anchors
    ([Matcher("gpu", MatchOp.NRE, "1.*")], {A, D, E}),
    ([Matcher("host", MatchOp.EQ, "")], {C}),  # a missing label equals ""
    ([Matcher("host", MatchOp.NE, "")], {A, B, D, E}),
    ([Matcher("host", MatchOp.RE, "")], {C}),
    ([Matcher("host", MatchOp.RE, ".*")], {A, B, C, D, E}),
    ([Matcher("host", MatchOp.RE, ".+")], {A, B, D, E}),
    ([Matcher("host", MatchOp.NRE, "node-.*")], {C, D, E}),
    ([Matcher("host", MatchOp.RE, "node-.*"), Matcher("gpu", MatchOp.NE, "0")], {B}),
    ([Matcher("host", MatchOp.EQ, HOSTILE)], {D}),
    ([Matcher("host", MatchOp.NE, HOSTILE)], {A, B, C, E}),
    ([Matcher("host", MatchOp.RE, re.escape(HOSTILE))], {D}),
    ([Matcher("host", MatchOp.NRE, ".*DROP.*")], {A, B, C, E}),
    ([Matcher("host", MatchOp.EQ, QUOTES)], {E}),
    ([Matcher("host", MatchOp.RE, '.*".*')], {E}),
    ([Matcher("zone", MatchOp.EQ, "")], {A, B, C, D, E}),
    ([Matcher("zone", MatchOp.EQ, "x")], set()),
    ([Matcher(HOSTILE, MatchOp.EQ, "")], {A, B, C, D, E}),
    ([Matcher(HOSTILE, MatchOp.NE, "")], set()),
    ([Matcher("__name__", MatchOp.RE, "DCGM_.*")], {A, B, C, D, E}),
]


def test_label_matching_with_all_four_operators(engine: Engine) -> None:
    project = make_project(engine)
    other = make_project(engine, "other")
    for labels in LABEL_SETS:
        write(engine, project, labels, [(T0, 1.0)])
        write(engine, other, labels, [(T0, 1.0)])
    write(engine, project, {"gpu": "1"}, [(T0, 1.0)], metric="other_metric")

    for matchers, expected in MATCH_CASES:
        found = find_series(engine, project, METRIC, matchers)
        assert sorted(sorted(info.labels.items()) for info in found) == sorted(
            sorted(LABEL_SETS[index].items()) for index in expected
        ), matchers

    with engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(Series)).scalar_one() == 11


def test_find_series_without_metric_and_odd_label_names(engine: Engine) -> None:
    project = make_project(engine)
    write(engine, project, {'we"ird': "v", "dotted.name": "d"}, [(T0, 1.0)], metric="odd")
    write(engine, project, {"gpu": "0"}, [(T0, 1.0)])

    assert [s.metric for s in find_series(engine, project, None)] == [METRIC, "odd"]
    for name, value in [('we"ird', "v"), ("dotted.name", "d")]:
        (info,) = find_series(engine, project, None, [Matcher(name, MatchOp.EQ, value)])
        assert info.metric == "odd"


def test_invalid_regex_is_a_value_error(engine: Engine) -> None:
    project = make_project(engine)
    with pytest.raises(ValueError, match="invalid regular expression '\\(' for label 'gpu'"):
        find_series(engine, project, METRIC, [Matcher("gpu", MatchOp.RE, "(")])


def test_regex_only_postgresql_rejects_is_a_value_error(engine: Engine) -> None:
    project = make_project(engine)
    write(engine, project, {"gpu": "0"}, [(T0, 1.0)])
    # Python's named group syntax, which PostgreSQL's ARE engine does not know.
    matchers = [Matcher("gpu", MatchOp.RE, "(?P<n>0)")]
    if engine.dialect.name == "postgresql":
        with pytest.raises(ValueError, match="invalid regular expression"):
            find_series(engine, project, METRIC, matchers)
    else:
        assert len(find_series(engine, project, METRIC, matchers)) == 1


# --------------------------------------------------------------------------- latest


def test_latest_per_series(engine: Engine) -> None:
    project = make_project(engine)
    write(engine, project, {"gpu": "0"}, list(zip(at(0, 30, 10), [1.0, 2.0, 3.0], strict=True)))
    write(engine, project, {"gpu": "1"}, [(T0 - timedelta(days=3), 7.0)])
    write(engine, project, {"gpu": "2"}, [(T0 + timedelta(days=2), 9.0)])
    with engine.begin() as connection:  # a series that never got a sample
        connection.execute(
            insert(Series).values(project_id=project, metric=METRIC, labels={"gpu": "9"},
                                  fingerprint="f" * 32, kind="gauge")
        )  # fmt: skip

    newest = {s.series.labels["gpu"]: (s.ts, s.value) for s in latest(engine, project, METRIC)}
    recent = latest(engine, project, METRIC, since=T0 - timedelta(days=1))
    matched = latest(engine, project, None, [Matcher("gpu", MatchOp.RE, "[01]")])

    assert newest == {
        "0": (T0 + timedelta(seconds=30), 2.0),
        "1": (T0 - timedelta(days=3), 7.0),
        "2": (T0 + timedelta(days=2), 9.0),
    }
    assert sorted(s.series.labels["gpu"] for s in recent) == ["0", "2"]
    assert sorted(s.series.labels["gpu"] for s in matched) == ["0", "1"]


def test_latest_probes_the_index_instead_of_scanning(engine: Engine) -> None:
    project = make_project(engine)
    days = [T0 - timedelta(days=d) for d in range(3)]
    for gpu in range(50):
        write(engine, project, {"gpu": str(gpu)}, [(day, 0.0) for day in days])
    _bulk_fill(engine, days[-1], days[0])
    with engine.connect() as connection:
        statement = latest_statement(connection.dialect.name, project, METRIC)
        compiled = statement.compile(dialect=connection.dialect)
        prefix = "EXPLAIN " if connection.dialect.name == "postgresql" else "EXPLAIN QUERY PLAN "
        params = compiled.params
        if compiled.positiontup is not None:  # SQLite's qmark style binds by position
            params = tuple(params[name] for name in compiled.positiontup)
        rows = connection.exec_driver_sql(prefix + str(compiled), params).all()
    plan = "\n".join(str(row[-1]) for row in rows)

    if engine.dialect.name == "postgresql":
        assert "Index Scan Backward" in plan, plan
        assert "Seq Scan on samples" not in plan, plan
    else:
        assert re.search(r"SEARCH newest_sample USING (COVERING )?INDEX ix_samples_series_ts", plan)
        assert "SEARCH samples USING INTEGER PRIMARY KEY (rowid=?)" in plan, plan
        assert not re.search(r"SCAN (newest_sample|samples)\b", plan), plan


def _bulk_fill(engine: Engine, first: datetime, last: datetime) -> None:
    """Enough rows (one per series and minute over days) that a scan would be costly."""
    with engine.begin() as connection:
        connection.execute(delete(samples))
        if connection.dialect.name == "postgresql":
            connection.execute(
                text(
                    "INSERT INTO samples SELECT s.id, t, 1.0 FROM series s, "
                    "generate_series(CAST(:first AS timestamptz), :last, '1 minute') t"
                ),
                {"first": first, "last": last},
            )
            connection.execute(text("ANALYZE samples"))
        else:
            connection.execute(
                text(
                    "WITH RECURSIVE t(x) AS (SELECT :first UNION ALL SELECT x + 60000000 "
                    "FROM t WHERE x < :last) "
                    "INSERT INTO samples SELECT s.id, t.x, 1.0 FROM series s, t"
                ),
                {"first": to_micros(first), "last": to_micros(last)},
            )
            connection.execute(text("ANALYZE"))
