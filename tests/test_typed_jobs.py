"""Jobs are ordinary typed Python functions (``@job``): arguments checked at the call and
carried as JSON by their annotations, results decoded by the return annotation, calls
checked by mypy. Real Redis, real worker processes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
import redis

from queueworks import AsyncClient, Call, Client, TaskSpec
from queueworks.errors import JobFailed
from queueworks.job_functions import Signature
from tests.conftest import ROOT, Cluster
from tests.handlers_typed import (
    Color,
    Everything,
    Order,
    Point,
    add,
    add_later,
    everything,
    named,
    square,
    who,
    wrong_return,
)

ALLOW = ("tests.handlers_typed",)


def snapshot(r: redis.Redis, prefix: str) -> dict[bytes, Any]:
    """Every key of the test's prefix and its value (DUMP), to see that nothing changed."""
    return {key: r.dump(key) for key in r.scan_iter(match=f"{prefix}:*")}


# -- at the call: no Redis ------------------------------------------------------------------


@pytest.mark.unit
def test_a_call_checks_its_arguments_against_the_signature() -> None:
    call = add.call(2, 3, note="x")
    assert isinstance(call, Call) and call.path == "tests.handlers_typed:add"
    assert json.loads(call.body) == {"args": [], "kwargs": {"a": 2, "b": 3, "note": "x"}}
    assert add(2, 3) == 5  # still a plain call
    with pytest.raises(ValueError, match=r"^add\(\): b: Input should be a valid integer.*'three'"):
        add.call(2, "three")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^add\(\): b: Field required$"):
        add.call(2)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match=r"^add\(\): colour: Extra inputs"):
        add.call(2, 3, colour="red")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match=r"takes 2 positional arguments but 3"):
        add.call(1, 2, 3)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match=r"'ctx' is given by the worker"):
        add_later.call(1, 2, ctx=None)


@pytest.mark.unit
def test_the_context_is_found_by_annotation_not_position() -> None:
    sig = Signature(who.__wrapped__)
    assert sig.ctx == "job" and sig.positional == ["n"]
    args, kwargs = sig.decode_call({"args": [4]}, "CTX")
    assert (args, kwargs) == ([], {"n": 4, "job": "CTX"})


@pytest.mark.integration
def test_a_typed_function_is_enqueued_or_scheduled_as_a_call(client: Client) -> None:
    q = client.queue("typed-misuse")
    with pytest.raises(ValueError, match=r"add is a typed job function: enqueue add\.call"):
        q.enqueue(add, {"a": 1, "b": 2})
    with pytest.raises(ValueError, match=r"carries its arguments; give no payload"):
        q.enqueue(add.call(1, 2), {"a": 1})
    every = q.schedule("sums", add.call(1, 2, note="x"), every=60)  # each job that call
    assert every.handler == "tests.handlers_typed:add"
    assert every.payload == {"args": [], "kwargs": {"a": 1, "b": 2, "note": "x"}}


@pytest.mark.integration
def test_a_wrong_argument_names_the_parameter_and_nothing_is_sent(
    client: Client, r: redis.Redis, prefix: str
) -> None:
    q = client.queue("typed-wrong")
    q.enqueue(add.call(1, 2))  # the queue knows the handler: the next would be one XADD
    before = snapshot(r, prefix)
    with pytest.raises(ValueError, match=r"^add\(\): b: Input should be a valid integer"):
        q.enqueue(add.call(1, "two"))  # type: ignore[arg-type]
    wrong: list[Any] = ["not a time"] * 9
    calls = (add.call(1, 2) if i == 0 else everything.call(*wrong) for i in range(2))
    with pytest.raises(ValueError, match=r"^everything\(\): when: .*; day: .*; points: "):
        q.enqueue_many(calls)
    assert snapshot(r, prefix) == before


