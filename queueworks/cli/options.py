"""The options of the ``queueworks`` command, written one way: every option's help says what
it does, its default (``[default: ...]``) and, where one applies, its environment variable.
A ``Settings``-backed option takes both from ``Settings``, the one place they are defined.
And what every command makes of them: its ``Settings`` and its ``Client``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from queueworks.cli.failures import META_PREFIX, META_URL, BadInput
from queueworks.logs import configure
from queueworks.protocol.validate import MAX_ATTEMPTS, MAX_NODES, MAX_PRIORITY, check_names
from queueworks.queue.queue_settings import SETTINGS, Setting
from queueworks.settings import Settings

if TYPE_CHECKING:
    from queueworks.client.sync import Client

ENV = "QUEUEWORKS_"
LOG_LEVELS = ("debug", "info", "warning", "error")


class Option(click.Option):
    """Shows a descriptive default as click shows a value: ``[default: no limit]``, without
    the parentheses click puts around it, so every default reads the same way."""

    def get_help_extra(self, ctx: click.Context) -> Any:
        extra = super().get_help_extra(ctx)
        if isinstance(self.show_default, str) and "default" in extra:
            extra["default"] = self.show_default
        return extra


class Finite(click.FloatRange):
    """A finite number in a range: click's ``FloatRange`` lets ``nan`` through (it compares
    false with every bound) and ``inf`` where it has no upper bound."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return super().convert(number, param, ctx)


def seconds(low: float = 0.0, high: float | None = None, *, above: bool = False) -> Finite:
    """Seconds: finite, ``>= low`` (``> low`` if ``above``), at most ``high``."""
    return Finite(min=low, max=high, min_open=above)


class Processes(click.ParamType[int]):
    """``--processes``: a count of at least 1, or ``auto`` (the CPUs this process may use)."""

    name = "N|auto"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int):
            return value
        if str(value).strip().lower() == "auto":
            from queueworks.workers.pool import cpus

            return cpus()
        return click.IntRange(1, MAX_PROCESSES).convert(value, param, ctx)


MAX_PROCESSES = 1024
PROCESSES = Processes()
NODES = click.IntRange(1, MAX_NODES)
PRIORITY = click.IntRange(-MAX_PRIORITY, MAX_PRIORITY)
ATTEMPTS = click.IntRange(1, MAX_ATTEMPTS)


def option(*decls: str, **kwargs: Any) -> Callable[[Any], Any]:
    return click.option(*decls, cls=Option, **kwargs)


def setting(flag: str, field: str, help: str, **kwargs: Any) -> Callable[[Any], Any]:
    """An option backed by a ``Settings`` field: default and variable shown from there.

    The option's own default stays None, so that Settings (flag, else variable, else its
    default) decides; click reads the variable only to show it and type-check it."""
    default = Settings.model_fields[field].default
    return option(
        flag,
        field,
        help=help,
        envvar=ENV + field.upper(),
        show_envvar=True,
        show_default="none" if default is None else str(default),
        **kwargs,
    )


def common(f: Any) -> Any:
    """The options every command that talks to Redis takes."""
    for decorate in reversed(
        [
            setting("--redis", "redis_url", "Redis URL (see docs/cli.md for the schemes)"),
            option(
                "--cluster",
                is_flag=True,
                help="treat the URL's hosts as Redis Cluster seed nodes (as redis+cluster://)",
            ),
            setting("--prefix", "prefix", "key prefix: one deployment's namespace in Redis"),
            setting("--ssl-ca-certs", "ssl_ca_certs", "CA file to verify a rediss:// server"),
            setting(
                "--log-level",
                "log_level",
                "least level logged",
                type=click.Choice(LOG_LEVELS, case_sensitive=False),
            ),
            setting(
                "--log-format",
                "log_format",
                "log lines as JSON events or for a console (default: console when stderr "
                "is a terminal, else json)",
                type=click.Choice(["json", "console"]),
            ),
        ]
    ):
        f = decorate(f)
    return f


def allow_eviction(f: Any) -> Any:
    """The override of the processes that refuse an evicting Redis (worker, controller)."""
    return setting(
        "--allow-eviction",
        "allow_eviction",
        "start even if Redis's maxmemory-policy is not noeviction (it may then drop jobs, "
        "heartbeats and results silently)",
        is_flag=True,
        default=None,
    )(f)


def settings_from_flags(**flags: Any) -> Settings:
    """Settings from the flags (and the environment); logging configured; the URL noted
    (redacted) so that an error can say which Redis it is about."""
    from queueworks.transport.connection import as_cluster_url, redact_url

    cluster = flags.pop("cluster", False)
    ctx = click.get_current_context()
    url = flags.get("redis_url")
    if url:  # before validation: a bad setting's error may still name the URL
        ctx.meta[META_URL] = redact_url(url)
    settings = Settings(**{k: v for k, v in flags.items() if v is not None})
    if cluster:
        settings.redis_url = as_cluster_url(settings.redis_url)
    ctx.meta[META_URL] = redact_url(settings.redis_url)
    ctx.meta[META_PREFIX] = settings.prefix
    configure(settings.log_level, settings.log_format)
    return settings


