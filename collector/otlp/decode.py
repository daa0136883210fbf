"""The OTLP/HTTP wire format: content types, content encodings, protobuf and OTLP/JSON bodies,
and the responses written back in the request's encoding.

Every failure is an :class:`OtlpError` carrying its HTTP status, so the route maps it to a
response without knowing which step failed: 415 for a content type or encoding we do not speak,
413 for a body that is (or decompresses to) more than the limit, 400 for anything that does not
parse. Nothing here raises anything else on bad input.
"""

from __future__ import annotations

import json
import zlib
from enum import StrEnum
from typing import Final, TypeVar

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message

from collector.otlp.otlp_json import hex_ids_to_base64

MessageT = TypeVar("MessageT", bound=Message)


class Encoding(StrEnum):
    PROTOBUF = "protobuf"
    JSON = "json"


MEDIA_TYPES: Final[dict[Encoding, str]] = {
    Encoding.PROTOBUF: "application/x-protobuf",
    Encoding.JSON: "application/json",
}
_ENCODINGS: Final[dict[str, Encoding]] = {
    "application/x-protobuf": Encoding.PROTOBUF,
    "application/protobuf": Encoding.PROTOBUF,
    "application/json": Encoding.JSON,
}

# google.rpc.Code values that go with each HTTP status we answer with.
_GRPC_CODES: Final[dict[int, int]] = {
    400: 3,  # INVALID_ARGUMENT
    413: 8,  # RESOURCE_EXHAUSTED
    415: 3,
    429: 8,
    503: 14,  # UNAVAILABLE
}
_GZIP_WBITS: Final = 16 + zlib.MAX_WBITS
_ZLIB_WBITS: Final = zlib.MAX_WBITS
_RAW_DEFLATE_WBITS: Final = -zlib.MAX_WBITS
_MAX_MESSAGE: Final = 1_000
_JSON_MAX_DEPTH: Final = 64
"""OTLP nests at most ~10 levels plus attribute values (arrays, kvlists) inside them."""


class OtlpError(Exception):
    """A request the receiver refuses as a whole; ``status`` is the HTTP status to answer."""

    status: int = 400

    def __init__(self, message: str) -> None:
        # Parser messages can quote the payload: keep the answer short whatever was sent.
        message = message if len(message) <= _MAX_MESSAGE else message[:_MAX_MESSAGE] + "..."
        super().__init__(message)
        self.message = message


class MalformedPayload(OtlpError):
    status = 400


class PayloadTooLarge(OtlpError):
    status = 413


class UnsupportedMediaType(OtlpError):
    status = 415


