"""The hottest command of the client in RESP built from bytes made once, on a connection
kept ready, its reply parsed by hiredis's reader directly.

``Queue.enqueue`` of a job to run now is one ``XADD``. Through redis-py, most of its CPU is
redis-py's per-call machinery: taking a connection from the pool (a lock, metrics, a
``poll`` of the socket), packing every argument anew, the retry and hook wrappers. Here
(``Line``) the command's bytes are the queue's and handler's, made once
(``xadd_head``), followed by the payload and the time (``xadd_tail``); a connection is
taken from redis-py's pool once and kept by the line for the next call (a list pop, safe
across threads under the GIL), checked with one ``poll`` of its socket before each use as
the pool checks it. While kept its socket is blocking, its timeout kept by the kernel
(``hold``), so the command is one ``write`` and the reply one ``recv`` into the
connection's own hiredis reader, no ``poll`` before either. The wire
format is ``xadd_now``'s (a test holds them alike); the errors are redis-py's: a
connection that cannot be made raises ``RedisUnavailable`` (the pool's connection class),
an error reply its ``ResponseError`` (the connection stays good), a failure of the
connection ``ConnectionError`` (the connection is dropped; nothing is retried: an XADD
that may have been applied is never sent twice), and a ``READONLY`` reply through a
sentinel's pool drops the connection and raises ``ConnectionError``, as redis-py's
sentinel connections do, so the next call asks the sentinels for the new primary.

A cluster, a TLS connection, or a redis-py without hiredis, has no line (``Line.of`` is
None): the command goes through ``one_command``.
"""

from __future__ import annotations

import os
import select
import socket
import struct
from typing import TYPE_CHECKING, Any

import redis
from redis._parsers.hiredis import NOT_ENOUGH_DATA
from redis._parsers.socket import SERVER_CLOSED_CONNECTION_ERROR
from redis.cluster import RedisCluster
from redis.exceptions import ReadOnlyError
from redis.utils import HIREDIS_AVAILABLE

from queueworks.protocol.jobrecords import (
    ENTRY_ENQUEUED,
    ENTRY_HANDLER,
    ENTRY_OPTIONS,
    ENTRY_PAYLOAD,
)
from queueworks.protocol.keys import TaskKeys
from queueworks.protocol.messages import text
from queueworks.scripts.calls import NewJob

if TYPE_CHECKING:
    from .unblock import ReadWaker

_ENQUEUED = b"$%d\r\n%s\r\n" % (len(ENTRY_ENQUEUED), ENTRY_ENQUEUED.encode())
KEPT = 4  # connections a line keeps at most (more, at once, go back to the pool after use)
_STALE = select.POLLIN | select.POLLHUP | select.POLLERR  # data nobody asked for, or closed
_CLIENT_ID = b"*2\r\n$6\r\nCLIENT\r\n$2\r\nID\r\n"


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


def send(fd: int, packed: bytes) -> None:
    """Write ``packed`` on a line's socket (blocking, its timeouts the kernel's: see
    ``hold``): one ``write`` as a rule, no ``poll`` before it. Errors are redis-py's:
    ``TimeoutError``, else ``ConnectionError``."""
    try:
        sent = os.write(fd, packed)
        while sent < len(packed):
            sent += os.write(fd, packed[sent:])
    except BlockingIOError as exc:  # (the send timeout ran out)
        raise redis.TimeoutError("Timeout writing to socket") from exc
    except OSError as exc:
        raise redis.ConnectionError(f"Error writing to socket: {exc}") from exc


def receive(sock: socket.socket, reader: Any, buffer: bytearray) -> None:
    """Read what the server sent on a line's socket into ``reader`` with one ``recv``
    (blocking, its timeout the kernel's: see ``hold``), as redis-py's hiredis parser does
    after its ``poll``. Errors are redis-py's."""
    try:
        got = sock.recv_into(buffer)
    except BlockingIOError as exc:  # (the receive timeout ran out)
        raise redis.TimeoutError("Timeout reading from socket") from exc
    except OSError as exc:
        raise redis.ConnectionError(f"Error while reading from socket: {exc.args}") from exc
    if got == 0:
        raise redis.ConnectionError(SERVER_CLOSED_CONNECTION_ERROR)
    reader.feed(buffer, 0, got)


