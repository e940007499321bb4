"""Issue 9: fuzzing every decoder of data read from Redis (hypothesis).

Whatever bytes another writer left in Redis, a decoder returns a valid value or raises a
``ValueError`` naming what is wrong (pydantic's ``ValidationError``, ``BadMessage``,
``NotJSON`` and ``UnicodeDecodeError`` are all ``ValueError``s) — never ``KeyError``,
``TypeError``, ``RecursionError``, ``OverflowError``, a crash of the process or a hang. In
a worker, a subtask entry that does not decode ends in the dead-letter stream with its
reason and the worker keeps working.

Budget: ~15 s for the file (pure decoders: a few hundred examples each; the Redis-backed
readers: fewer; two end-to-end runs with one worker process).
"""

from __future__ import annotations

import inspect
import json
import math
import random
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from queueworks import Client, TaskSpec, TaskState
from queueworks.dashboard.reader import Reader, history_entry
from queueworks.errors import TaskNotFound
from queueworks.protocol.keys import Keys
from queueworks.protocol.messages import BadMessage, decode_subtask, to_json
from queueworks.protocol.models import StoredSpec, WorkerRecord, parse_handler_path
from queueworks.protocol.records import worker_record
from queueworks.workers.handlers import HandlerRefused, resolve
from tests.conftest import EXAMPLES, Cluster, wait_for

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,  # no .hypothesis/ directory in the repo
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
REDIS_FUZZ = settings(FUZZ, max_examples=max(10, EXAMPLES * 2 // 5))

DEEP = 100_000  # nesting that makes the stdlib's JSON decoder raise RecursionError


def _deep(kind: str) -> bytes:
    if kind == "list":
        return b"[" * DEEP + b"]" * DEEP
    return b'{"a":' * DEEP + b"1" + b"}" * DEEP


# -- strategies ---------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
json_texts = json_values.map(lambda v: json.dumps(v).encode())  # NaN/Infinity included
numbers = st.one_of(
    st.integers(-(10**30), 10**30).map(lambda i: str(i).encode()),
    st.sampled_from([b"7", b" 7", b"7\n", b"1_0", b"+3", b"007", b"0x10", b"\xd9\xa3", b"1e3"]),
    st.just(b"9" * 5000),
)
blobs = st.binary(max_size=64) | numbers | json_texts


@st.composite
def entry_fields(draw: st.DrawFn) -> dict[bytes, bytes]:
    """Fields of a stream entry: sometimes plausible (``i``, ``p``, ``k``), often not."""
    fields = draw(st.dictionaries(st.binary(max_size=6), blobs, max_size=3))
    if draw(st.booleans()):
        fields[b"i"] = draw(numbers | st.binary(max_size=8))
    if draw(st.booleans()):
        fields[b"p"] = draw(json_texts | st.binary(max_size=32))
    if draw(st.booleans()):
        fields[b"k"] = draw(st.binary(max_size=16))
    return fields


def _check_reader(read: Any) -> Any:
    """Call a reader: a value, or a ValueError that says what is wrong (or, for a record
    without the fields every task has, TaskNotFound)."""
    try:
        return read()
    except (ValueError, TaskNotFound) as exc:
        assert str(exc)
        return None


# -- subtask entries ----------------------------------------------------------------------


@pytest.mark.unit
@FUZZ
@given(entry_fields())
@example({b"i": b"1", b"p": b"NaN"})
@example({b"i": b"1", b"p": b'{"x": Infinity}'})
@example({b"i": b"1_0", b"p": b"1"})
@example({b"i": b" 7", b"p": b"1"})
@example({b"i": b"9" * 5000, b"p": b"1"})
@example({b"i": b"1", b"p": b"\xff"})
@example({})
def test_decode_subtask_gives_a_subtask_or_bad_message(fields: dict[bytes, bytes]) -> None:
    try:
        sub = decode_subtask("1-0", fields)
    except BadMessage as exc:
        assert str(exc)
        return
    # what decodes is canonical: an ASCII decimal index, a payload that is strict JSON
    assert fields[b"i"].isdigit() and sub.index == int(fields[b"i"]) >= 0
    assert to_json(sub.payload, "payload")  # NotJSON (NaN, Infinity) would raise here
    assert sub.raw_payload == fields[b"p"].decode()


@pytest.mark.unit
@pytest.mark.parametrize("kind", ["list", "dict"])
def test_decode_subtask_deeply_nested_payload_is_bad_message(kind: str) -> None:
    with pytest.raises(BadMessage, match="not valid JSON"):
        decode_subtask("1-0", {b"i": b"1", b"p": _deep(kind)})


# -- the stored spec ----------------------------------------------------------------------

spec_objects = st.fixed_dictionaries(
    {
        "name": st.text(min_size=1, max_size=10),
        "handler": st.just("tests.handlers:double") | st.text(max_size=30) | json_values,
    },
    optional={
        "max_attempts": st.integers(-5, 2000) | json_values,
        "subtask_timeout": st.floats() | st.integers() | json_values,
        "result_ttl": st.floats() | st.integers() | json_values,
        "partitions": st.integers(-5, 5000) | json_values,
        "min_nodes": st.integers(-2, 5) | json_values,
        "max_nodes": st.none() | st.integers(-2, 5) | json_values,
        "priority": st.integers() | json_values,
        "mode": st.sampled_from(["subtask", "step", "other"]) | json_values,
        "options": json_values,
        "node_selector": json_values,
        "extra": json_values,
    },
).map(lambda d: json.dumps(d).encode())


@pytest.mark.unit
@FUZZ
@given(st.binary(max_size=300) | spec_objects | json_texts)
@example(b'{"name":"n","handler":"m:f","subtask_timeout":1e999}')
@example(b'{"name":"n","handler":"m:f","result_ttl":Infinity}')
@example(b'{"name":"n","handler":"m:f","subtask_timeout":1e300}')
@example(b'{"name":"n","handler":"m:f","options":' + _deep("list") + b"}")
@example(b'{"name":"n","handler":"m:__import__"}')
@example(b'{"name":"n","handler":"m:f","options":{"":Infinity,"q":[NaN,{"x":-Infinity}]}}')
def test_stored_spec_decodes_or_raises_validation_error(raw: bytes) -> None:
    try:
        spec = StoredSpec.model_validate_json(raw)
    except ValidationError as exc:
        assert exc.error_count() >= 1
        return
    # a spec that validates is usable as is: the numbers become Redis milliseconds (XPENDING
    # IDLE, PEXPIRE: signed 64 bit) and timers without overflow
    for seconds in (spec.subtask_timeout, spec.result_ttl):
        assert math.isfinite(seconds) and 0 < seconds * 1000 < 2**47, spec
    parse_handler_path(spec.handler)
    assert StoredSpec.model_validate_json(spec.spec_json()) == spec


# -- records and streams other readers decode ----------------------------------------------

WORKER_FIELDS = [
    b"record",
    b"member_of",
    b"state",
    b"task",
    b"rank",
    b"epoch",
    b"current",
    b"processed",
]
good_record = WorkerRecord(id="w", host="h", pid=1, started_at=1.0).model_dump_json().encode()


@st.composite
def worker_hashes(draw: st.DrawFn) -> dict[bytes, bytes]:
    names = st.sampled_from([*WORKER_FIELDS, b"last_heartbeat"]) | st.binary(max_size=6)
    raw = draw(st.dictionaries(names, blobs, max_size=6))
    if draw(st.booleans()):
        raw[b"record"] = draw(st.just(good_record) | json_texts | st.binary(max_size=40))
    return raw


@pytest.mark.unit
@FUZZ
@given(worker_hashes())
@example({b"state": b"idle"})  # no record
@example({b"record": good_record, b"state": b"sleeping"})
@example({b"record": good_record, b"rank": b"x"})
@example({b"record": b"\xff"})
@example({b"record": good_record, b"member_of": b'["q", 1]'})
@example({b"record": good_record, b"member_of": b"[" * 100_000})
def test_worker_record_decodes_or_raises_value_error(raw: dict[bytes, bytes]) -> None:
    rec = _check_reader(lambda: worker_record(raw))
    assert rec is None or isinstance(rec, WorkerRecord)


@pytest.mark.system
def test_client_workers_skips_a_bad_worker_record(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    """One corrupt worker hash must not hide every worker from ``info`` and the dashboard."""
    good = cluster.worker()
    cluster.wait_workers(r, 1)
    r.zadd(keys.workers, {"corrupt": time.time()})
    r.hset(keys.worker("corrupt"), mapping={"record": "{not json", "state": "idle"})
    assert [w.id for w in client.workers()] == [good.name]


HISTORY_FIELDS = [b"epoch", b"cause", b"ts", b"size", b"worker", b"pause_ms", b"reclaimed"]


@pytest.mark.unit
@FUZZ
@given(
    st.dictionaries(
        st.sampled_from([*HISTORY_FIELDS, b"since_change_ms"]) | st.binary(max_size=6),
        blobs,
        max_size=8,
    )
)
@example({b"epoch": b"1", b"ts": b"nan", b"cause": b"\xff"})
@example({b"size": b"1.5"})
def test_history_entry_decodes_or_raises_value_error(raw: dict[bytes, bytes]) -> None:
    _check_reader(lambda: history_entry(b"1-0", raw))


TASK_FIELDS = [b"name", b"state", b"total", b"done", b"dead", b"epoch", b"priority"]
TASK_FIELDS += [b"min_nodes", b"max_nodes", b"created_at", b"started_at", b"finished_at"]


@pytest.mark.integration
@REDIS_FUZZ
@given(
    record=st.dictionaries(
        st.sampled_from([*TASK_FIELDS, b"error", b"spec"]) | st.binary(max_size=6),
        blobs,
        min_size=1,
        max_size=8,
    ),
    dead=st.lists(entry_fields() | st.dictionaries(st.binary(max_size=8), blobs), max_size=3),
    results=st.dictionaries(
        st.integers(0, 99).map(lambda i: str(i).encode()) | st.binary(max_size=6),
        blobs | st.just(_deep("list")),
        max_size=3,
    ),
    events=st.lists(st.dictionaries(st.binary(max_size=6) | st.just(b"ts"), blobs), max_size=3),
)
@example(record={b"state": b"queued"}, dead=[], results={b"1": _deep("list")}, events=[])
@example(record={b"state": b"running"}, dead=[], results={b"2": b"NaN"}, events=[])
def test_client_readers_decode_or_raise_value_error(
    client: Client,
    r: redis.Redis,
    keys: Keys,
    record: dict[bytes, bytes],
    dead: list[dict[bytes, bytes]],
    results: dict[bytes, bytes],
    events: list[dict[bytes, bytes]],
) -> None:
    """``Task.status``, ``Task.dead_letters``, ``Task.results`` and the dashboard's task row
    and event list, on whatever another writer left in those keys."""
    tk = keys.task("fuzzed")
    r.delete(tk.record, tk.dead, tk.results, keys.events)
    r.hset(tk.record, mapping=record)  # type: ignore[arg-type]
    for fields in dead:
        if fields:
            r.xadd(tk.dead, fields)  # type: ignore[arg-type]
    if results:
        r.hset(tk.results, mapping=results)  # type: ignore[arg-type]
    for fields in events:
        if fields:
            r.xadd(keys.events, fields)  # type: ignore[arg-type]
    task = client.task("fuzzed")
    reader = Reader(client)
    _check_reader(task.status)
    _check_reader(task.dead_letters)
    _check_reader(lambda: dict(task.results()))
    _check_reader(lambda: reader.task_summary("fuzzed"))
    _check_reader(reader.events)


# -- handler paths ------------------------------------------------------------------------

ALLOWED = ("tests.handlers_poison", "queueworks.examples")
handler_paths = st.one_of(
    st.text(max_size=40),
    st.from_regex(
        r"(tests\.handlers_poison|queueworks\.examples|queueworks|os|builtins)"
        r"(\.[a-z_]{1,8})?:[A-Za-z_][A-Za-z0-9_]{0,12}",
        fullmatch=True,
    ),
    st.sampled_from(["tests.handlers_poison:mixed", "queueworks.examples:double"]),
)


@pytest.mark.unit
@FUZZ
@given(handler_paths)
def test_resolve_gives_a_handler_or_handler_refused(path: str) -> None:
    try:
        handler = resolve(path, ALLOWED)
    except HandlerRefused as exc:
        assert str(exc)
        return
    module, _, name = path.partition(":")
    assert any(module == a or module.startswith(a + ".") for a in ALLOWED), path
    assert inspect.isfunction(handler.fn) and handler.fn is getattr(sys.modules[module], name)


# -- end to end: a worker meets what the decoders refuse ------------------------------------


def garbage_entries(n: int, seed: int) -> list[dict[bytes, bytes]]:
    """``n`` random entries that do not decode, and the nastiest known ones."""
    rng = random.Random(seed)
    out: list[dict[bytes, bytes]] = [
        {b"i": b"1", b"p": _deep("list")},
        {b"i": b"2", b"p": b'{"x": NaN}'},
        {b"i": b"1_0", b"p": b'{"x": 1}'},
        {b"i": b"9" * 5000, b"p": b'{"x": 1}'},
        {b"i": b"3", b"p": b"\xff\xfe"},
        {b"\x00": b"\x00"},
    ]
    while len(out) < n:
        fields = {
            rng.randbytes(rng.randint(1, 4)): rng.randbytes(rng.randint(0, 24))
            for _ in range(rng.randint(1, 3))
        }
        if rng.random() < 0.5:
            fields[b"i"] = str(rng.randint(0, 99)).encode()
        try:
            decode_subtask("0-1", fields)
        except BadMessage:
            out.append(fields)
    return out


@pytest.mark.system
def test_worker_rejects_every_malformed_entry_and_keeps_working(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    cluster.controller()
    n_good = 40
    tk = keys.task("fuzzed-e2e")
    bad = garbage_entries(40, seed=9)

    def subtasks() -> Iterator[dict[str, int]]:
        # runs once submit has made the stream, before its first batch: the garbage comes
        # first, so all of it is read while the task is still open
        pipe = r.pipeline(transaction=False)
        for fields in bad:
            pipe.xadd(tk.stream, fields)  # type: ignore[arg-type]
        pipe.execute()
        yield from ({"x": i} for i in range(n_good))

    task = client.submit(
        TaskSpec(
            name="fuzzed",
            handler="tests.handlers:double",
            subtasks=subtasks(),
            max_attempts=2,
        ),
        task_id="fuzzed-e2e",
    )
    worker = cluster.worker()
    status = task.wait(timeout=60)
    assert status.state == TaskState.COMPLETED, status
    assert (status.done, status.dead, status.rejected) == (n_good, 0, len(bad)), status
    letters = task.dead_letters()
    assert len(letters) == len(bad)
    assert {d.reason for d in letters} == {"rejected"}, [d.error for d in letters]
    assert all(d.error.startswith("malformed entry: ") for d in letters)
    assert all(d.error for d in letters)
    assert dict(task.results()) == {i: 2 * i for i in range(n_good)}
    # the same process goes on with the next task
    after = client.submit(
        TaskSpec(name="after", handler="tests.handlers:double", subtasks=[{"x": 1}])
    )
    assert after.wait(timeout=30).done == 1
    assert worker.alive()


@pytest.mark.system
def test_corrupt_records_fail_their_task_and_crash_no_process(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    """A broken task record (spec) fails that task, whoever reads it first (the controller or
    a joining worker); a broken worker record is never scheduled on. No process crashes."""
    first = cluster.worker()
    cluster.wait_workers(r, 1)
    garbage = b'{"name": "corrupt", "handler": 7, "\xff": ['
    # 1. queued (no worker matches its selector) and its spec broken before the controller
    # reads it: a controller reads a task's spec once (a spec never changes), here in the
    # full read it starts with
    queued = client.submit(
        TaskSpec(
            name="queued",
            handler="tests.handlers:double",
            subtasks=[{"x": 1}],
            node_selector={"nobody": "1"},
        )
    )
    r.hset(keys.task(queued.id).record, "spec", garbage)
    controller = cluster.controller()
    # a live worker whose record is garbage: the controller must not choke on it
    r.zadd(keys.workers, {"corrupt": time.time()})
    r.set(keys.worker_heartbeat("corrupt"), "1", ex=60)
    r.hset(keys.worker("corrupt"), mapping={"record": "\xff{", "state": "idle"})
    # 2. running when its spec breaks, and a second worker joins it
    running = client.submit(
        TaskSpec(
            name="running",
            handler="tests.handlers:double_slow",
            subtasks=[{"x": i, "seconds": 0.05} for i in range(400)],
        )
    )
    wait_for(lambda: running.status().done > 0, 20, "running")
    r.hset(keys.task(running.id).record, "spec", garbage)
    second = cluster.worker()
    for task in (queued, running):
        status = task.wait(timeout=30)
        assert status.state == TaskState.FAILED, status
        assert "invalid" in (status.error or ""), status
    after = client.submit(
        TaskSpec(name="after", handler="tests.handlers:double", subtasks=[{"x": 2}])
    )
    assert after.wait(timeout=30).done == 1
    assert controller.alive() and first.alive() and second.alive()


@pytest.mark.system
def test_worker_fails_a_task_whose_spec_it_cannot_read_and_goes_on(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    """No controller here: the worker is handed the broken task directly, so the worker's
    own path is the one tested."""
    worker = cluster.worker()
    cluster.wait_workers(r, 1)
    broken = client.submit(
        TaskSpec(name="broken", handler="tests.handlers:double", subtasks=[{"x": 1}])
    )
    r.hset(keys.task(broken.id).record, "spec", b'{"name": "b", "subtask_timeout": 1e999}')
    r.set(keys.assign(worker.name), broken.id)
    status = broken.wait(timeout=20)
    assert status.state == TaskState.FAILED, status
    assert "stored spec is invalid" in (status.error or ""), status
    good = client.submit(
        TaskSpec(name="good", handler="tests.handlers:double", subtasks=[{"x": 3}])
    )
    r.set(keys.assign(worker.name), good.id)
    assert good.wait(timeout=20).done == 1
    assert dict(good.results()) == {0: 6}
    assert worker.alive()
