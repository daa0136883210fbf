"""Bodies every area shares: the error body and a page of a list."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from pydantic import BaseModel, Field


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