def given_options(ctx: click.Context, *, skip: set[str]) -> list[str]:
    """The options given on this command's line, as arguments again (those its
    environment variables set travel with the environment): what a supervisor passes on."""
    from click.core import ParameterSource

    args: list[str] = []
    for param in ctx.command.params:
        name = param.name
        if name is None or name in skip or not isinstance(param, click.Option):
            continue
        if ctx.get_parameter_source(name) is not ParameterSource.COMMANDLINE:
            continue
        value, flag = ctx.params[name], param.opts[0]
        if param.is_flag:
            args += [flag] if value else []
        elif param.multiple:
            for item in value:
                args += [flag, str(item)]
        elif isinstance(value, list):  # a comma-separated list, split by its callback
            args += [flag, ",".join(value)]
        elif isinstance(value, dict):  # --queues: names with their weights
            args += [flag, ",".join(k if w == 1 else f"{k}:{w}" for k, w in value.items())]
        else:
            args += [flag, str(value)]
    return args


def client_for(settings: Settings) -> Client:
    """A ``Client`` for the settings; a URL it cannot use is a usage error."""
    from queueworks.client.sync import Client

    try:
        return Client.from_url(
            settings.redis_url,
            prefix=settings.prefix,
            ssl_ca_certs=settings.ssl_ca_certs,
            allow_eviction=settings.allow_eviction,
        )
    except ValueError as exc:  # connect() says what a URL looks like, never the password
        raise BadInput(str(exc)) from None


def task_id_param(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A task (or queue) id argument, checked as ``keys.check_task_id`` checks it."""
    from queueworks.protocol.keys import check_task_id

    try:
        return check_task_id(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def queue_names(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> dict[str, int] | None:
    """``--queues a:3,b`` as queue names (each checked as ``check_task_id`` checks it) with
    their weights (1 if none is given: ``workers.weights``), in order; not given: None
    (every queue)."""
    from queueworks.workers.weights import parse_queues

    if value is None:
        return None
    try:
        weights = parse_queues(value)
        check_names(list(weights), "queue name")
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return weights


def key_values(items: tuple[str, ...], flag: str, what: str) -> dict[str, str]:
    """``k=v`` items of a repeated option as a dict (a later key wins)."""
    labels = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{what} {item!r} must be key=value", param_hint=flag)
        labels[key] = value
    return labels


NO_LIMIT = "none"  # ``queue QUEUE set --rate-limit none``: the setting's "no limit" (None)
CLEARED: Any = object()  # what a live setting option gives for NO_LIMIT


def live_setting_options(f: Any) -> Any:
    """An option for every setting ``Queue.configure`` changes (``Setting.live``), for
    ``queueworks queue QUEUE set``: its flag, type and help from the declaration; not given:
    None. One that may be "no limit" takes ``none`` too (``CLEARED``)."""
    for s in reversed([s for s in SETTINGS.values() if s.live]):
        kind = setting_type(s)
        help = f"set: {s.help}" + (f" ({NO_LIMIT!r}: no limit)" if s.optional else "")
        f = option(s.flag, s.name, type=_OrNone(kind) if s.optional else kind, help=help)(f)
    return f


class _OrNone(click.ParamType[Any]):
    """A setting's type, or ``none`` (``CLEARED``)."""

    def __init__(self, inner: click.ParamType[Any]) -> None:
        self.inner, self.name = inner, f"{inner.name}|none"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value.strip().lower() == NO_LIMIT:
            return CLEARED
        return self.inner.convert(value, param, ctx)


def setting_type(s: Setting) -> click.ParamType[Any]:
    """The click type of a queue setting, from its declared kind and bounds."""
    if s.kind is int:
        return click.IntRange(int(s.low), int(s.high))
    if s.kind is float:
        return seconds(s.low, s.high, above=s.above_low)
    return click.STRING  # a k=v label of a dict setting, repeated


def _labels_given(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A dict setting's ``k=v`` items as a dict; none given: None (not given)."""
    return key_values(value, param.opts[0], "label") if value else None


def queue_setting_options(f: Any) -> Any:
    """An option for every queue setting (``QueueSettings``): its flag, type and help
    from the declaration; not given (None) unless given, so that the queue's own stays.
    The queue's ``priority`` (against tasks) is ``--queue-priority``: ``--priority`` is
    the job's (``enqueue``)."""
    for s in reversed(SETTINGS.values()):
        more: dict[str, Any] = {"type": setting_type(s)}
        if s.kind is dict:
            more.update(multiple=True, metavar="KEY=VALUE", callback=_labels_given)
        f = option(
            "--queue-priority" if s.name == "priority" else s.flag,
            s.name,
            help=s.help,
            show_default=f"the queue's own; {s.shown_default} if new",
            **more,
        )(f)
    return f
