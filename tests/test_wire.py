"""``queueworks.transport.wire``: the enqueue of a job to run now, as pre-built RESP on a kept
connection, against a real server: the same bytes as redis-py's ``XADD``, and the same
errors (a bad payload, an error reply, a dropped connection, a read-only server)."""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from queueworks import AsyncClient, Client
from queueworks.contrib.redis_server import RedisServer
from queueworks.errors import RedisUnavailable
from queueworks.protocol.keys import Keys
from queueworks.queue.queues import xadd_now
from queueworks.scripts.calls import NewJob
from queueworks.transport.wire import (
    Forks,
    Line,
    Sent,
    StreamReads,
    XaddBytes,
    pack,
    pack_any,
    xadd_head,
    xadd_tail,
)

NOOP = "queueworks.examples:noop"


@pytest.mark.unit
def test_the_prebuilt_xadd_is_xadd_now_in_resp() -> None:
    qk = Keys("p").task("q")
    job = NewJob("", NOOP, '{"to":"é"}')
    now = 1_700_000_000.123456
    built = xadd_head(qk.stream, NOOP) + xadd_tail(job.payload, now)
    assert built == pack(*xadd_now(qk, job, now))
    # and what redis-py would send for it
    packed = redis.Redis().connection_pool.make_connection().pack_command(*xadd_now(qk, job, now))
    assert built == b"".join(packed)


@pytest.mark.unit
def test_the_handles_xadd_bytes_are_xadd_now_in_resp() -> None:
    qk = Keys("p").task("q")
    job = NewJob("", NOOP, '{"to":"é"}')
    now = 1_700_000_000.25
    assert XaddBytes(qk).now(NOOP, job.payload, now) == pack(*xadd_now(qk, job, now))
    assert XaddBytes(qk)(job, now) == pack(*xadd_now(qk, job, now))
    # with options (a traced job's context alone, or its own too): the same fields, and "o"
    for options in ('{"tp":"00-' + "1" * 32 + "-" + "2" * 16 + '-01"}', '{"group":"é","tp":"x"}'):
        with_options = job._replace(options=options)
        expected = pack(*xadd_now(qk, with_options, now))
        assert XaddBytes(qk).now(NOOP, job.payload, now, options) == expected
        assert XaddBytes(qk)(with_options, now) == expected


@pytest.mark.unit
def test_a_tls_pool_has_no_line() -> None:
    """The line writes on the socket's file: under TLS that would be plain text."""
    assert Line.of(redis.Redis(ssl=True)) is None
    assert Line.of(redis.Redis()) is not None


@pytest.mark.unit
def test_the_prebuilt_xadd_knows_every_field_of_a_job() -> None:
    """``XaddBytes`` writes a job with no options from its handler, payload and time alone:
    a field added to ``NewJob`` (or to the entry) must be written there too, or such jobs
    would lose it on the hot path."""
    assert NewJob._fields == ("id", "handler", "payload", "at", "options")


@pytest.mark.integration
def test_enqueue_takes_the_line_and_keeps_one_connection(client: Client, r: redis.Redis) -> None:
    assert client.line is not None
    q = client.queue("wire")
    jobs = [q.enqueue(NOOP, {"i": i}) for i in range(5)]
    assert len(client.line.idle) == 1  # one connection, kept between calls
    entries = r.xrange(q.keys.stream)
    assert [e[0].decode() for e in entries] == [j.id for j in jobs]
    assert entries[-1][1][b"p"] == b'{"i":4}'
    assert q.job(jobs[0].id).status().state == "queued"


@pytest.mark.integration
def test_a_bad_payload_is_a_value_error_and_sends_nothing(client: Client, r: redis.Redis) -> None:
    q = client.queue("wire")
    q.enqueue(NOOP, 1)
    with pytest.raises(ValueError, match="payload"):
        q.enqueue(NOOP, {"x": object()})
    with pytest.raises(ValueError, match="payload"):
        q.enqueue(NOOP, float("nan"))
    assert r.xlen(q.keys.stream) == 1
    assert q.enqueue(NOOP, 2).id


@pytest.mark.integration
def test_an_error_reply_is_raised_and_the_connection_stays_good(
    client: Client, r: redis.Redis, prefix: str
) -> None:
    line = client.line
    assert line is not None
    r.set(f"{prefix}:s", "a string")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        line.call(pack("XADD", f"{prefix}:s", "*", "a", "b"))
    kept = line.idle[0][0]
    assert line.call(pack("PING")) == b"PONG"
    assert line.idle[0][0] is kept  # not reconnected


