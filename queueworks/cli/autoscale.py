"""``queueworks autoscale``: run a scale command with the workers the controller wants
(``queueworks.contrib.autoscaler``)."""

from __future__ import annotations

import sys
from typing import Any

import click

from queueworks.cli.failures import BadInput
from queueworks.cli.options import common, option, seconds, settings_from_flags


@click.command(short_help="Scale the workers to what the controller wants.")
@common
@option(
    "--scale-command",
    "scale_command",
    required=True,
    envvar="QUEUEWORKS_SCALE_COMMAND",
    show_envvar=True,
    help="command that sets the worker count, with {n} for it, e.g. 'docker compose up -d "
    "--no-recreate --scale worker={n} worker'; split into words, run without a shell",
)
@option("--shell", is_flag=True, help="run --scale-command with `sh -c` (pipes, variables)")
@option(
    "--min",
    "minimum",
    type=click.IntRange(0, 100_000),
    default=0,
    show_default=True,
    help="never fewer workers (0: scale to zero when idle)",
)
@option(
    "--max",
    "maximum",
    type=click.IntRange(1, 100_000),
    required=True,
    help="never more workers",
)
@option(
    "--selector",
    multiple=True,
    metavar="K=V",
    help="the node selector whose workers this scales (repeat, or k=v,k2=v2); none: the "
    "work that names no selector",
)
@option(
    "--cooldown",
    type=seconds(0, 86400),
    default=60.0,
    show_default=True,
    help="scale down only to the most wanted over this many seconds (up is at once)",
)
@option(
    "--interval",
    type=seconds(0, 3600, above=True),
    default=1.0,
    show_default=True,
    help="seconds between two looks at the wanted count",
)
@option(
    "--command-timeout",
    type=seconds(0, 86400, above=True),
    default=300.0,
    show_default=True,
    help="seconds the scale command may run before it is killed (and counted failed)",
)
def autoscale(
    scale_command: str,
    shell: bool,
    minimum: int,
    maximum: int,
    selector: tuple[str, ...],
    cooldown: float,
    interval: float,
    command_timeout: float,
    **flags: Any,
) -> None:
    """Run --scale-command with {n} = the workers the controller wants, whenever that
    count changes: up at once, down after --cooldown, to zero when idle (with --min 0).

    A scale-down must stop workers with SIGTERM (docker compose and Kubernetes do): each
    finishes or hands back what it holds, then leaves. A command that fails is logged and
    tried again with a growing backoff. SIGTERM or SIGINT stops this loop at once (a
    command under way gets SIGTERM; the workers stay as they are)."""
    from queueworks.contrib.autoscaler import STOP_WAIT, Autoscaler, Hysteresis, command_for
    from queueworks.logs import get_logger
    from queueworks.process import ColdStop, install_stop_signals
    from queueworks.protocol.keys import Keys
    from queueworks.protocol.wanted import parse_selector
    from queueworks.transport.connection import connect_settings

    settings = settings_from_flags(**flags)
    try:
        hysteresis = Hysteresis(minimum, maximum, cooldown)
        command = command_for(scale_command, shell=shell)
        name = parse_selector(selector)
        r = connect_settings(settings)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    scaler = Autoscaler(
        r,
        Keys(settings.prefix),
        hysteresis,
        command,
        get_logger(),
        selector=name,
        interval=interval,
        timeout=command_timeout,
    )
    install_stop_signals(scaler.stop, STOP_WAIT + 2)
    try:
        scaler.run()
    except ColdStop:
        sys.exit(1)
