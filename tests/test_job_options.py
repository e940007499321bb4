"""A job's own options (``queueworks.protocol.job_options``): checked where they enter, carried as
one ``o`` field on the job's entry (or its record while it waits off the stream), absent
for a job that has none."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
import redis

from queueworks import Client
from queueworks.protocol.job_options import NO_OPTIONS, JobOptions
from queueworks.protocol.jobrecords import decode_entry, entry_job
from queueworks.protocol.keys import Keys

NOOP = "tests.handlers:double"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"retry_delay": -1}, "retry_delay"),
        ({"retry_delay": float("nan")}, "retry_delay"),
        ({"retry_backoff": 0.5}, "retry_backoff"),
        ({"retry_max_delay": float("inf")}, "retry_max_delay"),
        ({"key": ""}, "key"),
        ({"key": "x" * 257}, "key is too long"),
        ({"key": "a\nb"}, "control character"),
        ({"key": "a\x85b"}, r"key 'a\x85b' holds a control character"),  # C1: NEL
        ({"key": "\x9b[2J"}, r"key '\x9b[2J' holds a control character"),  # C1: CSI
        ({"group": "tenant\x85"}, r"group 'tenant\x85' holds a control character"),
        ({"group": "\x7f"}, r"group '\x7f' holds a control character"),
        ({"unique_for": 5}, "unique_for needs a key"),
        ({"key": "k", "unique_for": 0}, "unique_for"),
    ],
)
def test_bad_options_are_refused_naming_them(given: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        JobOptions.given(**given)


@pytest.mark.unit
def test_options_round_trip_and_bad_stored_values_read_as_none() -> None:
    assert JobOptions.given() is None
    options = JobOptions.given(retry_delay=2, retry_backoff=3, key="invoice-42")
    assert options is not None
    assert options.json() == '{"retry_delay":2.0,"retry_backoff":3.0,"key":"invoice-42"}'
    assert JobOptions.parse(options.json()) == options
    assert JobOptions.parse(b'{"retry_delay": "soon", "key": 7, "unique_for": 1e99}') == (
        JobOptions()
    )
    assert JobOptions.parse("not json") == JobOptions.parse("[1]") == JobOptions()


@pytest.mark.unit
def test_an_entrys_options_are_parsed_once_with_it_and_a_plain_one_makes_none() -> None:
    plain = {b"h": b"m:f", b"p": b"{}", b"t": b"1.5"}
    own = {**plain, b"o": b'{"group":"g","key":"k","retry_delay":2}'}
    traced = {**plain, b"o": b'{"tp":"00-' + b"1" * 32 + b"-" + b"2" * 16 + b'-01"}'}
    for decode in (decode_entry, entry_job):
        entry = decode("1-0", own)
        assert entry is not None and entry.options == own[b"o"].decode()
        assert entry.job_options == JobOptions(retry_delay=2.0, key="k", group="g")
        for fields in (plain, traced):  # the shared object: nothing made
            other = decode("1-0", fields)
            assert other is not None and other.job_options is NO_OPTIONS
    assert decode_entry("1-0", plain).options == ""
    assert decode_entry("1-0", own)._replace(payload="x").job_options.group == "g"


@pytest.mark.integration
def test_options_ride_on_the_entry_and_on_a_delayed_jobs_record(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    q = client.queue("options")
    tk = keys.task("options")
    plain = q.enqueue(NOOP, {"x": 1})
    own = q.enqueue(NOOP, {"x": 2}, retry_delay=1.5)
    entries = dict(r.xrange(tk.stream))
    assert set(entries[plain.id.encode()]) == {b"h", b"p", b"t"}  # none: no field
    assert entries[own.id.encode()][b"o"] == b'{"retry_delay":1.5}'

    later = q.enqueue(NOOP, {"x": 3}, delay=0.2, retry_backoff=4)
    assert r.hget(tk.job(later.id), "o") == b'{"retry_backoff":4.0}'
    deadline = time.time() + 5
    while r.xlen(tk.stream) < 3 and time.time() < deadline:
        time.sleep(0.05)
        due = [m.decode() for m in r.zrangebyscore(tk.scheduled, 0, time.time())]
        if due:
            client.scripts.promote_due(tk, due)
    moved = [f for _, f in r.xrange(tk.stream) if f.get(b"j") == later.id.encode()]
    assert moved and moved[0][b"o"] == b'{"retry_backoff":4.0}'


@pytest.mark.integration
def test_a_jobs_own_options_show_in_its_detail_and_on_its_page(client: Client) -> None:
    from tests.test_dashboard import make_app

    q = client.queue("options")
    own = q.enqueue(NOOP, {"x": 1}, key="invoice-42", unique_for=60, retry_delay=2)
    later = q.enqueue(NOOP, {"x": 2}, delay=60, retry_backoff=3)
    plain = q.enqueue(NOOP, {"x": 3})
    assert own.detail().options == {"retry_delay": 2.0, "key": "invoice-42", "unique_for": 60.0}
    assert later.detail().options == {"retry_backoff": 3.0}  # from its record
    assert plain.detail().options == {}
    with make_app(client) as web:
        page = web.get(f"/queues/options/jobs/{own.id}").text
        assert "key=invoice-42" in page and "retry_delay=2.0" in page
        assert 'id="job-options"' not in web.get(f"/queues/options/jobs/{plain.id}").text
