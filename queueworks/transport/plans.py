"""Operations planned once, without I/O: what the sync and the asyncio clients both run.

A *plan* is a generator: it yields one step at a time and is sent what the step gave; its
return value is the operation's result. ``Client``, ``Task``, ``Queue`` and ``Job`` run
plans with ``queueworks.transport.runner.run``, their asyncio twins with
``queueworks.transport.aio_runner.arun``; nothing else differs between them. The steps:

``Trip``
    one round trip: commands recorded on it as on a redis-py pipeline (it builds each
    command with redis-py's own builders: ``trip.hgetall(key)``, ``trip.xadd(...)``), script
    ``Call``s (``trip.call``: ``queueworks.scripts.calls``), and at most one ``WAIT`` for
    replicas, last (``trip.wait_replicas``). It is sent the list of replies, one per op
    (a call's read by the call; the fewest replicas that acknowledged, for the wait); an
    error reply is raised (the first one) unless the trip was made with ``errors=True``,
    which gives it as a value. A trip of one plain command goes out alone, without a
    pipeline (the enqueue of a job to run now: one ``XADD``).
``Sleep``
    a pause between two looks of a polling loop (``Task.wait``, ``Job.result``).
``Chunk``
    the next items (up to ``size``) of the caller's iterable or async iterable; an empty
    list when it is exhausted. A submit streams its subtasks without knowing which it is.

An exception met while a runner does a step (an error reply, a lost connection, the
caller's iterable raising) is thrown into the plan at its ``yield``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator, Iterator, Sequence
from typing import Any, NamedTuple, TypeAlias, TypeVar

from redis.commands.core import DataAccessCommands

from queueworks.scripts.calls import Call

T = TypeVar("T")


class Command(NamedTuple):
    """One command as redis-py builds it: its arguments, and the options its reply's
    parsing reads (``withscores``, ``parse_detail``...)."""

    args: tuple[Any, ...]
    options: dict[str, Any]


class ReplicaWait(NamedTuple):
    """``WAIT replicas timeout_ms`` after the trip's writes, on every primary that holds one
    of ``keys`` (one on a single server); its reply: the fewest replicas that acknowledged."""

    replicas: int
    timeout_ms: int
    keys: tuple[str, ...]


Op: TypeAlias = "Command | Call[Any] | ReplicaWait"


class _Recorder(DataAccessCommands):
    """redis-py's command builders (``hgetall``, ``xadd``, ``zrange(withscores=True)``...),
    recording each command built instead of sending it."""

    def __init__(self, ops: list[Op]) -> None:
        self.ops = ops

    def execute_command(self, *args: Any, **options: Any) -> int:
        self.ops.append(Command(args, options))
        return len(self.ops) - 1


class Trip:
    """One round trip's ops, recorded in order (see the module docstring): a command by
    redis-py's method of its name (``trip.hgetall(key)``: ``_Recorder``), a script call by
    ``call``, a WAIT by ``wait_replicas``. Each returns the op's position among the trip's
    replies."""

    def __init__(self, errors: bool = False) -> None:
        self.ops: list[Op] = []
        self.errors = errors
        self._commands: Any = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if self._commands is None:
            self._commands = _Recorder(self.ops)  # type: ignore[abstract]
        return getattr(self._commands, name)

    def execute_command(self, *args: Any, **options: Any) -> int:
        self.ops.append(Command(args, options))
        return len(self.ops) - 1

    def call(self, call: Call[Any]) -> int:
        """A script call, read by the call's own reader."""
        self.ops.append(call)
        return len(self.ops) - 1

    def wait_replicas(self, replicas: int, timeout_ms: int, keys: Sequence[str]) -> int:
        """``WAIT`` for ``replicas`` after everything before it (put it last)."""
        self.ops.append(ReplicaWait(replicas, timeout_ms, tuple(keys)))
        return len(self.ops) - 1

    def __len__(self) -> int:
        return len(self.ops)


class Sleep(NamedTuple):
    seconds: float


class Chunk(NamedTuple):
    """The next ``size`` items of ``source`` (an iterator, or an async iterator: only the
    asyncio runner takes one)."""

    source: Iterator[Any] | AsyncIterator[Any]
    size: int


Step: TypeAlias = "Trip | Sleep | Chunk"
Plan: TypeAlias = Generator[Step, Any, T]


def alone(call: Call[Any]) -> Trip:
    """A trip of one script call (it runs at once, loading the script if Redis lost it)."""
    trip = Trip()
    trip.call(call)
    return trip
