"""The floor of a job's CPU: what one round trip per job costs at least, on a bare socket.

``bench.job_cpu`` runs it beside queueworks. The producer writes RESP by hand on a plain
socket: one ``XADD stream * h <handler> p <payload>`` per job (the command's bytes built
once, only the payload changes), reads its reply, sends the next. Each consumer reads in
batches (``XREADGROUP COUNT 100 BLOCK``) and stores every job's result (``HSET`` of its own
key + ``EXPIRE``), then ``XACK`` and ``XDEL`` of the batch and a done counter, pipelined in
one round trip per batch. No job record, handler lookup, retry or membership: what any
queue on one stream that keeps a result per job costs at least.

    python -m bench.resp_floor produce URL N       # prints "go", waits a line, sends N
    python -m bench.resp_floor consume URL NAME    # one consumer, until killed
"""

from __future__ import annotations

import contextlib
import socket
import sys
import time
from urllib.parse import urlsplit

import redis

STREAM, GROUP, DONE = b"floor:jobs", b"floor", "floor:done"
HANDLER = b"queueworks.examples:noop"
COUNT, BLOCK_MS, RESULT_TTL = 100, 1000, 86_400


def bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


def xadd_head() -> bytes:
    """``XADD`` up to its last argument, the payload."""
    words = [b"XADD", STREAM, b"*", b"h", HANDLER, b"p"]
    return b"*%d\r\n" % (len(words) + 1) + b"".join(bulk(w) for w in words)


def make_group(r: redis.Redis) -> None:
    with contextlib.suppress(redis.ResponseError):  # the group exists
        r.xgroup_create(STREAM, GROUP, id="0", mkstream=True)


def produce(url: str, n: int) -> None:
    """Send ``n`` jobs, one round trip each, once a line arrives on stdin; print the
    producer's CPU time for them, then wait until the consumers counted them done."""
    r = redis.Redis.from_url(url)
    make_group(r)
    where = urlsplit(url)
    sock = socket.create_connection((where.hostname, where.port or 6379))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    head = xadd_head()
    print("go", flush=True)
    sys.stdin.readline()
    t0 = time.process_time()
    for i in range(n):
        payload = b"%d" % i
        sock.sendall(head + b"$%d\r\n%s\r\n" % (len(payload), payload))
        reply = sock.recv(64)
        while not reply.endswith(b"\r\n") or reply.count(b"\r\n") < 2:
            reply += sock.recv(64)  # a reply split across reads (rare)
        if reply[:1] != b"$":
            raise RuntimeError(f"XADD: {reply!r}")
    spent = time.process_time() - t0
    deadline = time.time() + 120
    while int(r.get(DONE) or 0) < n and time.time() < deadline:
        time.sleep(0.01)
    print("done", spent, int(r.get(DONE) or 0), flush=True)


def consume(url: str, name: str) -> None:
    """Read, store each result, ack and delete, one round trip per batch, until killed."""
    r = redis.Redis.from_url(url, socket_timeout=30)
    make_group(r)
    while True:
        reply = r.xreadgroup(GROUP, name, {STREAM: ">"}, count=COUNT, block=BLOCK_MS)
        if not reply:
            continue
        entries = reply[0][1]
        pipe = r.pipeline(transaction=False)
        ids = []
        for entry_id, fields in entries:
            key = b"floor:result:" + entry_id
            pipe.hset(key, b"r", fields[b"p"])
            pipe.expire(key, RESULT_TTL)
            ids.append(entry_id)
        pipe.xack(STREAM, GROUP, *ids)
        pipe.xdel(STREAM, *ids)
        pipe.incrby(DONE, len(ids))
        pipe.execute()


if __name__ == "__main__":
    if sys.argv[1] == "produce":
        produce(sys.argv[2], int(sys.argv[3]))
    else:
        consume(sys.argv[2], sys.argv[3])
