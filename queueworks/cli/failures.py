"""What the ``queueworks`` command says when something expected goes wrong.

An expected failure is one line on stderr (``error: ...``) and a non-zero exit code; the
traceback is shown only with ``queueworks --debug``. An exception that is not listed here
is a bug and keeps its traceback.

Exit codes: 0 success; 1 an error (Redis unreachable, credentials refused, no such task,
a missing extra, a refused operator action); 2 bad usage or input (a flag, the Redis URL,
a handler path, a setting, a payload); 3 ``submit --wait``: the task finished, but not
every subtask succeeded (dead letters, a failed or a cancelled task).
"""

from __future__ import annotations

from typing import Any

import click
import pydantic
import redis

from queueworks.errors import (
    AdminError,
    EvictingRedis,
    NoServerBinary,
    QueueNotFound,
    RedisUnavailable,
    SubmitError,
    TaskNotFound,
)
from queueworks.protocol.records import BadRecord
from queueworks.transport.connection import UNAVAILABLE

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNFINISHED = 3

# ctx.meta keys the commands fill in so that an error can name where it happened
META_URL = "queueworks.redis_url"  # already redacted
META_PREFIX = "queueworks.prefix"


class CliError(click.ClickException):
    """An expected failure (exit 1); ``message`` is the whole line to print."""

    exit_code = EXIT_ERROR

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))

    def show(self, file: object = None) -> None:
        click.echo(f"error: {self.message}", err=True)


class BadInput(CliError):
    """Bad usage or input (exit 2): a flag, the URL, a handler path, a setting, a payload."""

    exit_code = EXIT_USAGE


def one_line(text: str) -> str:
    return " ".join(text.split())


def missing_extra(extra: str, module: str) -> CliError:
    return CliError(
        f"this command needs the {extra} extra (no module {module!r}): "
        f"pip install 'queueworks[{extra}]'"
    )


def usage_line(exc: click.UsageError) -> CliError:
    """Click's usage error (usage, hint, blank line, message) as one line."""
    where = exc.ctx.command_path if exc.ctx is not None else "queueworks"
    return BadInput(f"{exc.format_message()} (see '{where} --help')")


def explain(exc: Exception, meta: dict[str, object]) -> CliError | None:
    """The one-line error for an expected exception; None for anything else (a bug)."""
    url = str(meta.get(META_URL) or "the Redis URL")
    if isinstance(exc, CliError):
        return exc
    if isinstance(exc, click.UsageError):
        return usage_line(exc)
    if isinstance(exc, click.ClickException):
        return CliError(exc.format_message())
    if isinstance(exc, redis.AuthenticationError):  # a ConnectionError: test it first
        return CliError(f"Redis at {url} refused the credentials: {exc}")
    if isinstance(exc, redis.exceptions.NoPermissionError):
        return CliError(f"Redis at {url} refused a command for this user (ACL): {exc}")
    if isinstance(exc, redis.ResponseError) and str(exc).startswith(("NOAUTH", "WRONGPASS")):
        return CliError(f"Redis at {url} refused the credentials: {exc}")
    if isinstance(exc, RedisUnavailable | QueueNotFound):  # they say it all, URL included
        return CliError(str(exc))
    if isinstance(exc, UNAVAILABLE):
        return CliError(f"cannot reach Redis at {url}: {exc or type(exc).__name__}")
    if isinstance(exc, TaskNotFound):
        prefix = meta.get(META_PREFIX, "qw")
        return CliError(f"no task {exc} under prefix {prefix!r} at {url}")
    if isinstance(exc, pydantic.ValidationError):
        what = "setting" if exc.title == "Settings" else "task"
        return BadInput(f"invalid {what}: {validation_text(exc)}")
    if isinstance(exc, SubmitError):
        return BadInput(f"cannot submit: {exc}")
    if isinstance(exc, AdminError | BadRecord | EvictingRedis | NoServerBinary):
        return CliError(str(exc))
    if isinstance(exc, redis.RedisError):
        return CliError(f"Redis at {url} answered: {exc}")
    return None


def validation_text(exc: pydantic.ValidationError) -> str:
    """``field: reason; field: reason`` without pydantic's input echo (it may hold secrets)."""
    parts = []
    for e in exc.errors()[:3]:
        msg = str(e["msg"]).removeprefix("Value error, ")
        where = ".".join(str(x) for x in e["loc"])
        parts.append(f"{where}: {msg}" if where else msg)
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


class OneLineErrors(click.Group):
    """The command group: every expected error of a command becomes one line."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            raise usage_line(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.Abort, click.exceptions.NoArgsIsHelpError):
            raise
        except Exception as exc:
            if ctx.params.get("debug"):
                raise
            error = explain(exc, ctx.meta)
            if error is None:
                raise  # not an expected failure: a bug, keep its traceback
            raise error from None
