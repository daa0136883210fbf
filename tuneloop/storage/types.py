"""Column types that behave the same on PostgreSQL and SQLite."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, Integer
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

INTEGER_MAX = 2**31 - 1
"""The largest value of an INTEGER column: most ids, versions and counts."""

BIGINT_MAX = 2**63 - 1
"""The largest value of a BIGINT column (and of an offset PostgreSQL accepts)."""


def row_id(ref: str) -> int | None:
    """The id ``ref`` names when it is all ASCII digits and fits an id column, else ``None``.

    ``str.isdigit`` alone is true for '²' or Arabic-Indic digits, which ``int`` then refuses or
    reads as another number; and a longer number would overflow the column.
    """
    if not (ref.isascii() and ref.isdigit()):
        return None
    value = int(ref)
    return value if value <= INTEGER_MAX else None


# SQLite only auto-increments a column declared exactly INTEGER PRIMARY KEY.
BigIntPK = BigInteger().with_variant(Integer(), "sqlite")

# JSONB on PostgreSQL so label sets can be indexed and matched by containment.
LabelsJSON = JSON().with_variant(JSONB(), "postgresql")


def to_micros(value: datetime) -> int:
    """Microseconds since the Unix epoch, exact (no float rounding)."""
    if value.tzinfo is None:
        raise ValueError("naive datetime: tuneloop timestamps must be timezone-aware")
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(value: int) -> datetime:
    return datetime.fromtimestamp(value // 1_000_000, tz=UTC).replace(microsecond=value % 1_000_000)


class UTCDateTime(TypeDecorator[datetime]):
    """An aware UTC timestamp.

    PostgreSQL stores ``timestamptz`` (so partitions, Grafana macros and ``date_bin`` work);
    SQLite stores integer microseconds since the epoch, which sort and compare numerically.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(BigInteger())
        return dialect.type_descriptor(DateTime(timezone=True))

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: tuneloop timestamps must be timezone-aware")
        if dialect.name == "sqlite":
            return to_micros(value)
        return value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, int):
            return from_micros(value)
        assert isinstance(value, datetime)
        return value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)