@pytest.mark.unit
def test_the_allow_list_decides_for_the_decorated_functions_module() -> None:
    from queueworks.protocol.models import NOT_ALLOWED
    from workers.handlers import HandlerRefused, resolve

    found = resolve("tests.handlers_typed:add", ["tests.handlers_typed"])
    assert found.fn({"args": [1, 2]}) == 3 and not found.takes_ctx  # through its signature
    assert resolve("tests.handlers_typed:who", ["tests"]).takes_ctx
    with pytest.raises(HandlerRefused) as refused:
        resolve("tests.handlers_typed:add", ["tests.handlers"])  # not tests.handlers_typed
    assert refused.value.kind == NOT_ALLOWED
    with pytest.raises(HandlerRefused, match=r"defined in 'tests\.handlers_typed'") as refused:
        resolve("tests.handlers_typed_reexport:add", ["tests.handlers_typed_reexport"])
    assert refused.value.kind == NOT_ALLOWED


# -- through a real worker ------------------------------------------------------------------


@pytest.mark.system
def test_each_supported_type_round_trips_through_a_worker(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    cluster.worker(allow=ALLOW)
    cluster.wait_workers(r, 1)
    q = client.queue("typed")
    order = Order(id=uuid4(), amount=Decimal("12.10"))
    when = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    call = everything.call(
        when,
        date(2026, 1, 2),
        order.id,
        Decimal("0.1"),
        Color.BLUE,
        Point(1, 2.5),
        order,
        orders=[order, order],
        points={"a": Point(3, 4.0)},
    )
    j = q.enqueue(call)
    got = j.result(timeout=60)
    assert isinstance(got, Everything)
    assert got.when == when and got.day == date(2026, 1, 2) and got.uid == order.id
    assert got.amount == Decimal("0.1") and got.color is Color.BLUE
    assert got.point == Point(1, 2.5) and got.order == order and got.orders == [order, order]
    assert got.points == {"a": Point(3, 4.0)}
    assert got.seen == {  # what the function was given, on the worker
        "when": "datetime",
        "day": "date",
        "uid": "UUID",
        "amount": "Decimal",
        "color": "Color",
        "point": "Point",
        "order": "Order",
        "orders": "list",
        "points": "dict",
        "orders[0]": "Order",
        "points[a]": "Point",
    }
    # every option as for any job, and the result typed whatever the path
    assert q.enqueue(add.call(2, 3, note="xy"), delay=0.2).result(timeout=60) == 7
    keyed = q.enqueue(named.call("k"), key="one-key")
    assert keyed.result(timeout=60) == "k/none"
    jobs = q.enqueue_many(add.call(i, i) for i in range(50))
    assert [j.result(timeout=60) for j in jobs] == [2 * i for i in range(50)]
    ctx_job = q.enqueue(who.call(9))
    assert ctx_job.result(timeout=60) == f"{ctx_job.id}:9"
    # the wire form as another language (or the CLI) writes it: by position, by name
    raw = q.enqueue("tests.handlers_typed:named", {"args": ["p"], "kwargs": {"note": "n"}})
    assert raw.result(timeout=60) == "p/n"
    # a wrong payload or a wrong return value: the job dies, the reason names it
    bad = q.enqueue("tests.handlers_typed:add", {"args": [1], "kwargs": {"b": "x"}})
    with pytest.raises(JobFailed, match=r"BadArguments: add\(\): b: Input should be a valid"):
        bad.result(timeout=60)
    with pytest.raises(JobFailed, match=r"TypeError: wrong_return\(\) returned str, not what"):
        q.enqueue(wrong_return.call(1)).result(timeout=60)


@pytest.mark.system
def test_async_job_functions_with_the_async_client(
    cluster: Cluster, redis_url: str, prefix: str, r: redis.Redis
) -> None:
    cluster.worker(allow=ALLOW)
    cluster.wait_workers(r, 1)

    async def go() -> tuple[int, list[int]]:
        async with AsyncClient.from_url(redis_url, prefix=prefix) as ac:
            aq = await ac.queue("typed-async")
            one = await aq.enqueue(add_later.call(2, 3))
            many = await aq.enqueue_many([add.call(i, 1) for i in range(5)])
            return await one.result(timeout=60), [await m.result(timeout=60) for m in many]

    assert asyncio.run(go()) == (1005, [1, 2, 3, 4, 5])  # with its ctx (attempt 1)
    assert asyncio.run(add_later(1, 1)) == 2  # still a plain (async) call


@pytest.mark.system
def test_typed_subtasks_of_a_task(cluster: Cluster, client: Client, r: redis.Redis) -> None:
    cluster.controller()
    cluster.worker(allow=ALLOW)
    cluster.wait_workers(r, 1)
    task = client.submit(
        TaskSpec(name="squares", handler=square, subtasks=[square.call(i) for i in range(20)])
    )
    status = task.wait(timeout=120)
    assert (status.done, status.dead) == (20, 0)
    assert dict(task.results()) == {i: i * i for i in range(20)}


@pytest.mark.system
def test_cli_enqueues_a_typed_call(cluster: Cluster, client: Client, r: redis.Redis) -> None:
    cluster.worker(allow=ALLOW)
    cluster.wait_workers(r, 1)
    named_path = "tests.handlers_typed:named"
    argv = [sys.executable, "-m", "queueworks", "enqueue", "typed-cli", named_path]
    done = subprocess.run(
        [*argv, "--args", '["a"]', "--kwargs", '{"note": "x"}', "--wait", "--timeout", "60"],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == '"a/x"'
    wrong = subprocess.run(
        [*argv, "--args", '{"a": 1}'], env=cluster.env, capture_output=True, text=True
    )
    assert wrong.returncode != 0 and "--args" in wrong.stderr


# -- mypy -------------------------------------------------------------------------------------


@pytest.mark.unit
def test_mypy_flags_a_wrong_call_and_knows_the_result_type(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """\
        from queueworks import AsyncClient, Client, TaskSpec
        from tests.handlers_typed import add, add_later, named

        q = Client.from_url("redis://localhost:6379/0").queue("q")
        reveal_type(q.enqueue(add.call(1, 2)).result())
        reveal_type(q.enqueue(named.call("x"), delay=5).result())
        reveal_type(q.enqueue("m:f", {}).result())
        add.call(1, "three")
        reveal_type(add(1, 2))
        reveal_type([j.result() for j in q.enqueue_many(named.call(s) for s in "ab")])

        async def main(client: AsyncClient) -> None:
            aq = await client.queue("q")
            j = await aq.enqueue(add_later.call(1, 2))
            reveal_type(await j.result())

        TaskSpec(name="t", handler=add, subtasks=[add.call(i, 1) for i in range(3)])
        """
    )
    path = tmp_path / "typed_calls.py"
    path.write_text(code)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    said = {  # line: what mypy says (its builtins without their module, as mypy 2 writes them)
        int(line.split(":")[1]): line.split(": ", 1)[1].replace("builtins.", "")
        for line in done.stdout.splitlines()
        if line.startswith(str(path))
    }
    assert said == {
        5: 'note: Revealed type is "int"',
        6: 'note: Revealed type is "str"',
        7: 'note: Revealed type is "Any"',
        8: 'error: Argument 2 to "call" of "JobFunctionBase" has incompatible type "str"; '
        'expected "int"  [arg-type]',
        9: 'note: Revealed type is "int"',
        10: 'note: Revealed type is "list[str]"',
        15: 'note: Revealed type is "int"',
    }, done.stdout


@pytest.mark.integration
def test_the_dashboard_shows_a_typed_jobs_arguments_by_name(client: Client) -> None:
    from tests.test_dashboard import make_app

    q = client.queue("typed-dash")
    later = q.enqueue(add.call(2, 3, note="<b>hi</b>"), delay=600)  # its payload is kept
    wire = q.enqueue("tests.handlers_typed:named", {"args": ["p"], "kwargs": {"note": "n"}})
    plain = q.enqueue("tests.handlers:double", {"args": 1, "x": 2})
    with make_app(client) as web:
        html = web.get(f"/queues/typed-dash/jobs/{later.id}").text
        table = html.split('id="job-arguments"', 1)[1].split("</table>", 1)[0]
        assert "<th>a</th><td><code>2</code>" in table and "<th>b</th><td><code>3</code>" in table
        assert "<th>note</th><td><code>&#34;&lt;b&gt;hi&lt;/b&gt;&#34;</code>" in table, table
        shown = web.get(f"/queues/typed-dash/jobs/{wire.id}").text
        assert "<th>#0</th><td><code>&#34;p&#34;</code>" in shown
        assert "<th>note</th>" in shown
        assert 'id="job-arguments"' not in web.get(f"/queues/typed-dash/jobs/{plain.id}").text
