"""Response bodies of the series API (``api/routes/series.py``), kept apart from the tables.

Query results have the shape of the ``data`` object of Prometheus' HTTP API (``resultType``
and ``result``; values as strings, ``NaN``/``+Inf``/``-Inf`` included; times as Unix seconds),
so code that parses Prometheus results can parse these.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

RangeAggregation = Literal[
    "avg", "min", "max", "sum", "count", "last", "quantile", "rate", "increase"
]
"""How ``query_range`` turns each step's samples into one value."""

UnixTime = Annotated[
    int | float, Field(description="Unix seconds; whole seconds as integers", examples=[1709294400])
]
SampleValue = Annotated[
    str,
    Field(
        description="The value as Prometheus writes it, NaN, +Inf and -Inf included",
        examples=["0.5"],
    ),
]
MetricLabels = Annotated[
    dict[str, str],
    Field(
        description="The series' labels, with its metric name as __name__ where it has one",
        examples=[{"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "0"}],
    ),
]


class SeriesOut(BaseModel):
    metric: str
    labels: dict[str, str]
    kind: Literal["gauge", "counter"]


class SeriesListOut(BaseModel):
    series: list[SeriesOut] = Field(description="Ordered by metric name, then creation")


class MatrixSeriesOut(BaseModel):
    metric: MetricLabels
    values: list[tuple[UnixTime, SampleValue]]


class MatrixOut(BaseModel):
    """One series of points per matching series, as Prometheus' range query result."""

    resultType: Literal["matrix"] = "matrix"
    result: list[MatrixSeriesOut]


class VectorSampleOut(BaseModel):
    metric: MetricLabels
    value: tuple[UnixTime, SampleValue]


class VectorOut(BaseModel):
    """One sample per matching series, as Prometheus' instant query result."""

    resultType: Literal["vector"] = "vector"
    result: list[VectorSampleOut]