@pytest.mark.unit
def test_pack_any_sends_what_redis_py_sends() -> None:
    args = ("EVALSHA", "abc", 2, "k:é", b"\x00raw", 0.1, 1_700_000_000.5, -3)
    packed = redis.Redis().connection_pool.make_connection().pack_command(*args)
    assert pack_any(*args) == b"".join(packed)
    with pytest.raises(TypeError, match="True"):
        pack_any("SET", "k", True)
    with pytest.raises(TypeError, match="None"):
        pack_any("SET", "k", None)  # type: ignore[arg-type]


@pytest.mark.integration
def test_call_all_reads_every_reply_an_error_in_its_place(
    client: Client, r: redis.Redis, prefix: str
) -> None:
    """Several commands in one round trip (a lockstep step's end): each reply in order, an
    error reply in its place (not raised), and the connection kept for the next call."""
    line = client.line
    assert line is not None
    r.set(f"{prefix}:s", "a string")
    sent = pack_any("INCRBY", f"{prefix}:n", 2) + pack("XADD", f"{prefix}:s", "*", "a", "b")
    sent += pack_any("EVALSHA", "0" * 40, 0) + pack("GET", f"{prefix}:n")
    replies = line.call_all(sent, 4)
    assert replies[0] == 2 and replies[3] == b"2"
    assert isinstance(replies[1], redis.ResponseError) and "WRONGTYPE" in str(replies[1])
    assert isinstance(replies[2], redis.exceptions.NoScriptError)  # the caller loads it
    kept = line.idle[0][0]
    assert line.call_all(pack("PING") + pack("PING"), 2) == [b"PONG", b"PONG"]
    assert line.idle[0][0] is kept


@pytest.mark.integration
def test_a_dropped_connection_is_made_again_and_nothing_is_sent_twice(
    client: Client, r: redis.Redis
) -> None:
    q = client.queue("wire")
    q.enqueue(NOOP, 1)  # the first job of a handler tells the queue about it (a script)
    q.enqueue(NOOP, 2)  # the next ones take the line
    assert client.line is not None
    conn = client.line.idle[0][0]
    assert r.client_kill_filter(_id=_client_id(conn)) == 1
    job = q.enqueue(NOOP, 3)  # the closed socket is seen before sending: a new connection
    assert client.line.idle[0][0] is conn  # connected again
    assert r.xlen(q.keys.stream) == 3
    assert r.xrange(q.keys.stream)[-1][0].decode() == job.id


@pytest.mark.integration
def test_a_stream_gone_under_the_line_gets_its_job_once(client: Client, r: redis.Redis) -> None:
    q = client.queue("wire")
    q.enqueue(NOOP, 1)
    r.delete(q.keys.stream)  # the XADD (NOMKSTREAM) writes nothing: the script makes it
    job = q.enqueue(NOOP, 2)
    assert [(e[0].decode(), e[1][b"p"]) for e in r.xrange(q.keys.stream)] == [(job.id, b"2")]
    assert job.status().state == "queued"


@pytest.mark.integration
def test_a_reply_that_does_not_come_in_time_is_a_timeout(redis_url: str) -> None:
    """A kept socket is blocking, the kernel keeping its timeout: redis-py's error, and the
    connection is dropped (its late reply would answer the next command)."""
    line = Line.of(redis.Redis.from_url(redis_url, socket_timeout=0.2))
    assert line is not None
    with pytest.raises(redis.TimeoutError, match="Timeout reading"):
        line.call(pack("BLPOP", "no-such-list", "2"))
    assert line.idle == []
    assert line.call(pack("PING")) == b"PONG"


@pytest.mark.integration
def test_a_connection_given_back_is_as_redis_py_made_it(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url, socket_timeout=3)
    line = Line.of(r)
    assert line is not None
    assert line.call(pack("PING")) == b"PONG"
    (conn, sock, _) = line.idle[0]
    assert sock.gettimeout() is None  # kept: blocking (see ``wire.hold``)
    line.close()
    assert sock.gettimeout() == 3 and conn._sock is sock
    assert r.ping()


def _client_id(conn: object) -> int:
    """The server's id of a connection, asked on it."""
    conn.send_command("CLIENT", "ID")  # type: ignore[attr-defined]
    return int(conn.read_response())  # type: ignore[attr-defined]


