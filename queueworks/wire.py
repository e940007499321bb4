"""The hottest command of the client in RESP built from bytes made once, on a connection
kept ready, its reply parsed by hiredis's reader directly.

``Queue.enqueue`` of a job to run now is one ``XADD``. Through redis-py, most of its CPU is
redis-py's per-call machinery: taking a connection from the pool (a lock, metrics, a
``poll`` of the socket), packing every argument anew, the retry and hook wrappers. Here
(``Line``) the command's bytes are the queue's and handler's, made once
(``xadd_head``), followed by the payload and the time (``xadd_tail``); a connection is
taken from redis-py's pool once and kept by the line for the next call (a list pop, safe
across threads under the GIL), checked with one ``poll`` of its socket before each use as
the pool checks it; the reply is read by the connection's own hiredis reader. The wire
format is ``xadd_now``'s (a test holds them alike); the errors are redis-py's: a
connection that cannot be made raises ``RedisUnavailable`` (the pool's connection class),
an error reply its ``ResponseError`` (the connection stays good), a failure of the
connection ``ConnectionError`` (the connection is dropped; nothing is retried: an XADD
that may have been applied is never sent twice), and a ``READONLY`` reply through a
sentinel's pool drops the connection and raises ``ConnectionError``, as redis-py's
sentinel connections do, so the next call asks the sentinels for the new primary.

A cluster, or a redis-py without hiredis, has no line (``Line.of`` is None): the command
goes through ``one_command``.
"""

from __future__ import annotations

import os
import select
import socket
from typing import Any

import redis
from redis._parsers.hiredis import NOT_ENOUGH_DATA
from redis.cluster import RedisCluster
from redis.exceptions import ReadOnlyError
from redis.utils import HIREDIS_AVAILABLE

from queueworks.jobrecords import ENTRY_ENQUEUED, ENTRY_HANDLER, ENTRY_PAYLOAD
from queueworks.keys import TaskKeys
from queueworks.queues import xadd_now
from queueworks.script_calls import NewJob

_ENQUEUED = b"$%d\r\n%s\r\n" % (len(ENTRY_ENQUEUED), ENTRY_ENQUEUED.encode())
KEPT = 4  # connections a line keeps at most (more, at once, go back to the pool after use)
_STALE = select.POLLIN | select.POLLHUP | select.POLLERR  # data nobody asked for, or closed


def bulk(value: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(value), value)


def xadd_head(stream: str, handler: str) -> bytes:
    """``XADD stream NOMKSTREAM * h handler p`` of a job with no options of its own, as
    RESP, up to the payload (``xadd_tail`` is the rest)."""
    words = ["XADD", stream, "NOMKSTREAM", "*", ENTRY_HANDLER, handler, ENTRY_PAYLOAD]
    return b"*%d\r\n" % (len(words) + 3) + b"".join(bulk(w.encode()) for w in words)


def xadd_tail(payload: str, now: float) -> bytes:
    """The rest of ``xadd_head``'s command: the payload (JSON) and the enqueue time."""
    body, when = payload.encode(), repr(now).encode()
    return b"$%d\r\n%s\r\n%s$%d\r\n%s\r\n" % (len(body), body, _ENQUEUED, len(when), when)


def send(sock: socket.socket, packed: bytes) -> None:
    """Write ``packed`` on ``sock``: one ``write`` as a rule (a socket with a timeout polls
    before each ``sendall``, a system call more per command), ``sendall`` for the rest.
    Errors are redis-py's: ``TimeoutError``, else ``ConnectionError``."""
    try:
        try:
            sent = os.write(sock.fileno(), packed)
        except BlockingIOError:  # (its buffer is full: a timeout socket does not block)
            sent = 0
        if sent < len(packed):
            sock.sendall(packed[sent:])
    except TimeoutError as exc:
        raise redis.TimeoutError("Timeout writing to socket") from exc
    except OSError as exc:
        raise redis.ConnectionError(f"Error writing to socket: {exc}") from exc


