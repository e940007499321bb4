"""``queueworks submit``: a target task from the command line, and ``--wait`` for it.

Its subtasks come from ``--count N`` (payloads ``{"x": 0}`` ... ``{"x": N-1}``) or from a
JSON-lines file (``--jsonl``, ``-`` for stdin). While ``--wait`` waits, each new reason the
task waits for nodes is said once (``queueworks.cli.dead``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import click

from queueworks.cli.failures import EXIT_UNFINISHED, BadInput
from queueworks.cli.options import (
    ATTEMPTS,
    NODES,
    PRIORITY,
    client_for,
    common,
    option,
    seconds,
    settings_from_flags,
)
from queueworks.protocol.validate import MAX_PARTITIONS


def _jsonl(lines: Any, source: str) -> Iterator[Any]:
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except ValueError as exc:
            message = f"--jsonl {source} line {number}: not JSON ({exc})"
            raise BadInput(message) from None


@click.command(short_help="Submit a target task; print its id.")
@common
@click.argument("handler")
@option("--name", help="task name", show_default="the handler")
@option("--count", type=click.IntRange(min=0), help='submit N subtasks {"x": 0} ... {"x": N-1}')
@option(
    "--jsonl",
    type=click.File("r"),
    help="submit one subtask per line of this JSON-lines file ('-' = stdin)",
)
@option("--min-nodes", type=NODES, default=1, show_default=True, help="fewest workers it runs on")
@option(
    "--max-nodes",
    type=NODES,
    help="most workers it runs on",
    show_default="no limit",
)
@option(
    "--priority",
    type=PRIORITY,
    default=0,
    show_default=True,
    help="higher runs first and may take nodes from lower",
)
@option(
    "--max-attempts",
    type=ATTEMPTS,
    default=3,
    show_default=True,
    help="runs of a failing subtask before it is dead-lettered",
)
@option(
    "--partitions",
    type=click.IntRange(0, MAX_PARTITIONS),
    default=0,
    show_default=True,
    help="ordered task: P partitions by each payload's 'key' (0 = unordered)",
)
@option(
    "--wait/--no-wait",
    default=False,
    show_default=True,
    help="wait for the task to finish (saying why while it waits for nodes); exit 3 if it "
    "did not fully succeed",
)
@option(
    "--timeout",
    type=seconds(0),
    default=None,
    help="with --wait: give up after this many seconds (exit 3)",
    show_default="wait for as long as it takes",
)
def submit(
    handler: str,
    name: str | None,
    count: int | None,
    jsonl: Any,
    min_nodes: int,
    max_nodes: int | None,
    priority: int,
    max_attempts: int,
    partitions: int,
    wait: bool,
    timeout: float | None,
    **flags: Any,
) -> None:
    """Submit a target task of HANDLER ("package.module:function"); print its id.

    Give exactly one of --count and --jsonl. With --wait: print the outcome; exit 0 only
    when every subtask succeeded, else 3 with the first dead letters' reasons."""
    from queueworks.protocol.models import TaskSpec, parse_handler_path

    settings = settings_from_flags(**flags)
    if (count is None) == (jsonl is None):
        raise click.UsageError("give exactly one of --count or --jsonl")
    try:
        parse_handler_path(handler)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    subtasks: Any = (
        ({"x": i} for i in range(count)) if count is not None else _jsonl(jsonl, jsonl.name)
    )
    spec = TaskSpec(
        name=name or handler,
        handler=handler,
        subtasks=subtasks,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        priority=priority,
        max_attempts=max_attempts,
        partitions=partitions,
    )
    client = client_for(settings)
    task = client.submit(spec)
    click.echo(task.id)
    if wait:
        from queueworks.cli.dead import outcome, wait_saying_why

        status = wait_saying_why(task, timeout, lambda line: click.echo(line, err=True))
        if status is None:
            click.echo(f"error: task {task.id} did not finish within {timeout} s", err=True)
            sys.exit(EXIT_UNFINISHED)
        lines, ok = outcome(task, status)
        click.echo(lines[0])
        for line in lines[1:]:
            click.echo(line, err=True)
        if not ok:
            sys.exit(EXIT_UNFINISHED)