def hold(sock: socket.socket, timeout: float | None) -> None:
    """Make a connection's socket blocking while a line keeps it, its ``timeout`` kept by
    the kernel (``SO_RCVTIMEO``, ``SO_SNDTIMEO``): a reply is then one ``recv``, not a
    ``poll`` and a ``recv`` (``release`` undoes it before the pool has it back)."""
    sock.setblocking(True)
    if timeout:
        whole = int(timeout)
        tv = struct.pack("ll", whole, int((timeout - whole) * 1e6))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def release(sock: socket.socket, timeout: float | None) -> None:
    """Undo ``hold``: the socket as redis-py made it (a non-blocking socket ignores the
    kernel's timeouts)."""
    sock.settimeout(timeout)


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
        return self.now(job.handler, job.payload, now, job.options)

    def now(self, handler: str, payload: str, now: float, options: str = "") -> bytes:
        """The command (``xadd_now``'s) of a job of ``handler``, ``payload`` JSON and
        ``options`` ('' none; while tracing, the trace context at least)."""
        head = self.heads.get(handler)
        if head is None:
            if len(self.heads) >= self.HEADS_KEPT:
                self.heads.clear()
            head = self.heads[handler] = xadd_head(self.qk.stream, handler)
        body, when = payload.encode(), repr(now).encode()
        if options:
            return _with_options(head, body, when, options.encode())
        return b"%s$%d\r\n%s\r\n%s$%d\r\n%s\r\n" % (
            head,
            len(body),
            body,
            _ENQUEUED,
            len(when),
            when,
        )


_OPTIONS = bulk(ENTRY_OPTIONS.encode())


def _with_options(head: bytes, body: bytes, when: bytes, options: bytes) -> bytes:
    """``xadd_head``'s command with an ``o`` field (two more arguments than its count)."""
    count, rest = head[1:].split(b"\r\n", 1)
    return b"*%d\r\n%s$%d\r\n%s\r\n%s$%d\r\n%s\r\n%s$%d\r\n%s\r\n" % (
        int(count) + 2,
        rest,
        len(body),
        body,
        _ENQUEUED,
        len(when),
        when,
        _OPTIONS,
        len(options),
        options,
    )


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
        """A line for ``r``'s pool; None for a cluster, a pool of TLS connections (the line
        writes on the socket's file), or one whose connections do not parse with hiredis
        (RESP2)."""
        if isinstance(r, RedisCluster) or not isinstance(r, redis.Redis) or not HIREDIS_AVAILABLE:
            return None
        if issubclass(r.connection_pool.connection_class, redis.SSLConnection):
            return None
        given = r.connection_pool.connection_kwargs
        if "parser_class" in given or str(given.get("protocol") or 2) != "2":
            return None
        return cls(r)

    def call(self, packed: bytes, taken: tuple[Any, Any, Any] | None = None) -> Any:
        """Send one packed command and return its raw reply (module docstring): as
        ``call_all(packed, 1)``, an error reply raised. On the connection ``take`` gave
        (``taken``), if given; it goes back to the line after."""
        conn, sock, poll = taken or self._take()
        reply = self._reply(conn, sock, packed)
        if isinstance(reply, redis.RedisError):
            self.check_error(conn, reply)
            if isinstance(reply, redis.ResponseError):
                self.keep(conn, sock, poll)
                raise reply
        self.keep(conn, sock, poll)
        return reply

    def take(self) -> tuple[Any, Any, Any]:
        """A connection for ``call`` (and ``client_id``): what ``call`` takes itself."""
        return self._take()

    def client_id(self, conn: Any, sock: Any, poll: Any) -> int:
        """The server's id of ``conn`` (``CLIENT ID``, asked once per socket): the id
        ``CLIENT UNBLOCK`` takes. The connection stays taken."""
        known = getattr(conn, "qw_client", None)
        if known is not None and known[0] is sock:
            return int(known[1])
        reply = self._reply(conn, sock, _CLIENT_ID)
        if isinstance(reply, redis.RedisError):
            self.drop(conn)
            raise reply
        conn.qw_client = (sock, reply)
        return int(reply)

    def _reply(self, conn: Any, sock: Any, packed: bytes) -> Any:
        """Send ``packed`` on a taken connection and read its one raw reply; the connection
        is dropped if that fails."""
        try:
            send(sock.fileno(), packed)
            parser = conn._parser
            reader = parser._reader
            reply = reader.gets()
            while reply is NOT_ENOUGH_DATA:
                receive(sock, reader, parser._buffer)
                reply = reader.gets()
        except BaseException:
            self.drop(conn)
            raise
        return reply

    def call_all(self, packed: bytes, n: int) -> list[Any]:
        """Send ``n`` packed commands at once and return their raw replies, an error reply
        in its place (``ResponseError``), as a pipeline with ``raise_on_error=False``."""
        return self.send_all(packed, n).replies()

    def send_all(self, packed: bytes, n: int) -> Sent:
        """Send ``n`` packed commands at once; their replies are read later, by
        ``Sent.replies`` (the connection is the call's until then)."""
        conn, sock, poll = self._take()
        try:
            send(sock.fileno(), packed)
        except BaseException:
            self.drop(conn)
            raise
        return Sent(self, conn, sock, poll, n)

    def check_error(self, conn: Any, reply: redis.RedisError) -> None:
        """Drop ``conn`` and raise ``ConnectionError`` for an error reply that says the
        connection is no good (LOADING; READONLY through a sentinel's pool), as redis-py."""
        if isinstance(reply, redis.ConnectionError):  # LOADING: as redis-py, drop it
            self.drop(conn)
            raise reply
        if self.sentinel and isinstance(reply, ReadOnlyError):
            self.drop(conn)
            raise redis.ConnectionError("The previous master is now a slave")

    def keep(self, conn: Any, sock: Any, poll: Any) -> None:
        if len(self.idle) < self.kept:
            self.idle.append((conn, sock, poll))
        else:
            self._release(conn, sock)

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
            self.drop(conn)
        conn = self.pool.get_connection()
        try:
            sock = conn._sock
            hold(sock, conn.socket_timeout)
            poll = select.poll()
            poll.register(sock, _STALE)
        except BaseException:
            self.drop(conn)
            raise
        return conn, sock, poll

    def _release(self, conn: Any, sock: Any) -> None:
        """Give a kept connection back to the pool, its socket as redis-py made it."""
        try:
            release(sock, conn.socket_timeout)
        except OSError:
            self.drop(conn)
            return
        self.pool.release(conn)

    def drop(self, conn: Any) -> None:
        conn.disconnect()
        self.pool.release(conn)

    def close(self) -> None:
        """Give the kept connections back to the pool."""
        idle, self.idle = self.idle, []
        if self.forks == Forks.count:
            for conn, sock, _ in idle:
                self._release(conn, sock)


