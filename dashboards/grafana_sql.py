"""What Grafana does to a PostgreSQL panel query before it reaches the database.

Two passes, as in Grafana 11:

1. the frontend's template service replaces ``$var``, ``${var}``, ``${var:format}`` and
   ``[[var]]`` (builtins ``$__interval``, ``$__interval_ms``, ``$__from``, ``$__to``
   included); a variable used without a format goes through the SQL data source's
   ``interpolateVariable``: a multi-value or include-all variable becomes quoted literals
   joined by ``,`` with ``'`` doubled, a single-value one is pasted with ``'`` doubled but
   *not* quoted (which is why the dashboards always say ``:sqlstring``);
2. the backend replaces ``$__interval_ms``, ``$__interval``, ``$__timeFrom()``,
   ``$__timeTo()``, ``$__unixEpochFrom()``/``To()``, then expands the macros of
   ``pkg/tsdb/grafana-postgresql-datasource/macros.go`` (``$__timeFilter``,
   ``$__timeGroup``, ``$__timeGroupAlias``, ...) with the same regular expression, so a
   macro's arguments cannot contain ``)``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

# public/app/features/templating/template_srv.ts (variableRegex)
_VARIABLE = re.compile(
    r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\${(\w+)(?:\.([^:^\}]+))?(?::([^\}]+))?}"
)
# macros.go (sExpr)
_MACRO = re.compile(r"\$([_a-zA-Z0-9]+)\(([^\)]*)\)")

# rangeutil.roundInterval: (upper bound exclusive, rounded interval), milliseconds
_ROUNDING = (
    (15, 10), (35, 20), (75, 50), (150, 100), (350, 200), (750, 500), (1_500, 1_000),
    (3_500, 2_000), (7_500, 5_000), (12_500, 10_000), (17_500, 15_000), (25_000, 20_000),
    (45_000, 30_000), (90_000, 60_000), (210_000, 120_000), (450_000, 300_000),
    (750_000, 600_000), (1_050_000, 900_000), (1_500_000, 1_200_000),
    (2_700_000, 1_800_000), (5_400_000, 3_600_000), (9_000_000, 7_200_000),
    (16_200_000, 10_800_000), (32_400_000, 21_600_000), (86_400_000, 43_200_000),
    (604_800_000, 86_400_000), (1_209_600_000, 604_800_000),
    (2_592_000_000, 1_209_600_000),
)  # fmt: skip
_UNITS_MS = (("y", 31_536_000_000), ("w", 604_800_000), ("d", 86_400_000), ("h", 3_600_000),
             ("m", 60_000), ("s", 1_000), ("ms", 1))  # fmt: skip


def round_interval(interval_ms: float) -> int:
    for bound, rounded in _ROUNDING:
        if interval_ms < bound:
            return rounded
    return 2_592_000_000


def interval_text(interval_ms: int) -> str:
    """Grafana's ``secondsToHms``-like text of an interval: ``30s``, ``10m``, ``1h``, ``1d``."""
    for unit, size in _UNITS_MS:
        if interval_ms >= size and interval_ms % size == 0:
            return f"{interval_ms // size}{unit}"
    return f"{interval_ms}ms"


def parse_interval(text: str) -> float:
    """Seconds of a Go ``gtime.ParseInterval`` text (``5m``, ``1h``, ``500ms``, ``1d``)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)", text.strip())
    if match is None:
        raise ValueError(f"error parsing interval {text}")
    seconds = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    return float(match.group(1)) * seconds[match.group(2)]


def rfc3339(moment: datetime) -> str:
    """Go's ``time.RFC3339Nano`` of a UTC time (fraction without trailing zeros)."""
    text = moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    if moment.microsecond:
        text += f".{moment.microsecond:06d}".rstrip("0")
    return text + "Z"


def go_number(value: float) -> str:
    """Go's ``%v`` of a float64 (no exponent below 1e21)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def quote_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


@dataclass(frozen=True)
class Variable:
    """A dashboard variable's current value(s) and how it is declared."""

    value: str | Sequence[str]
    multi: bool = False
    include_all: bool = False


