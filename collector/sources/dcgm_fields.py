"""dcgm-exporter's counter list (CSV) as typed fields, DCGM field-id lookup and blank sentinels.

The CSV format is dcgm-exporter's: ``DCGM field, Prometheus type, help``; ``#`` starts a comment
line; type ``label`` rows become labels on the other metrics. A copy of dcgm-exporter's default
list ships in ``collector/sources/data`` (see SOURCE.md there for its origin and licence).
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Any

from tuneloop.storage.timeseries.types import SeriesKind

log = logging.getLogger(__name__)

DEFAULT_COUNTERS_RESOURCE = "data/dcgm-default-counters.csv"
DCGM_PREFIX = "DCGM_"
"""Every family dcgm-exporter emits starts so (``DCGM_FI_*`` fields, ``DCGM_EXP_*`` its own)."""

# DCGM's "no value" sentinels (dcgmvalue.py / dcgm_structs.h). DCGM_*_BLANK + 1, + 2, + 3 mean
# not found, not supported, not permissioned; everything at or above the base is a blank.
DCGM_INT32_BLANK = 0x7FFFFFF0
DCGM_INT32_MAX = 0x7FFFFFFF
DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
DCGM_FP64_BLANK = 140737488355328.0  # 2**47

# DCGM 4.6 renamed these Python/C constants and keeps the old names as deprecated aliases;
# dcgm-exporter (and so every dashboard) still uses the old names, which we emit. Looking a name
# up tries the name, then its counterpart here, so bindings from either side of the rename work.
DEPRECATED_ALIASES: dict[str, str] = {
    "DCGM_FI_DEV_GPU_TEMP": "DCGM_FI_DEV_GPU_TEMP_CELSIUS",
    "DCGM_FI_DEV_MEMORY_TEMP": "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS",
    "DCGM_FI_DEV_POWER_USAGE": "DCGM_FI_DEV_BOARD_POWER_WATTS",
    "DCGM_FI_DEV_XID_ERRORS": "DCGM_FI_DEV_XID_ERROR",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "DCGM_FI_PROF_TENSOR_UTIL_RATIO",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DRIVER_VERSION": "DCGM_FI_SYSTEM_DRIVER_VERSION",
}
_RENAMED_TO_OLD = {new: old for old, new in DEPRECATED_ALIASES.items()}

_FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class PromType(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"
    LABEL = "label"


@dataclass(frozen=True, slots=True)
class CounterField:
    name: str
    prom_type: PromType
    help: str = ""

    @property
    def is_label(self) -> bool:
        return self.prom_type is PromType.LABEL

    @property
    def kind(self) -> SeriesKind:
        return SeriesKind.COUNTER if self.prom_type is PromType.COUNTER else SeriesKind.GAUGE


class CounterCsvError(ValueError):
    """The counter CSV has rows that are not ``name, gauge|counter|label, help``."""


def parse_counters_csv(text: str, *, source: str = "<string>") -> list[CounterField]:
    """Parse dcgm-exporter's counter CSV. Bad rows are collected and raised together, so a
    user-supplied file is fixed in one pass; a name listed twice keeps its first row."""
    fields: list[CounterField] = []
    seen: set[str] = set()
    errors: list[str] = []
    for number, raw in enumerate(text.lstrip("\ufeff").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [part.strip() for part in line.split(",", 2)]
        if len(parts) < 2:
            errors.append(f"line {number}: expected 'field, type, help', got {raw!r}")
            continue
        name, type_name = parts[0], parts[1].lower()
        help_text = parts[2] if len(parts) == 3 else ""
        if not _FIELD_NAME.match(name):
            errors.append(f"line {number}: {name!r} is not a DCGM field name")
            continue
        try:
            prom_type = PromType(type_name)
        except ValueError:
            errors.append(f"line {number}: type {parts[1]!r} is not gauge, counter or label")
            continue
        if name in seen:
            log.warning("%s line %d: %s listed again; keeping the first row", source, number, name)
            continue
        seen.add(name)
        fields.append(CounterField(name, prom_type, help_text))
    if errors:
        raise CounterCsvError(f"{source}: " + "; ".join(errors))
    return fields


def default_counters_text() -> str:
    resource = resources.files("collector.sources").joinpath(DEFAULT_COUNTERS_RESOURCE)
    return resource.read_text(encoding="utf-8")


def load_counters(path: str | os.PathLike[str] | None = None) -> list[CounterField]:
    """The user's CSV at ``path``, or dcgm-exporter's default list shipped with the package."""
    if path is None:
        return parse_counters_csv(default_counters_text(), source="dcgm-default-counters.csv")
    csv_path = Path(path)
    try:
        text = csv_path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CounterCsvError(f"cannot read counters CSV {csv_path}: {exc}") from exc
    return parse_counters_csv(text, source=str(csv_path))


def field_id(dcgm_fields_module: Any, name: str) -> int | None:
    """The numeric DCGM field id of ``name`` in the installed bindings, through the 4.6 aliases
    in either direction; None when the bindings do not know the field."""
    for candidate in (name, DEPRECATED_ALIASES.get(name), _RENAMED_TO_OLD.get(name)):
        if candidate is None:
            continue
        value = getattr(dcgm_fields_module, candidate, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def resolve_field_ids(
    fields: list[CounterField], dcgm_fields_module: Any
) -> tuple[dict[str, int], list[str]]:
    """Map field names to ids; the second item lists names the bindings do not know (an older
    DCGM than the CSV), which are skipped rather than failing the whole source."""
    resolved: dict[str, int] = {}
    unknown: list[str] = []
    for field in fields:
        number = field_id(dcgm_fields_module, field.name)
        if number is None:
            unknown.append(field.name)
        else:
            resolved[field.name] = number
    return resolved, unknown


def is_blank(value: object) -> bool:
    """True for DCGM's sentinel values, which dcgm-exporter never emits.

    Integers: at or above DCGM_INT64_BLANK, or inside the int32 sentinel band
    [DCGM_INT32_BLANK, INT32_MAX]. The int32 rule is deliberately not "at or above
    DCGM_INT32_BLANK": int64 counters such as the energy total in mJ pass 2**31 within hours.
    Doubles: NaN or at or above DCGM_FP64_BLANK. Strings: ``<<<...>>>``.
    """
    if value is None:
        return True
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value >= DCGM_INT64_BLANK or DCGM_INT32_BLANK <= value <= DCGM_INT32_MAX
    if isinstance(value, float):
        return math.isnan(value) or value >= DCGM_FP64_BLANK
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    if isinstance(value, str):
        return value.startswith("<<<") and ">>>" in value
    return False


def is_blank_reading(value: float) -> bool:
    """True for a DCGM sentinel read back from an exposition text, where every number is a
    float: the int64 band (9223372036854775792 and up, ``9223372036854775794`` is "not
    supported"), the int32 band and the four fp64 sentinels from 2**47. Only the exact
    sentinels, so a large counter of real data (energy in mJ) is never dropped."""
    value = float(value)
    if math.isnan(value) or value >= float(DCGM_INT64_BLANK):
        return True
    if not value.is_integer():
        return False
    return DCGM_INT32_BLANK <= value <= DCGM_INT32_MAX or (
        DCGM_FP64_BLANK <= value <= DCGM_FP64_BLANK + 3
    )
