"""Bodies of the token routes: a secret appears once, in :class:`TokenCreatedOut`."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field

from tuneloop.accounts import Role, validate_token_name

TokenName = Annotated[
    str,
    AfterValidator(validate_token_name),
    Field(description="1-100 characters, no control characters", examples=["ci-agent"]),
]


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: TokenName
    role: Role = Field(
        default="agent",
        description="member or agent under a project; admin tokens via POST /api/v1/tokens",
    )
    expires_at: AwareDatetime | None = None


class AdminTokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: TokenName
    expires_at: AwareDatetime | None = None


class TokenOut(BaseModel):
    """A token as listed: never its secret or hash, only the first characters (``prefix``)."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    role: Role
    project_id: int | None
    prefix: str
    created_at: datetime
    expires_at: datetime | None
    last_used_at: datetime | None
    revoked_at: datetime | None


class TokenCreatedOut(TokenOut):
    secret: str = Field(description="The bearer secret. Shown only in this response.")