def encoding_of(content_type: str | None) -> Encoding:
    """The body encoding a ``Content-Type`` names; parameters such as ``charset`` are ignored
    (OTLP/JSON is always UTF-8, and protobuf has no charset)."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    try:
        return _ENCODINGS[media]
    except KeyError:
        shown = media or "none"
        raise UnsupportedMediaType(
            f"unsupported content type {shown!r}: send application/x-protobuf or application/json"
        ) from None


def decompress(body: bytes, content_encoding: str | None, max_bytes: int) -> bytes:
    """``body`` with its ``Content-Encoding`` undone (gzip, deflate, identity; a list is undone
    last to first), never producing more than ``max_bytes``."""
    codings = [c.strip().lower() for c in (content_encoding or "").split(",") if c.strip()]
    for coding in reversed(codings):
        if coding in ("gzip", "x-gzip"):
            body = _inflate(body, _GZIP_WBITS, max_bytes, "gzip")
        elif coding == "deflate":
            body = _inflate_deflate(body, max_bytes)
        elif coding != "identity":
            raise UnsupportedMediaType(
                f"unsupported content encoding {coding!r}: send gzip, deflate or identity"
            )
    if len(body) > max_bytes:
        raise PayloadTooLarge(f"the payload is larger than the limit of {max_bytes} bytes")
    return body


def _inflate_deflate(body: bytes, max_bytes: int) -> bytes:
    # HTTP's "deflate" is the zlib format, but some clients send raw deflate: accept both.
    try:
        return _inflate(body, _ZLIB_WBITS, max_bytes, "deflate")
    except MalformedPayload:
        return _inflate(body, _RAW_DEFLATE_WBITS, max_bytes, "deflate")


def _inflate(body: bytes, wbits: int, max_bytes: int, name: str) -> bytes:
    """Stream-decompress in steps bounded by what is left of ``max_bytes``, so a gzip bomb
    costs at most ``max_bytes`` of memory before it is refused. Concatenated gzip members
    (allowed by RFC 1952) are all decompressed."""
    out = bytearray()
    pending = body
    try:
        decompressor = zlib.decompressobj(wbits)
        while True:
            # max_length 0 would mean "unlimited": out stays <= max_bytes here, so it is >= 1.
            out += decompressor.decompress(pending, max_bytes + 1 - len(out))
            if len(out) > max_bytes:
                raise PayloadTooLarge(
                    f"the {name} payload decompresses to more than the limit of {max_bytes} bytes"
                )
            if decompressor.eof:
                pending = decompressor.unused_data
                if not pending:
                    return bytes(out)
                decompressor = zlib.decompressobj(wbits)
            else:
                pending = decompressor.unconsumed_tail
                if not pending:
                    raise MalformedPayload(f"the {name} stream is truncated")
    except zlib.error as exc:
        raise MalformedPayload(f"the body is not valid {name} data: {exc}") from None


def parse(body: bytes, encoding: Encoding, message: MessageT) -> MessageT:
    """Fill ``message`` (an empty export request) from ``body`` and return it."""
    if encoding is Encoding.PROTOBUF:
        try:
            message.ParseFromString(body)
        except (DecodeError, ValueError, RecursionError) as exc:
            raise MalformedPayload(f"the body is not a valid protobuf message: {exc}") from None
        return message
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise MalformedPayload(f"the body is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise MalformedPayload("the JSON body must be an object")
    try:
        hex_ids_to_base64(document, max_depth=_JSON_MAX_DEPTH)
        # Unknown fields are ignored, as the OTLP spec requires for forward compatibility.
        json_format.ParseDict(
            document, message, ignore_unknown_fields=True, max_recursion_depth=_JSON_MAX_DEPTH
        )
    except (json_format.ParseError, ValueError, TypeError, RecursionError) as exc:
        raise MalformedPayload(f"the body is not a valid OTLP/JSON message: {exc}") from None
    return message


def decode(
    body: bytes,
    content_type: str | None,
    content_encoding: str | None,
    message: MessageT,
    max_bytes: int,
) -> tuple[MessageT, Encoding]:
    """The export request in ``body`` and the encoding the response must use."""
    encoding = encoding_of(content_type)
    return parse(decompress(body, content_encoding, max_bytes), encoding, message), encoding


def encode(message: Message, encoding: Encoding) -> bytes:
    """``message`` (an export response) in ``encoding``."""
    if encoding is Encoding.PROTOBUF:
        return bytes(message.SerializeToString())
    return str(json_format.MessageToJson(message, indent=None)).encode()


def status_body(http_status: int, message: str, encoding: Encoding) -> bytes:
    """A ``google.rpc.Status`` (code, message; no details) in ``encoding``, the error body the
    OTLP/HTTP spec asks for. Encoded by hand: the message is two fields, and its generated
    class lives in googleapis-common-protos, which the API process does not otherwise need."""
    code = _GRPC_CODES.get(http_status, 2)  # 2: UNKNOWN
    if encoding is Encoding.JSON:
        return json.dumps({"code": code, "message": message}).encode()
    text = message.encode()
    # field 1 (code, varint) and field 2 (message, length-delimited)
    return b"\x08" + _varint(code) + b"\x12" + _varint(len(text)) + text


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