@pytest.mark.integration
def test_a_server_gone_is_a_connection_error_then_it_comes_back() -> None:
    with RedisServer() as server:
        client = Client.from_url(server.url, prefix="w")
        q = client.queue("wire")
        q.enqueue(NOOP, 1)
        server.stop()
        with pytest.raises(redis.ConnectionError):
            q.enqueue(NOOP, 2)
        with pytest.raises(RedisUnavailable, match="cannot reach Redis"):
            q.enqueue(NOOP, 3)
        server.restart()  # on the same port
        client.queue("wire")  # the server came back empty: the queue made again
        assert q.enqueue(NOOP, 4).id
        client.close()


@pytest.mark.integration
def test_a_read_only_server_raises_read_only() -> None:
    with RedisServer(extra_args=["--replicaof", "127.0.0.1", "1"]) as replica:
        line = Line.of(redis.Redis.from_url(replica.url))
        assert line is not None
        with pytest.raises(redis.ReadOnlyError):
            line.call(pack("XADD", "s", "*", "a", "b"))
        assert line.call(pack("PING")) == b"PONG"


@pytest.mark.integration
def test_a_forked_child_makes_its_own_connection(client: Client) -> None:
    q = client.queue("wire")
    q.enqueue(NOOP, 1)
    assert client.line is not None
    parents = Forks.count
    pid = os.fork()
    if pid == 0:  # the child: the parent's kept socket is not used
        try:
            q.enqueue(NOOP, 2)
            line = client.line
            ok = line is not None and line.forks == Forks.count == parents + 1
            os._exit(0 if ok else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert q.enqueue(NOOP, 3).id  # the parent's connection is still in step


@pytest.mark.integration
def test_the_async_line_same_bytes_same_errors(redis_url: str, prefix: str, r: redis.Redis) -> None:
    async def go() -> None:
        client = AsyncClient.from_url(redis_url, prefix=prefix)
        try:
            line = client.line
            assert line is not None
            q = await client.queue("wire")
            first = await q.enqueue(NOOP, 1)  # tells the queue about the handler
            job = await q.enqueue(NOOP, {"i": 2})  # on the line
            assert len(line.idle) == 1
            entry_id, fields = r.xrange(q.keys.stream)[-1]
            assert (entry_id.decode(), fields[b"p"]) == (job.id, b'{"i":2}')
            with pytest.raises(ValueError, match="payload"):
                await q.enqueue(NOOP, {"x": object()})
            r.set(f"{prefix}:s", "a string")
            with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
                await line.call(pack("XADD", f"{prefix}:s", "*", "a", "b"))
            conn = line.idle[0][0]
            assert await line.call(pack("PING")) == b"PONG" and line.idle[0][0] is conn
            # the server closes it: seen before the next send, a new connection
            await conn.send_command("CLIENT", "ID")
            assert r.client_kill_filter(_id=int(await conn.read_response())) == 1
            await asyncio.sleep(0.05)  # the loop sees the EOF
            await q.enqueue(NOOP, 3)
            # a call cancelled while it waits for its reply: its connection is dropped
            r.execute_command("CLIENT", "PAUSE", "300", "WRITE")
            call = asyncio.ensure_future(q.enqueue(NOOP, 4))
            await asyncio.sleep(0.05)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            assert line.idle == []
            after = await q.enqueue(NOOP, 5)  # its own reply, not the cancelled call's
            entries = r.xrange(q.keys.stream)
            assert entries[-1][0].decode() == after.id and entries[-1][1][b"p"] == b"5"
            assert first.id == entries[0][0].decode()
        finally:
            await client.close()

    asyncio.run(go())


@pytest.mark.integration
def test_threads_share_the_line_each_call_its_own_reply(client: Client, r: redis.Redis) -> None:
    q = client.queue("wire")
    q.enqueue(NOOP, -1)

    def produce(t: int) -> list[tuple[str, bytes]]:
        return [
            (q.enqueue(NOOP, {"t": t, "i": i}).id, b'{"t":%d,"i":%d}' % (t, i)) for i in range(200)
        ]

    with ThreadPoolExecutor(4) as pool:
        made = [pair for pairs in pool.map(produce, range(4)) for pair in pairs]
    assert client.line is not None and 1 <= len(client.line.idle) <= 4
    stored = {e[0].decode(): e[1][b"p"] for e in r.xrange(q.keys.stream)}
    assert len(made) == 800 and all(stored[job_id] == payload for job_id, payload in made)


@pytest.mark.integration
def test_a_small_pool_keeps_none_out_for_the_line(redis_url: str, prefix: str) -> None:
    client = Client.from_url(redis_url, prefix=prefix, max_connections=1)
    try:
        q = client.queue("wire")
        for i in range(3):  # a pool of 1: each call takes the connection and gives it back
            job = q.enqueue(NOOP, i)
            assert job.status().state == "queued"
        assert client.line is not None and client.line.idle == []
    finally:
        client.close()


@pytest.mark.integration
def test_a_worker_read_on_the_line_is_redis_pys_read(
    redis_url: str, prefix: str, r: redis.Redis
) -> None:
    one, two = f"{prefix}:s1", f"{prefix}:s2"
    for stream in (one, two):
        for group in ("line", "py"):
            r.xgroup_create(stream, group, id="0", mkstream=True)
    r.xadd(one, {"h": "a:b", "p": "1"})
    r.xadd(one, {"h": "a:b", "p": "2", "t": "3.5"})
    r.xadd(two, {"p": "[]"})
    worker = redis.Redis.from_url(redis_url, socket_timeout=10)
    reads = StreamReads.of(worker, "line", "me")
    assert reads is not None
    try:
        streams = {one: ">", two: ">"}
        got = reads(streams, 10, 5)
        assert got == r.xreadgroup("py", "me", streams, count=10, block=5)
        assert len(got[0][1]) == 2 and got[0][1][1][1] == {b"h": b"a:b", b"p": b"2", b"t": b"3.5"}
        assert reads(streams, 10, 5) is None  # nothing new: the block runs out
        assert reads({one: ">"}, 1, None) is None
        with pytest.raises(redis.ResponseError, match="NOGROUP"):
            reads({f"{prefix}:none": ">"}, 1, None)
        r.xadd(one, {"p": "4"})
        assert reads(streams, 10, None)[0][1][0][1] == {b"p": b"4"}  # the line stays good
    finally:
        reads.close()
        worker.close()


class _BrokenLine(Line):
    """A line whose connection fails as the calls are sent."""

    def send_all(self, packed: bytes, n: int) -> Sent:
        raise redis.ConnectionError("reset in the middle of the call")


@pytest.mark.integration
def test_a_step_end_runs_on_the_line_else_again_on_a_pipeline(r: redis.Redis, prefix: str) -> None:
    """The end of a lockstep step (``workers.steps._run_all``): its script calls go on the
    line in one round trip, a script Redis lost is loaded and run, and a line that fails
    sends them again on a pipeline (redis-py's retry, as before the line)."""
    from types import SimpleNamespace

    from queueworks.scripts.bound import Scripts, calls
    from queueworks.workers.lockstep import _replies, _run_all, _send_all

    run = SimpleNamespace(
        r=r, scripts=Scripts(r), log=SimpleNamespace(warning=lambda *a, **k: None)
    )
    key = f"{prefix}:lease"
    r.set(key, "me", px=60_000)
    batch = [calls.lease(key, "me", "renew", 5_000), calls.lease(key, "you", "renew", 5_000)]
    line = Line.of(r)
    assert line is not None
    assert _run_all(run, line, batch) == [True, False]  # type: ignore[arg-type]
    assert len(line.idle) == 1  # it went on the line
    r.script_flush()  # as after a restart or a failover
    assert _run_all(run, line, batch) == [True, False]  # type: ignore[arg-type]
    assert _run_all(run, _BrokenLine(r), batch) == [True, False]  # type: ignore[arg-type]
    assert 0 < r.pttl(key) <= 5_000
    # sent now, read later (a step's end read during the next step); a connection that
    # fails in between sends them again on a pipeline
    sent = _send_all(run, line, batch)  # type: ignore[arg-type]
    assert sent is not None and _replies(run, batch, sent) == [True, False]  # type: ignore[arg-type]
    sent = _send_all(run, line, batch)  # type: ignore[arg-type]
    assert sent is not None and line.idle == []
    sent.sock.close()  # the connection fails before its replies are read
    assert _replies(run, batch, sent) == [True, False]  # type: ignore[arg-type]
    assert line.idle == []  # it was dropped, not kept
    assert _run_all(run, line, batch) == [True, False]  # type: ignore[arg-type]
    line.close()
