"""OpenTelemetry metric name and unit -> Prometheus-style metric name.

The rules of Prometheus' OTLP translator (``UnderscoreEscapingWithSuffixes``), so a dashboard
written against Prometheus works unchanged:

1. The name is split into words at every character that is not a letter or digit (dots, dashes,
   runs of underscores) and re-joined with ``_``: ``http.server.request.duration`` ->
   ``http_server_request_duration``. Letters and digits of every script are kept (after NFC
   normalization), as in the OpenTelemetry specification and Prometheus 3, which accepts UTF-8
   names: ``ünïcödé.temp`` -> ``ünïcödé_temp``. Where only the classic character set can go
   (the text exposition), :func:`escape_legacy` applies Prometheus' ``U__`` value escaping.
2. The unit, less ``{annotations}``, is appended as a word unless the name already has it:
   ``s`` -> ``_seconds``, ``By`` -> ``_bytes``, ``ms`` -> ``_milliseconds`` (see ``UNITS``); a
   rate unit ``X/Y`` appends ``X`` then ``per_Y`` (``By/s`` -> ``_bytes_per_second``). Unknown
   units are appended sanitized. Values are never converted: ``ms`` stays milliseconds.
3. Monotonic counters end in ``_total`` (a ``total`` word elsewhere is moved to the end).
4. Gauges of unit ``1`` (a ratio) end in ``_ratio``.
5. A name starting with a digit gets a ``_`` prefix.

Histograms then get ``_bucket``/``_sum``/``_count`` and summaries ``_sum``/``_count``.
"""

from __future__ import annotations

import re
import unicodedata
from enum import StrEnum
from functools import lru_cache
from typing import Final

UNITS: Final[dict[str, str]] = {
    "d": "days",
    "h": "hours",
    "min": "minutes",
    "s": "seconds",
    "ms": "milliseconds",
    "us": "microseconds",
    "ns": "nanoseconds",
    "By": "bytes",
    "KiBy": "kibibytes",
    "MiBy": "mebibytes",
    "GiBy": "gibibytes",
    "TiBy": "tebibytes",
    "KBy": "kilobytes",
    "MBy": "megabytes",
    "GBy": "gigabytes",
    "TBy": "terabytes",
    "m": "meters",
    "V": "volts",
    "A": "amperes",
    "J": "joules",
    "W": "watts",
    "g": "grams",
    "Cel": "celsius",
    "Hz": "hertz",
    "1": "",
    "%": "percent",
}
PER_UNITS: Final[dict[str, str]] = {
    "s": "second",
    "m": "minute",
    "h": "hour",
    "d": "day",
    "w": "week",
    "mo": "month",
    "y": "year",
}
_WORD_SPLIT: Final = re.compile(r"[\W_]+")  # anything but a letter or digit, any script
_LEGACY_NAME: Final = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_ANNOTATION: Final = re.compile(r"\{[^}]*\}")


class NameKind(StrEnum):
    """What the suffix rules need to know about a metric."""

    COUNTER = "counter"
    """A monotonic sum: gets ``_total``."""
    GAUGE = "gauge"
    """A gauge: gets ``_ratio`` for unit ``1``."""
    OTHER = "other"
    """Non-monotonic sums, histograms, summaries: unit suffix only."""


def _words(text: str) -> list[str]:
    # NFC so a letter typed as base + combining accent stays one letter, not a word break.
    return [word for word in _WORD_SPLIT.split(unicodedata.normalize("NFC", text)) if word]


def _unit_words(unit: str) -> tuple[list[str], list[str]]:
    """(words of the main unit, words of the per-unit) of ``unit``."""
    unit = _ANNOTATION.sub("", unit).strip()
    main, _, per = unit.partition("/")
    main, per = main.strip(), per.strip()
    main_words = _words(UNITS.get(main, main))
    per_words = _words(PER_UNITS.get(per, per))
    return main_words, per_words


@lru_cache(maxsize=4096)  # every request repeats the names (and the regex work) of the last
def metric_name(name: str, unit: str, kind: NameKind) -> str:
    """The Prometheus-style name of an OpenTelemetry metric (empty if ``name`` has no letter
    or digit at all)."""
    words = _words(name)
    if not words:
        return ""
    main, per = _unit_words(unit)
    if main and "_".join(main) not in words:
        words.extend(main)
    if per and "_".join(per) not in words:
        words.extend(["per", *per])
    if kind is NameKind.COUNTER:
        words = [word for word in words if word != "total"] + ["total"]
    elif kind is NameKind.GAUGE and unit.strip() == "1" and "ratio" not in words:
        words.append("ratio")
    joined = "_".join(words)
    return "_" + joined if joined[0].isdigit() else joined


def escape_legacy(name: str) -> str:
    """``name`` if it is a classic Prometheus name, else Prometheus' ``U__`` value escaping:
    ``_`` doubled, any other character outside ``[a-zA-Z0-9_:]`` written ``_<hex code>_``
    (``ünï`` -> ``U___fc_n_ef_``), so distinct names stay distinct and can be read back."""
    if _LEGACY_NAME.fullmatch(name):
        return name
    escaped = ["U__"]
    for index, char in enumerate(name):
        if char == "_":
            escaped.append("__")
        elif char.isascii() and (char.isalpha() or char == ":" or (char.isdigit() and index)):
            escaped.append(char)
        else:
            escaped.append(f"_{ord(char):x}_")
    return "".join(escaped)