class Sent:
    """Commands sent on a line whose replies are not read yet (``Line.send_all``)."""

    def __init__(self, line: Line, conn: Any, sock: Any, poll: Any, n: int) -> None:
        self.line, self.conn, self.sock, self.poll, self.n = line, conn, sock, poll, n

    def replies(self) -> list[Any]:
        """The raw replies, as ``Line.call_all`` returns them; the connection goes back to
        the line (dropped if it failed)."""
        line, conn, sock = self.line, self.conn, self.sock
        replies: list[Any] = []
        try:
            parser = conn._parser
            reader, buffer = parser._reader, parser._buffer
            while len(replies) < self.n:
                reply = reader.gets()
                while reply is NOT_ENOUGH_DATA:
                    receive(sock, reader, buffer)
                    reply = reader.gets()
                replies.append(reply)
        except BaseException:
            line.drop(conn)
            raise
        for reply in replies:
            if isinstance(reply, redis.RedisError):
                line.check_error(conn, reply)
        line.keep(conn, sock, self.poll)
        return replies


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

    def __call__(
        self,
        streams: dict[Any, Any],
        count: int,
        block: int | None,
        waker: ReadWaker | None = None,
    ) -> Any:
        """Read ``streams`` (name -> id), ``count`` entries each, waiting ``block`` ms (None:
        no wait): ``[[stream, [(id, {field: value})]]]``, or None if none came. A read
        that waits tells ``waker`` on which connection (it may end the wait early)."""
        line = self.line
        taken = line.take()
        try:
            if waker is not None and block is not None:
                block = block if waker.blocking(line.client_id(*taken)) else None
            reply = line.call(self._packed(streams, count, block), taken)
        finally:
            if waker is not None:
                waker.done()
        if not reply:
            return None
        if isinstance(reply, dict):  # (hiredis makes a map of the streams' pairs)
            reply = reply.items()
        return [[stream, [(eid, _fields(f)) for eid, f in entries]] for stream, entries in reply]

    def _packed(self, streams: dict[Any, Any], count: int, block: int | None) -> bytes:
        key = (*streams.items(), count, block)
        packed = self.packed.get(key)
        if packed is None:
            if len(self.packed) >= self.KEPT:
                self.packed.clear()
            words = ["XREADGROUP", "GROUP", self.group, self.consumer, "COUNT", str(count)]
            if block is not None:
                words += ["BLOCK", str(block)]
            names = [text(name) for name in streams]
            packed = self.packed[key] = pack(
                *words, "STREAMS", *names, *map(text, streams.values())
            )
        return packed

    def close(self) -> None:
        self.line.close()


def _fields(flat: list[bytes] | None) -> dict[bytes, bytes] | None:
    """An entry's fields as a dict (None: an entry deleted while pending)."""
    if flat is None:
        return None
    it = iter(flat)
    return dict(zip(it, it, strict=True))
