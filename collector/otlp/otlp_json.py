"""The one place OTLP/JSON departs from the protobuf JSON mapping that ``json_format`` follows.

OTLP/JSON writes trace and span ids as hex strings, where the protobuf mapping of ``bytes``
expects base64. Everything else the OTLP spec allows is already accepted by ``json_format``:
lowerCamelCase or original snake_case field names, enum values as integers, 64-bit integers as
strings or numbers, ``"NaN"``/``"Infinity"`` for doubles.
"""

from __future__ import annotations

import base64
import string
from typing import Any, Final

_ID_BYTES: Final = {
    "traceId": 16,
    "trace_id": 16,
    "spanId": 8,
    "span_id": 8,
    "parentSpanId": 8,
    "parent_span_id": 8,
}
"""Id fields of spans, span links and exemplars, and their sizes. Attribute keys never appear
as JSON keys (they are ``{"key": ..., "value": ...}`` objects), so matching on the key is
exact."""
_HEX_DIGITS: Final = frozenset(string.hexdigits)


def hex_ids_to_base64(document: Any, *, max_depth: int) -> None:
    """Rewrite, in place, every hex id in ``document`` (parsed JSON) as base64.

    Raises ``ValueError`` for a document nested deeper than ``max_depth``. Iterative, so depth
    costs no Python stack.
    """
    stack: list[tuple[Any, int]] = [(document, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise ValueError(f"the JSON document is nested deeper than {max_depth} levels")
        if isinstance(node, dict):
            for key, value in node.items():
                if key in _ID_BYTES and isinstance(value, str):
                    node[key] = _id_as_base64(key, value)
                elif isinstance(value, dict | list):
                    stack.append((value, depth + 1))
        elif isinstance(node, list):
            stack.extend((item, depth + 1) for item in node if isinstance(item, dict | list))


def _id_as_base64(key: str, value: str) -> str:
    """The id as base64; empty stays empty. The base64 form of an id (12 or 24 characters)
    never has the length of its hex form, so a client that sends base64 anyway (old exporters
    did) is still understood."""
    size = _ID_BYTES[key]
    if not value:
        return value
    if len(value) == 2 * size and _HEX_DIGITS.issuperset(value):
        return base64.b64encode(bytes.fromhex(value)).decode()
    try:
        if len(base64.b64decode(value, validate=True)) == size:
            return value
    except ValueError:
        pass
    raise ValueError(f"{key} must be {2 * size} hex digits, got {value[:40]!r}")
