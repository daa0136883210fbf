"""Bodies of ``/api/v1/projects``."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from tuneloop.accounts import validate_project_name
from tuneloop.storage.types import INTEGER_MAX

ProjectName = Annotated[
    str,
    AfterValidator(validate_project_name),
    Field(description="1-100 lowercase letters, digits, '-' or '_'", examples=["vision-team"]),
]


class ProjectCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: ProjectName
    max_series: int | None = Field(default=None, ge=1, le=INTEGER_MAX)


class ProjectOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    max_series: int | None
    created_at: datetime
