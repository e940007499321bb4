"""Hostile stored values on every page of the dashboard: nothing breaks out of its text or
attribute, no element, attribute or script is injected, every link stays on the dashboard.

Every field a page shows gets its own hostile string (quotes of both kinds, ``"><script>``,
an ``on*`` attribute, ``</title>``, a ``javascript:`` link, unicode line separators),
tagged with the field's name so the test also checks that the page really showed it.
Ids and names that the client refuses are written straight into Redis with redis-py, as
another writer (or an older version) could. Each page is parsed with ``html.parser``.

Real Redis; the dashboard runs in-process under uvicorn (as in ``test_dashboard.py``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import pytest
import redis

from queueworks import Client, TaskSpec
from queueworks.protocol.jobrecords import JOB_PROGRESS, JOB_PROGRESS_MESSAGE
from queueworks.protocol.keys import Keys
from queueworks.transport.connection import redact_url
from tests.test_dashboard import TOKEN, csrf_of, make_app

MARK = "QWX"
ATTACK = (
    '"><qwx-injected></qwx-injected><script>alert(1)</script>'
    "\" onmouseover=alert(1) qwx=\" ' onfocus=alert(2) qwx=' </title></textarea>"
    " javascript:alert(3) \u2028\u2029 --><!--"
)
# The elements and attributes the templates write (html.parser gives names in lower case).
TAG_WORDS = (
    "html head meta title link script body header a img nav span form input button div main "
    "section h1 h2 small ul li b p svg line rect table thead tbody tr th td code progress "
    "details summary pre label br select option"
)
ATTR_WORDS = (
    "charset name content lang rel href type src defer class id title method action value "
    "hidden role aria-label viewbox preserveaspectratio x y x1 y1 x2 y2 width height alt max "
    "min required disabled placeholder autocomplete autofocus colspan maxlength aria-pressed "
    "aria-current selected target step"
)
TAGS, ATTRS = frozenset(TAG_WORDS.split()), frozenset(ATTR_WORDS.split())


def hostile(what: str) -> str:
    """The hostile value of one field: its marker first (so truncation keeps it), then the
    attack."""
    return f"{MARK}-{what} {ATTACK}"


@dataclass
class Page:
    """What ``html.parser`` found in one page."""

    tags: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    titles: list[str] = field(default_factory=list)


class Parser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.page = Page()
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.page.tags.append((tag, {k: v or "" for k, v in attrs}))
        self._in_title = tag == "title"

    def handle_endtag(self, tag: str) -> None:
        self._in_title = False

    def handle_data(self, data: str) -> None:
        self.page.text.append(data)
        if self._in_title:
            self.page.titles.append(data)

    def handle_comment(self, data: str) -> None:
        raise AssertionError(f"a comment in the page: {data[:200]!r}")


def parse(body: str) -> Page:
    p = Parser()
    p.feed(body)
    p.close()
    return p.page


def check_page(path: str, body: str, shown: list[str]) -> tuple[Page, list[str]]:
    """No tag, attribute or script beyond the templates' own; every link local; each of the
    fields ``shown`` present (as text or an attribute value). Returns what is wrong."""
    page = parse(body)
    bad = []
    if "<script>alert" in body or "<qwx-injected" in body:
        bad.append(f"{path}: the attack is in the page unescaped")
    scripts = [a for t, a in page.tags if t == "script"]
    if scripts != [{"src": "/static/app.js", "defer": ""}]:
        bad.append(f"{path}: scripts {scripts}")
    for tag, attrs in page.tags:
        if tag not in TAGS:
            bad.append(f"{path}: element <{tag}> {attrs}")
        for name, value in attrs.items():
            if name not in ATTRS and not name.startswith("data-"):
                bad.append(f"{path}: attribute {name}={value!r} on <{tag}>")
            if name in ("href", "action", "src", "data-api") and (
                not value.startswith("/") or value.startswith(("//", "/\\")) or " " in value
            ):
                bad.append(f"{path}: <{tag} {name}={value!r}> is no local address")
    text = "".join(page.text)
    values = [v for _, a in page.tags for v in a.values()]
    for what in shown:
        mark = f"{MARK}-{what} "
        if mark not in text and not any(mark in v for v in values):
            bad.append(f"{path}: {what} not shown")
    return page, bad


# -- the hostile deployment ------------------------------------------------------------------


def copy_record(r: redis.Redis, src: str, dst: str) -> None:
    raw: Any = r.hgetall(src)
    r.hset(dst, mapping=raw)


def plant(client: Client, r: redis.Redis, keys: Keys) -> dict[str, str]:
    """Hostile values in every field the pages show; returns the ids and names to visit."""
    h = hostile
    now = time.time()
    worker = h("worker-id")
    bad_task = h("task-id")
    bad_queue = h("queue-name")

    # a task that waits (no worker has gpu=yes): its record, spec, members, history,
    # pending entries, dead letters, results and events all say something hostile
    task = client.submit(
        TaskSpec(
            name="plain",
            handler="tests.handlers:double",
            subtasks=[{"x": h("payload")}] * 3,
            node_selector={"gpu": "yes"},
        )
    )
    tk = keys.task(task.id)
    spec = json.loads(r.hget(tk.record, "spec") or "{}")
    spec["handler"] = h("handler")
    r.hset(
        tk.record,
        mapping={
            "name": h("task-name"),
            "error": h("task-error") + "\n" + "x" * 100_000,
            "reason": h("task-reason"),
            "rq_job": h("rq-job"),
            "spec": json.dumps(spec),
        },
    )
    r.zadd(tk.members, {worker: 1})
    r.set(tk.heartbeat(worker), repr(now))
    r.xadd(tk.history, {"epoch": 1, "cause": h("cause"), "ts": now, "size": 1, "worker": worker})
    r.xreadgroup(tk.group, h("consumer"), {tk.stream: ">"}, count=1)
    r.xadd(
        tk.dead,
        {
            "index": 1,
            "reason": h("dead-reason"),
            "error": "Traceback\n" + h("dead-error"),
            "attempts": 2,
            "payload": h("dead-payload"),
            "worker": h("dead-worker"),
        },
    )
    deep: Any = h("deep-json")
    for _ in range(30):
        deep = {h("deep-key"): deep}
    deeper: Any = h("deeper-json")
    for _ in range(500):
        deeper = [deeper]
    r.hset(
        tk.results,
        mapping={
            "0": json.dumps({h("result-key"): h("result")}),
            "1": json.dumps(deep),
            "2": json.dumps(deeper),
        },
    )
    r.xadd(
        keys.events,
        {"kind": h("event-kind"), "ts": now, "task": task.id, "worker": worker, h("ev-k"): "v"},
    )
    r.xadd(keys.events, {"kind": "changed", "ts": now, "task": bad_task, "f": h("event-field")})

    # a task whose id the client refuses, in the index
    copy_record(r, tk.record, keys.task(bad_task).record)
    r.zadd(keys.tasks, {bad_task: now})
    r.zadd(keys.queue, {bad_task: now})

    # a worker with a hostile id, host, labels, allow list, queues, memberships, task and
    # current item
    record = {
        "id": worker,
        "host": h("host"),
        "pid": 4711,
        "labels": {h("label-key"): h("label-value")},
        "allow": [h("allow")],
        "queues": [h("queues")],
        "started_at": now,
    }
    r.hset(
        keys.worker(worker),
        mapping={
            "record": json.dumps(record),
            "member_of": json.dumps([h("member-of")]),
            "state": "assigned",
            "task": h("worker-task"),
            "current": h("current"),
            "processed": 3,
            "last_heartbeat": repr(now),
        },
    )
    r.zadd(keys.workers, {worker: now})
    r.set(keys.worker_heartbeat(worker), "1")
    r.set(keys.leader, h("leader") + "#3")

    # a queue whose record, settings, handlers, dead letters and history are hostile
    queue = client.queue("hq", node_selector={"gpu": "yes"})
    waiting = queue.enqueue("tests.handlers:double", {"x": h("job-payload")})
    qk = keys.task("hq")
    qspec = json.loads(r.hget(qk.record, "spec") or "{}")
    qspec["node_selector"] = {h("selector-key"): h("selector-value")}
    r.hset(qk.record, mapping={"reason": h("queue-reason"), "spec": json.dumps(qspec)})
    r.sadd(qk.handlers, h("job-handler"))
    r.xadd(
        qk.dead,
        {
            "job": h("dead-job"),
            "handler": h("dead-handler"),
            "reason": h("job-reason"),
            "error": "Traceback\n" + h("job-error"),
            "attempts": 1,
            "payload": h("job-dead-payload"),
            "worker": h("job-worker"),
            "ts": now,
        },
    )
    # a running job (a member took it) with a hostile handler, member and progress message
    r.xadd(qk.stream, {"h": h("running-handler"), "p": "{}", "t": repr(now)})
    held: Any = r.xreadgroup(qk.group, h("running-worker"), {qk.stream: ">"})
    running = held[0][1][-1][0].decode()  # (the job enqueued above is read too)
    for entry_id, _ in held[0][1]:
        r.hset(
            qk.job(entry_id.decode()),
            mapping={JOB_PROGRESS: "0.5", JOB_PROGRESS_MESSAGE: h("progress")},
        )
    r.xadd(qk.history, {"epoch": 1, "cause": h("queue-cause"), "ts": now, "worker": worker})
    r.xadd(keys.events, {"kind": h("queue-event"), "ts": now, "task": "hq"})
    r.xadd(  # a dead letter's event: its job and reason, and a time that is no number
        keys.events,
        {
            "kind": "dead_lettered",
            "ts": h("ev-ts"),
            "task": "hq",
            "count": "1",
            "job": h("ev-job"),
            "reason": h("ev-reason"),
        },
    )
    # a lost worker whose id, host, task and queues are hostile, one whose fields are
    # not what the controller writes, and the task's history of its drop
    r.xadd(
        keys.workers_lost,
        {
            "worker": h("lost-id"),
            "ts": repr(now),
            "last_heartbeat": h("lost-beat"),
            "host": h("lost-host"),
            "pid": h("lost-pid"),
            "task": h("lost-task"),
            "member_of": json.dumps([h("lost-queue"), "hq", 7]),
        },
    )
    r.xadd(keys.workers_lost, {"worker": "w-odd", "ts": "nan", "member_of": "{"})
    r.xadd(keys.workers_lost, {"worker": "w-odd2", "ts": repr(now), "member_of": h("lost-mo")})
    r.xadd(qk.history, {"epoch": 2, "cause": "dead", "ts": now, "worker": h("lost-id")})
    r.xadd(qk.history, {"epoch": 2, "cause": "rebalanced", "ts": now, "reclaimed": h("recl")})
    copy_record(r, qk.record, keys.task(bad_queue).record)
    r.sadd(keys.queues, bad_queue)
    return {
        "task": task.id,
        "worker": worker,
        "bad_task": bad_task,
        "bad_queue": bad_queue,
        "waiting": waiting.id,
        "running": running,
    }


@pytest.mark.system
def test_hostile_values_stay_text_on_every_page(client: Client, r: redis.Redis, keys: Keys) -> None:
    ids = plant(client, r, keys)
    task, worker, bad_task, bad_queue = (
        ids["task"],
        ids["worker"],
        ids["bad_task"],
        ids["bad_queue"],
    )
    junk = quote(hostile("query"), safe="")
    pages: dict[str, list[str]] = {
        "/": ["task-name", "task-id", "leader", "queue-name", "queue-reason", "event-kind"],
        "/tasks": ["task-name", "task-id"],
        f"/tasks?state=active&page=1&x={junk}": ["task-name", "task-id"],
        f"/tasks?state={junk}&page={junk}": ["task-name"],
        f"/tasks/{task}": [
            "task-name",
            "task-error",
            "task-reason",
            "rq-job",
            "handler",
            "worker-id",
            "current",
            "cause",
            "consumer",
            "dead-reason",
            "dead-error",
            "dead-payload",
            "dead-worker",
            "result-key",
            "result",
            "deep-key",
            "deeper-json",
            "event-kind",
            "ev-k",
        ],
        "/queues": ["queue-name", "queue-reason"],
        "/queues/hq": [
            "queue-reason",
            "selector-key",
            "selector-value",
            "job-handler",
            "dead-job",
            "dead-handler",
            "job-reason",
            "job-error",
            "job-dead-payload",
            "job-worker",
            "running-handler",
            "running-worker",
            "progress",
            "queue-cause",
            "queue-event",
            "ev-job",
            "ev-reason",
        ],
        "/workers": [
            "worker-id",
            "host",
            "label-key",
            "label-value",
            "allow",
            "queues",
            "member-of",
            "worker-task",
            "current",
            "lost-id",
            "lost-host",
            "lost-task",
            "lost-queue",
        ],
        "/queues/hq?jobs=running": ["running-handler", "running-worker", "progress"],
        f"/queues/hq/jobs/{ids['waiting']}": ["job-payload"],
        f"/queues/hq/jobs/{ids['running']}": ["running-handler", "running-worker", "progress"],
        f"/search?q={junk}": ["query"],
        f"/tasks/{quote(bad_task, safe='')}": ["task-id"],
        f"/queues/{quote(bad_queue, safe='')}": ["queue-name"],
        f"/no/such/page/{junk}": ["query"],
    }
    refused = (quote(bad_task, safe=""), quote(bad_queue, safe=""))
    problems: list[str] = []
    parsed: dict[str, Page] = {}
    with make_app(client) as web:
        for path, shown in pages.items():
            got = web.get(path)
            refuses = path.endswith(refused) or path.startswith(("/no/", "/search"))
            expected = (400, 404) if refuses else (200,)
            assert got.status_code in expected, (path, got.status_code, got.text[:500])
            parsed[path], bad = check_page(path, got.text, shown)
            problems += bad
        assert problems == [], "\n".join(p[:300] for p in problems)
        # the JSON API returns the same values, unharmed
        detail = web.get(f"/api/tasks/{task}").json()
        assert detail["task"]["name"] == hostile("task-name")
        assert detail["handler"] == hostile("handler")
        api = web.get("/api/workers").json()
        (lost,) = [w for w in api["lost"] if w["id"] == hostile("lost-id")]
        assert (lost["host"], lost["task"], lost["pid"]) == (
            hostile("lost-host"),
            hostile("lost-task"),
            None,
        )
        assert lost["member_of"] == [hostile("lost-queue"), "hq", "7"]
        hq, seven = lost["reclaims"]  # (a name of no task is looked up, and says so)
        assert (hq["task"], hq["epoch"], hq["reclaimed"]) == ("hq", 2, None)
        assert seven == {"task": "7", "epoch": None, "pruned_at": None, "reclaimed": None}
        events = web.get("/api/events?count=1000").json()["events"]
        (ev,) = [e for e in events if e["fields"].get("job") == hostile("ev-job")]
        assert ev["ts"] == 0 and ev["fields"]["reason"] == hostile("ev-reason")
        named = [e for e in events if e["task"] == task]
        assert named and all(e["task_name"] == hostile("task-name") for e in named)

    # attribute values hold the stored values whole
    page = parsed[f"/tasks/{task}"]
    assert hostile("task-name") in "".join(page.titles)
    (row,) = [a for t, a in page.tags if t == "tr" and a.get("data-worker")]
    assert row["data-worker"] == worker
    titles = [a["title"] for t, a in page.tags if t == "code" and "title" in a]
    assert json.dumps({hostile("result-key"): hostile("result")}, ensure_ascii=False) in titles
    page = parsed["/tasks"]
    assert {a["data-task"] for t, a in page.tags if t == "tr" and "data-task" in a} == {
        task,
        bad_task,
    }
    page = parsed["/workers"]
    (form,) = [a for t, a in page.tags if t == "form" and "data-confirm" in a]
    assert form["data-confirm"].startswith(f"Drain worker {worker}?")
    assert form["action"] == f"/workers/{quote(worker, safe='')}/drain"
    page = parsed["/workers"]
    lost = {a["data-lost-worker"] for t, a in page.tags if t == "tr" and "data-lost-worker" in a}
    assert lost == {hostile("lost-id"), "w-odd2"}  # (w-odd: no time it was lost)
    assert {a["data-reclaim"] for t, a in page.tags if "data-reclaim" in a} >= {"hq"}
    page = parsed["/queues/hq"]
    links = {a["href"] for t, a in page.tags if t == "a" and "href" in a}
    assert f"/queues/hq/jobs/{quote(hostile('ev-job'), safe='')}" in links
    page = parsed["/queues"]
    assert {a["data-queue"] for t, a in page.tags if t == "tr" and "data-queue" in a} == {
        "hq",
        bad_queue,
    }


@pytest.mark.integration
def test_the_login_page_keeps_a_hostile_next_as_text_and_never_leaves(client: Client) -> None:
    nxt = "/tasks?x=" + hostile("next")
    with make_app(client, token=TOKEN) as web:
        got = web.get("/login", params={"next": nxt})
        assert got.status_code == 200
        page, bad = check_page("/login", got.text, [])
        assert bad == []
        (form,) = [
            a for t, a in page.tags if t == "form" and a.get("action", "").startswith("/login")
        ]
        assert parse_qs(urlsplit(form["action"]).query) == {"next": [nxt]}
        csrf = csrf_of(web)
        for target, lands in (
            (nxt, nxt),
            ("/\\evil.example/", "/"),  # a browser reads /\ as //: another site
            ("//evil.example/", "/"),
            ("https://evil.example/", "/"),
            ("/tasks\r\nSet-Cookie: x=1", "/"),
            ("/\t/evil.example/", "/"),  # browsers drop the tab: //evil.example/
        ):
            web.cookies.delete("qw_session")
            done = web.post(
                "/login",
                params={"next": target},
                data={"token": TOKEN, "csrf_token": csrf},
                follow_redirects=False,
            )
            assert done.status_code == 303, (target, done.text[:300])
            assert unquote(done.headers["location"]) == lands, target


@pytest.mark.unit
def test_redact_url_is_linear_in_the_text() -> None:
    """Every error text a page shows goes through ``redact_url``: a long one (a letter run,
    many schemes) once took seconds per 10 KB, growing with the square of its length."""
    texts = ["x" * 200_000, "redis://" * 25_000, "redis://:pw@h " + "a@" * 100_000]
    started = time.monotonic()
    for value in texts:
        redact_url(value)
    assert time.monotonic() - started < 10  # quadratic: minutes
    assert redact_url("e " + "x" * 5000 + " redis://u:pw@h:1/0 " + "y" * 5000).count("***") == 1