@dataclass
class GrafanaQuery:
    """The time range, interval and variables one panel query is expanded with."""

    start: datetime
    end: datetime
    variables: Mapping[str, Variable] = field(default_factory=dict)
    interval_ms: int | None = None
    """``None``: as Grafana computes it, from the range and ``max_data_points``."""
    max_data_points: int = 1_000
    rate_interval: str = "1m"
    """``$__rate_interval`` (Grafana: at least four scrape intervals)."""

    @property
    def interval(self) -> int:
        if self.interval_ms is not None:
            return self.interval_ms
        span_ms = (self.end - self.start).total_seconds() * 1000
        return round_interval(span_ms / self.max_data_points)

    def expand(self, sql: str) -> str:
        """A PostgreSQL panel query as the database receives it."""
        return self._macros(self._globals(self._template(sql, _format)))

    def expand_promql(self, expr: str) -> str:
        """A Prometheus panel query as Prometheus receives it."""
        return self._template(expr, _format_promql)

    # ------------------------------------------------------------------ pass 1: frontend

    def _template(self, sql: str, formatter: Callable[[Variable, str | None], str]) -> str:
        builtins = {
            "__rate_interval": self.rate_interval,
            "__interval": interval_text(self.interval),
            "__interval_ms": str(self.interval),
            "__from": str(int(self.start.timestamp() * 1000)),
            "__to": str(int(self.end.timestamp() * 1000)),
        }

        def replace(match: re.Match[str]) -> str:
            name = match.group(1) or match.group(2) or match.group(4)
            fmt = match.group(3) or match.group(6)
            if name in builtins:
                return builtins[name]
            variable = self.variables.get(name)
            if variable is None:
                return match.group(0)  # not a variable: left for the backend or as text
            return formatter(variable, fmt)

        return _VARIABLE.sub(replace, sql)

    # ------------------------------------------------------------------ pass 2: backend

    def _globals(self, sql: str) -> str:
        sql = sql.replace("$__interval_ms", str(self.interval))
        sql = sql.replace("$__interval", interval_text(self.interval))
        sql = sql.replace("$__unixEpochFrom()", str(int(self.start.timestamp())))
        return sql.replace("$__unixEpochTo()", str(int(self.end.timestamp())))

    def _macros(self, sql: str) -> str:
        original = sql

        def replace(match: re.Match[str]) -> str:
            name, raw_args = match.group(1), match.group(2)
            if name == "__timeGroup":
                # Pre-5.3 compatibility: a comma right after the call means "alias it".
                index = original.find(match.group(0))
                end = index + len(match.group(0))
                if index >= 0 and end < len(original) and original[end] == ",":
                    name = "__timeGroupAlias"
            args = [arg.strip(" ") for arg in raw_args.split(",")]
            return self._macro(name, args)

        return _MACRO.sub(replace, sql)

    def _macro(self, name: str, args: list[str]) -> str:
        start, end = rfc3339(self.start), rfc3339(self.end)
        if name == "__time":
            return f'{args[0]} AS "time"'
        if name == "__timeEpoch":
            return f'extract(epoch from {args[0]}) as "time"'
        if name == "__timeFilter":
            return f"{args[0]} BETWEEN '{start}' AND '{end}'"
        if name == "__timeFrom":
            return f"'{start}'"
        if name == "__timeTo":
            return f"'{end}'"
        if name in ("__timeGroup", "__timeGroupAlias"):
            if len(args) < 2:
                raise ValueError(f"macro {name} needs time column and interval")
            seconds = go_number(parse_interval(args[1].strip("'")))
            group = f"floor(extract(epoch from {args[0]})/{seconds})*{seconds}"
            return group + (' AS "time"' if name == "__timeGroupAlias" else "")
        if name == "__unixEpochFilter":
            lo, hi = int(self.start.timestamp()), int(self.end.timestamp())
            return f"{args[0]} >= {lo} AND {args[0]} <= {hi}"
        raise ValueError(f"unknown macro {name!r}")


def _format(variable: Variable, fmt: str | None) -> str:
    values = [variable.value] if isinstance(variable.value, str) else list(variable.value)
    if fmt is None:
        # SqlDatasource.interpolateVariable
        if isinstance(variable.value, str):
            if variable.multi or variable.include_all:
                return quote_literal(variable.value)
            return variable.value.replace("'", "''")
        return ",".join(quote_literal(value) for value in values)
    if fmt == "sqlstring":
        return ",".join(quote_literal(value) for value in values)
    if fmt == "csv":
        return ",".join(values)
    if fmt == "raw":
        return ",".join(values)
    if fmt == "singlequote":
        return ",".join("'" + value.replace("'", "\\'") + "'" for value in values)
    raise ValueError(f"format {fmt!r} is not supported by this expander")


def _format_promql(variable: Variable, fmt: str | None) -> str:
    """The Prometheus data source's ``interpolateQueryExpr``: multi-value and include-all
    variables become an escaped regular-expression alternation."""
    if fmt is not None:
        return _format(variable, fmt)
    if not variable.multi and not variable.include_all:
        value = variable.value if isinstance(variable.value, str) else ",".join(variable.value)
        return value.replace("\\", "\\\\").replace("'", "\\\\'")
    values = [variable.value] if isinstance(variable.value, str) else list(variable.value)
    escaped = [
        re.sub(r"[$^*{}\[\]'+?.()|]", lambda m: "\\\\" + m.group(0), v.replace("\\", "\\\\\\\\"))
        for v in values
    ]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"
