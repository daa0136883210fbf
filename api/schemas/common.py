"""Bodies every area shares: the error body, a page of a list, and the bounded integers every
request field uses (a number past its column's range would be a server error)."""

from __future__ import annotations

from typing import Annotated, Any, Generic, TypeVar

from pydantic import BaseModel, Field

from tuneloop.storage.types import BIGINT_MAX, INTEGER_MAX

Id = Annotated[int, Field(ge=1, le=INTEGER_MAX)]
"""A row id or a version number in a request (an INTEGER column)."""

Int64 = Annotated[int, Field(ge=-BIGINT_MAX - 1, le=BIGINT_MAX)]
"""Any other integer a request may carry."""


class ErrorOut(BaseModel):
    """Every error response: a message (or a list of validation problems) and a stable code."""

    detail: str | list[Any]
    code: str = Field(examples=["not_found"])


T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    """One page of a list. ``next_offset`` is ``None`` on the last page."""

    items: list[T]
    limit: int
    offset: int
    next_offset: int | None
