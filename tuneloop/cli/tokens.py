"""``tuneloop token ...`` and ``tuneloop project ...``: manage projects and API tokens directly
in the database (no running API needed).

``token create`` prints only the secret on stdout, so ``TOKEN=$(tuneloop token create ...)``
works; everything meant for people goes to stderr.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Annotated

import typer

from tuneloop import accounts
from tuneloop.cli import app
from tuneloop.cli.common import db_session, fail, project_or_fail
from tuneloop.storage.models import ApiToken
from tuneloop.storage.types import utcnow

CLI_ACTOR = "cli"

token_app = typer.Typer(help="Create, list and revoke API tokens.", no_args_is_help=True)
project_app = typer.Typer(help="Create and list projects.", no_args_is_help=True)
app.add_typer(token_app, name="token")
app.add_typer(project_app, name="project")


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%SZ") if value is not None else "-"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=False)]
    for row in (header, *rows):
        typer.echo(
            "  ".join(
                str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)
            ).rstrip()
        )


def _token_state(token: ApiToken) -> str:
    if token.revoked_at is not None:
        return "revoked"
    if token.expires_at is not None and token.expires_at <= utcnow():
        return "expired"
    return "active"


# --------------------------------------------------------------------------- tokens


@token_app.command("create")
def token_create(
    project: Annotated[
        str | None, typer.Option(help="Project the token belongs to (not for admin tokens)")
    ] = None,
    role: Annotated[str, typer.Option(help="member, agent or admin")] = "member",
    name: Annotated[str | None, typer.Option(help="A label for people [default: the role]")] = None,
    expires_in_days: Annotated[
        int | None, typer.Option(min=1, help="Expire after this many days [default: never]")
    ] = None,
) -> None:
    """Create a token and print its secret (only the secret, on stdout; shown once)."""
    if role not in accounts.ROLES:
        fail(f"invalid role {role!r}: use one of {', '.join(accounts.ROLES)}")
    if role == "admin" and project is not None:
        fail("admin tokens reach every project: leave out --project")
    if role != "admin" and project is None:
        fail(f"a {role} token needs --project")
    expires_at = utcnow() + timedelta(days=expires_in_days) if expires_in_days else None
    with db_session() as session:
        owner = project_or_fail(session, project) if project is not None else None
        token, secret = accounts.create_token(
            session, owner, name or role, role, expires_at=expires_at, actor=CLI_ACTOR
        )
    typer.echo(secret)
    where = f"project {project!r}" if project else "every project"
    typer.echo(
        f"created {role} token {token.name!r} (id {token.id}, prefix {token.prefix}) for {where}; "
        "the secret above is shown only once. Use it as: Authorization: Bearer <secret>",
        err=True,
    )


@token_app.command("list")
def token_list(
    project: Annotated[
        str | None, typer.Option(help="Only this project's tokens [default: every token]")
    ] = None,
    active: Annotated[bool, typer.Option("--active", help="Hide revoked tokens")] = False,
) -> None:
    """List tokens: id, prefix, role, project, name, dates. Never secrets."""
    with db_session() as session:
        if project is not None:
            tokens = accounts.list_tokens(
                session,
                project_or_fail(session, project),
                include_revoked=not active,
                limit=10_000,
            )
        else:
            tokens = accounts.list_all_tokens(session, include_revoked=not active, limit=10_000)
        names = {p.id: p.name for p in accounts.list_projects(session, limit=100_000)}
    rows = [
        (
            str(t.id),
            t.prefix,
            t.role,
            names.get(t.project_id, "-") if t.project_id is not None else "*",
            t.name,
            _token_state(t),
            _when(t.created_at),
            _when(t.last_used_at),
        )
        for t in tokens
    ]
    _table(("ID", "PREFIX", "ROLE", "PROJECT", "NAME", "STATE", "CREATED", "LAST USED"), rows)


@token_app.command("revoke")
def token_revoke(
    token_id: Annotated[int, typer.Argument(help="Token id (see token list)")],
) -> None:
    """Revoke a token: requests with it get 401 from now on."""
    with db_session() as session:
        token = accounts.revoke_token(session, token_id, actor=CLI_ACTOR)
    typer.echo(f"revoked token {token.id} ({token.prefix}, {token.name!r})")


# --------------------------------------------------------------------------- projects


@project_app.command("create")
def project_create(name: Annotated[str, typer.Argument(help="lowercase, digits, - and _")]) -> None:
    """Create a project (then give it a token with: tuneloop token create --project NAME)."""
    with db_session() as session:
        project = accounts.create_project(session, name, actor=CLI_ACTOR)
    typer.echo(f"created project {project.name} (id {project.id})")


@project_app.command("list")
def project_list() -> None:
    """List projects."""
    with db_session() as session:
        projects = accounts.list_projects(session, limit=100_000)
    rows = [(str(p.id), p.name, _when(p.created_at)) for p in projects]
    _table(("ID", "NAME", "CREATED"), rows)