class Forks:
    """How many times this process was forked off a parent (a child's count is its
    parent's plus one): a line checks it before each call instead of asking for its pid, a
    system call each time."""

    count = 0

    @classmethod
    def forked(cls) -> None:
        cls.count += 1


os.register_at_fork(after_in_child=Forks.forked)


def pack(*args: str) -> bytes:
    """Any command of text arguments as RESP."""
    return b"*%d\r\n" % len(args) + b"".join(bulk(a.encode()) for a in args)


def pack_any(*args: str | bytes | int | float) -> bytes:
    """Any command as RESP, its arguments encoded as redis-py encodes them (text as UTF-8,
    numbers by ``repr``)."""
    return b"*%d\r\n" % len(args) + b"".join(bulk(_encode(a)) for a in args)


def _encode(value: str | bytes | int | float) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"cannot send {value!r} to Redis: only text, bytes and numbers")
    return repr(value).encode()


class XaddBytes:
    """A queue handle's ``XADD`` of a job to run now (``xadd_now``) as RESP: the part before
    the payload made once per handler (up to ``HEADS_KEPT`` of them)."""

    HEADS_KEPT = 1024

    def __init__(self, qk: TaskKeys) -> None:
        self.qk = qk
        self.heads: dict[str, bytes] = {}

    def __call__(self, job: NewJob, now: float) -> bytes:
        if job.options:  # a job with options of its own: its whole command packed
            return pack(*xadd_now(self.qk, job, now))
        head = self.heads.get(job.handler)
        if head is None:
            if len(self.heads) >= self.HEADS_KEPT:
                self.heads.clear()
            head = self.heads[job.handler] = xadd_head(self.qk.stream, job.handler)
        return head + xadd_tail(job.payload, now)


def kept(pool: Any) -> int:
    """How many connections a line may keep out of ``pool``: ``KEPT``, and at most a
    quarter of a bounded pool's (none of a pool of 1 to 3: every call takes one and gives
    it back), so the client's other calls always find one."""
    return min(KEPT, int(getattr(pool, "max_connections", KEPT * 4)) // 4)


class Line:
    """Connections of one client's pool kept out of it for pre-built commands (see the
        module docstring). ``call`` is safe from any thread; a forked child starts with none
        (its parent's sockets are not its own); ``close`` gives them back to the pool. It keeps
    at most ``kept(pool)`` connections between calls."""

    def __init__(self, r: redis.Redis) -> None:
        self.pool: Any = r.connection_pool
        self.sentinel = bool(getattr(self.pool, "is_master", False))
        self.idle: list[tuple[Any, Any, Any]] = []  # (connection, its socket, its poll)
        self.forks = Forks.count
        self.kept = kept(self.pool)

    @classmethod
    def of(cls, r: Any) -> Line | None:
        """A line for ``r``'s pool; None for a cluster, or a pool whose connections do not
        parse with hiredis (RESP2)."""
        if isinstance(r, RedisCluster) or not isinstance(r, redis.Redis) or not HIREDIS_AVAILABLE:
            return None
        given = r.connection_pool.connection_kwargs
        if "parser_class" in given or str(given.get("protocol") or 2) != "2":
            return None
        return cls(r)

    def call(self, packed: bytes) -> Any:
        """Send one packed command and return its raw reply (module docstring)."""
        (reply,) = self.call_all(packed, 1)
        if isinstance(reply, redis.ResponseError):
            raise reply
        return reply

    def call_all(self, packed: bytes, n: int) -> list[Any]:
        """Send ``n`` packed commands at once and return their raw replies, an error reply
        in its place (``ResponseError``), as a pipeline with ``raise_on_error=False``."""
        conn, sock, poll = self._take()
        replies: list[Any] = []
        try:
            send(sock, packed)
            parser = conn._parser
            reader = parser._reader
            while len(replies) < n:
                reply = reader.gets()
                while reply is NOT_ENOUGH_DATA:
                    parser.read_from_socket()
                    reply = reader.gets()
                replies.append(reply)
        except BaseException:
            self._drop(conn)
            raise
        for reply in replies:
            if isinstance(reply, redis.ConnectionError):  # LOADING: as redis-py, drop it
                self._drop(conn)
                raise reply
            if self.sentinel and isinstance(reply, ReadOnlyError):
                self._drop(conn)
                raise redis.ConnectionError("The previous master is now a slave")
        self._keep(conn, sock, poll)
        return replies

    def _keep(self, conn: Any, sock: Any, poll: Any) -> None:
        if len(self.idle) < self.kept:
            self.idle.append((conn, sock, poll))
        else:
            self.pool.release(conn)

    def _take(self) -> tuple[Any, Any, Any]:
        """A connection ready to send: a kept one whose socket has nothing to read (else it
        is dropped: closed by the server, or out of step), or a new one from the pool."""
        if self.forks != Forks.count:
            self.idle, self.forks = [], Forks.count
        while self.idle:
            try:
                conn, sock, poll = self.idle.pop()
            except IndexError:  # another thread took the last one
                break
            if conn._sock is sock and not poll.poll(0):
                return conn, sock, poll
            self._drop(conn)
        conn = self.pool.get_connection()
        try:
            poll = select.poll()
            poll.register(conn._sock, _STALE)
        except BaseException:
            self._drop(conn)
            raise
        return conn, conn._sock, poll

    def _drop(self, conn: Any) -> None:
        conn.disconnect()
        self.pool.release(conn)

    def close(self) -> None:
        """Give the kept connections back to the pool."""
        idle, self.idle = self.idle, []
        if self.forks == Forks.count:
            for conn, _, _ in idle:
                self.pool.release(conn)


class StreamReads:
    """A worker's ``XREADGROUP`` (of ``group`` as ``consumer``) on a line: the command's
    bytes made once per streams, count and block (up to ``KEPT`` of them), the reply as
    redis-py's ``xreadgroup`` gives it. Errors as ``Line.call``'s."""

    KEPT = 256

    def __init__(self, line: Line, group: str, consumer: str) -> None:
        self.line, self.group, self.consumer = line, group, consumer
        self.packed: dict[tuple[Any, ...], bytes] = {}

    @classmethod
    def of(cls, r: Any, group: str, consumer: str) -> StreamReads | None:
        line = Line.of(r)
        return None if line is None else cls(line, group, consumer)

    def __call__(self, streams: dict[Any, Any], count: int, block: int | None) -> Any:
        """Read ``streams`` (name -> id), ``count`` entries each, waiting ``block`` ms (None:
        no wait): ``[[stream, [(id, {field: value})]]]``, or None if none came."""
        key = (*streams.items(), count, block)
        packed = self.packed.get(key)
        if packed is None:
            if len(self.packed) >= self.KEPT:
                self.packed.clear()
            words = ["XREADGROUP", "GROUP", self.group, self.consumer, "COUNT", str(count)]
            if block is not None:
                words += ["BLOCK", str(block)]
            names = [text_of(name) for name in streams]
            packed = self.packed[key] = pack(
                *words, "STREAMS", *names, *map(text_of, streams.values())
            )
        reply = self.line.call(packed)
        if not reply:
            return None
        if isinstance(reply, dict):  # (hiredis makes a map of the streams' pairs)
            reply = reply.items()
        return [[stream, [(eid, _fields(f)) for eid, f in entries]] for stream, entries in reply]

    def close(self) -> None:
        self.line.close()


def text_of(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _fields(flat: list[bytes] | None) -> dict[bytes, bytes] | None:
    """An entry's fields as a dict (None: an entry deleted while pending)."""
    if flat is None:
        return None
    it = iter(flat)
    return dict(zip(it, it, strict=True))
