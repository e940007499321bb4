"""Issue 16: the ``queueworks`` command tells the truth in one line.

Every expected error is one line on stderr and a non-zero exit, against real servers: a
closed port, a password-protected server, a bad URL, a bad handler path, an unknown task, a
missing extra, SIGTERM to a worker that never reached Redis; ``--debug`` shows the
traceback. ``submit --wait`` exits 0 only when nothing died, and names the reason; ``dead``
lists, prints JSON and requeues. ``--help`` names every option's default and variable.

Budget: ~25 s for the file.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import click
import pytest
import redis
import structlog
from click.testing import CliRunner

from queueworks import Client, TaskSpec, TaskState
from queueworks.cli import main
from queueworks.contrib.redis_server import RedisServer, free_port
from queueworks.protocol.keys import Keys
from queueworks.protocol.models import WorkerRecord
from queueworks.protocol.records import registered_worker
from queueworks.queue.queue_settings import QueueSettings
from queueworks.settings import Settings
from tests.conftest import ROOT, Cluster, wait_for

pytestmark = pytest.mark.system

PREFIX_ENV = ("QUEUEWORKS_REDIS_URL", "QUEUEWORKS_PREFIX", "QUEUEWORKS_DEBUG", "QUEUEWORKS_QUEUES")


# Commands that run until stopped, or install signal handlers: always a process of their own.
PROCESS_COMMANDS = {"worker", "controller", "demo", "redis", "dashboard", "autoscale"}


def cli(
    args: Sequence[str],
    url: str,
    prefix: str = "qw",
    *,
    code: str | None = None,
    env: dict[str, str] | None = None,
    process: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``queueworks ARGS`` against ``url``, with ``env`` added to the environment: in this
    process through click's runner (what the command prints, its exit code, and a traceback
    on stderr as ``python -m`` would print it), or as ``python -m queueworks ARGS`` (or
    ``python -c CODE ARGS``) when asked (``process``), given code, or for a command that
    runs until stopped. In-process costs milliseconds where a process costs a Python start
    and imports: the suite runs a few hundred of these."""
    given = {"QUEUEWORKS_REDIS_URL": url, "QUEUEWORKS_PREFIX": prefix, **(env or {})}
    if process or code or PROCESS_COMMANDS.intersection(args) or "--watch" in args:
        return cli_process(args, given, code)
    return cli_in_process(args, given)


def cli_process(
    args: Sequence[str], given: dict[str, str], code: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in PREFIX_ENV}
    entry = ["-c", code] if code else ["-m", "queueworks"]
    return subprocess.run(
        [sys.executable, *entry, *args],
        env={**env, **given},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def cli_in_process(args: Sequence[str], given: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env: dict[str, str | None] = {k: None for k in PREFIX_ENV if k not in given}
    env.update(given)
    logging = structlog.get_config()  # the command configures logging for its process
    try:
        res = CliRunner().invoke(main, list(args), env=env, prog_name="queueworks")
    finally:
        structlog.configure(**logging)
    stderr = res.stderr
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        stderr += "".join(traceback.format_exception(res.exception))  # as Python prints it
    return subprocess.CompletedProcess(["queueworks", *args], res.exit_code, res.stdout, stderr)


def one_line_error(res: subprocess.CompletedProcess[str], code: int, *pieces: str) -> str:
    """Exit ``code``, and stderr is exactly one line that says ``pieces``."""
    err = res.stderr.strip()
    assert res.returncode == code, (res.returncode, res.stdout[-500:], err[-1500:])
    assert "Traceback" not in err and "\n" not in err, err[-1500:]
    assert err.startswith("error: "), err
    for piece in pieces:
        assert piece in err, (piece, err)
    return err


@pytest.fixture(scope="module")
def closed_url() -> str:
    return f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there


@pytest.fixture(scope="module")
def locked() -> Iterator[RedisServer]:
    with RedisServer(password="Pw-" + uuid.uuid4().hex[:8]) as server:
        server.start()
        yield server


# -- one line per expected error -------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [["info"], ["submit", "queueworks.examples:double", "--count", "2"], ["dead", "abc"]],
    ids=["info", "submit", "dead"],
)
def test_unreachable_redis_is_one_line(closed_url: str, args: list[str]) -> None:
    one_line_error(cli(args, closed_url), 1, f"cannot reach Redis at {closed_url}", "refused")


def test_debug_shows_the_traceback(closed_url: str) -> None:
    res = cli(["--debug", "info"], closed_url)
    assert res.returncode == 1 and "Traceback" in res.stderr, res.stderr[-800:]
    assert "queueworks.errors.RedisUnavailable: cannot reach Redis at" in res.stderr


def test_auth_failure_is_one_line_without_the_password(locked: RedisServer) -> None:
    password = str(locked.password)
    port = locked.port
    wrong = f"redis://:not-{password}@127.0.0.1:{port}/0"
    err = one_line_error(cli(["info"], wrong), 1, "refused the credentials", "***@")
    assert password not in err
    bare = f"redis://127.0.0.1:{port}/0"  # no password at all: NOAUTH
    one_line_error(cli(["dead", "abc"], bare), 1, f"Redis at {bare} refused the credentials")


def test_bad_url_handler_and_setting_are_usage_errors(closed_url: str) -> None:
    one_line_error(cli(["info", "--redis", "localhost:6379"], closed_url), 2, "invalid Redis URL")
    one_line_error(
        cli(["submit", "myapp.dubble", "--count", "1"], closed_url),
        2,
        "handler 'myapp.dubble' must look like 'package.module:function'",
    )
    one_line_error(cli(["submit", "myapp:__init__", "--count", "1"], closed_url), 2, "dunder name")
    one_line_error(
        cli(["worker", "--allow", "x", "--heartbeat-ttl", "0.5"], closed_url),
        2,
        "invalid setting: heartbeat_ttl (0.5) must be greater than heartbeat_interval",
    )
    one_line_error(cli(["submit", "x:y"], closed_url), 2, "give exactly one of --count or --jsonl")
    one_line_error(cli(["info", "--bogus"], closed_url), 2, "No such option '--bogus'")
    one_line_error(cli(["nosuch"], closed_url), 2, "No such command 'nosuch'")


def test_bad_payload_line_is_a_usage_error_and_leaves_nothing(
    redis_url: str, prefix: str, r: redis.Redis, tmp_path: Path
) -> None:
    lines = tmp_path / "p.jsonl"
    lines.write_text('{"x": 1}\n\n{"x": \n')
    res = cli(["submit", "x:y", "--jsonl", str(lines)], redis_url, prefix)
    one_line_error(res, 2, f"--jsonl {lines} line 3: not JSON")
    assert list(r.scan_iter(match=f"{prefix}:*")) == []


def test_unknown_task_is_one_line(redis_url: str, prefix: str) -> None:
    one_line_error(
        cli(["dead", "no-such-task"], redis_url, prefix), 1, "no task no-such-task", prefix
    )
    one_line_error(cli(["dead", "../etc"], redis_url, prefix), 2, "task id '../etc' must match")


def test_missing_dashboard_extra_names_the_pip_line(redis_url: str) -> None:
    """The interpreter cannot import uvicorn (``sys.modules[name] = None`` is Python's own
    way to make an import fail), as in an install without the dashboard extra."""
    code = (
        "import sys; sys.modules['uvicorn'] = None; "
        "from queueworks.cli import main; main(prog_name='queueworks')"
    )
    res = cli(["dashboard"], redis_url, code=code)
    one_line_error(res, 1, "dashboard extra", "'uvicorn'", "pip install 'queueworks[dashboard]'")


def test_sigterm_to_a_worker_that_never_reached_redis(closed_url: str, tmp_path: Path) -> None:
    log = tmp_path / "worker.err"
    env = {k: v for k, v in os.environ.items() if k not in PREFIX_ENV}
    with log.open("w") as err:
        p = subprocess.Popen(
            [sys.executable, "-m", "queueworks", "worker", "--allow", "x", "--redis", closed_url],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        try:
            wait_for(lambda: "register_failed" in log.read_text(), 20, "a failed register")
            p.send_signal(signal.SIGTERM)
            code = p.wait(timeout=20)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    text = log.read_text()
    said = [line for line in text.splitlines() if not line.startswith("{")]  # not log events
    assert code == 1, text[-1500:]
    assert "Traceback" not in text, text[-1500:]
    assert len(said) == 1 and said[0].startswith(f"error: cannot reach Redis at {closed_url}")


# -- submit --wait and dead ------------------------------------------------------------------


def test_submit_wait_and_dead_letters(
    cluster: Cluster, redis_url: str, prefix: str, r: redis.Redis, tmp_path: Path
) -> None:
    """A task no worker can run fails and exits 3 saying why; a task whose every subtask
    dies exits 3 and says why; `dead` lists them, as text and JSON; after the cause is
    fixed, `dead --requeue` runs them again and they succeed."""
    cluster.controller()
    cluster.worker(allow=("tests.handlers_cli", "queueworks.examples"))
    cluster.wait_workers(r, 1)

    # the only worker that may run it cannot import it: it refuses, and the task fails
    res = cli(["submit", "queueworks.examples:dubble", "--count", "5", "--wait"], redis_url, prefix)
    assert res.returncode == 3, (res.stdout, res.stderr)
    assert res.stdout.splitlines()[1] == "failed: 0 done, 0 dead of 5"
    assert "module 'queueworks.examples' has no 'dubble'" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    shown = cli(["info"], redis_url, prefix).stdout
    assert "failed" in shown and "0/5 dead=0" in shown, shown

    ok = tmp_path / "ok"
    payloads = tmp_path / "p.jsonl"
    payloads.write_text("".join(json.dumps({"x": i, "file": str(ok)}) + "\n" for i in range(4)))
    args = ["submit", "tests.handlers_cli:needs_file", "--jsonl", str(payloads)]
    res = cli([*args, "--max-attempts", "2", "--wait"], redis_url, prefix)
    assert res.returncode == 3, (res.stdout, res.stderr)
    task_id, counts = res.stdout.splitlines()
    assert counts == "completed: 0 done, 4 dead of 4"
    assert f"FileNotFoundError: needs_file: {ok} does not exist yet" in res.stderr, res.stderr
    assert f"queueworks dead {task_id}" in res.stderr

    listed = cli(["dead", task_id], redis_url, prefix)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].endswith("completed: 4 dead of 4, 4 dead letter(s) shown"), lines[0]
    assert lines[1].split() == ["index", "attempts", "reason", "last", "error", "line"]
    rows = [line.split(None, 2) for line in lines[2:]]
    assert sorted(int(index) for index, _, _ in rows) == [0, 1, 2, 3]
    assert all(attempts == "2" for _, attempts, _ in rows), rows
    assert all(
        rest.startswith("failed 2 times") and "FileNotFoundError" in rest for *_, rest in rows
    )

    as_json = cli(["dead", task_id, "--json"], redis_url, prefix)
    data = json.loads(as_json.stdout)
    assert (data["task"], data["dead"], data["state"]) == (task_id, 4, "completed")
    letters = data["dead_letters"]
    assert sorted(d["index"] for d in letters) == [0, 1, 2, 3]
    assert {d["attempts"] for d in letters} == {2}
    assert all(d["last_error"].startswith("FileNotFoundError:") for d in letters)
    only = json.loads(cli(["dead", task_id, "--json", "--index", "2"], redis_url, prefix).stdout)
    assert [d["index"] for d in only["dead_letters"]] == [2]

    ok.write_text("fixed")
    requeued = cli(["dead", task_id, "--requeue"], redis_url, prefix)
    assert requeued.returncode == 0, requeued.stderr
    assert "requeued 4 dead letter(s)" in requeued.stdout and "active again" in requeued.stdout
    with Client.from_url(redis_url, prefix=prefix) as client:
        task = client.task(task_id)
        status = task.wait(timeout=60)
        assert (status.state, status.done, status.dead) == (TaskState.COMPLETED, 4, 0)
        assert dict(task.results()) == {i: 2 * i for i in range(4)}
    after = cli(["dead", task_id], redis_url, prefix)
    assert after.stdout.strip().endswith("0 dead of 4, 0 dead letter(s) shown")

    res = cli([*args, "--wait"], redis_url, prefix)  # the file exists now: nothing dies
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert res.stdout.splitlines()[1] == "completed: 4 done, 0 dead of 4" and not res.stderr


def test_info_shows_whole_names(redis_url: str, prefix: str, client: Client) -> None:
    name = "queueworks.examples:double-with-a-long-descriptive-task-name"
    client.submit(TaskSpec(name=name, handler="queueworks.examples:double", subtasks=[{"x": 1}]))
    res = cli(["info"], redis_url, prefix)
    assert res.returncode == 0 and name in res.stdout, res.stdout


# -- --help ----------------------------------------------------------------------------------


def _commands() -> Iterator[tuple[click.Command, click.Context]]:
    root = click.Context(main, info_name="queueworks")
    yield main, root
    assert isinstance(main, click.Group)
    for name in main.list_commands(root):  # (each imported when named)
        command = main.get_command(root, name)
        assert command is not None, name
        yield command, click.Context(command, info_name=name, parent=root)


def test_every_option_says_what_it_does_its_default_and_variable() -> None:
    fields = Settings.model_fields
    checked = 0
    for command, ctx in _commands():
        where = ctx.command_path
        summary = command.get_short_help_str(limit=60)
        assert summary and not summary.endswith("..."), (where, summary)
        assert command.help, f"{where} has no help"
        for param in command.params:
            if isinstance(param, click.Argument):
                assert param.human_readable_name in command.help, (where, param.name)
                continue
            assert isinstance(param, click.Option)
            record = param.get_help_record(ctx)
            assert record is not None and param.help, f"{where} {param.opts} has no help"
            text = record[1]
            assert "default: (" not in text, f"{where} {param.opts}: default written two ways"
            if param.name in fields and param.name != "cluster":
                default = fields[param.name].default
                shown = "none" if default is None else str(default)
                assert f"default: {shown}]" in text or f"default: {shown};" in text, (where, text)
                assert f"env var: QUEUEWORKS_{param.name.upper()}" in text, (where, text)
            if param.envvar:
                assert f"env var: {param.envvar}" in text, (where, text)
            value = param.to_info_dict()["default"]  # None where it has none (any click)
            has_default = value not in (None, False, ()) and param.name not in ("help", "version")
            if has_default:
                assert "default: " in text, f"{where} {param.opts} hides its default: {text}"
            checked += 1
    assert checked > 50, checked


@pytest.mark.parametrize(
    ("command", "says"),
    [
        ("worker", ["process subtasks and jobs", "the jobs of the queues it serves"]),
        ("dead", ["a task's or a queue's dead letters", "of TASK (a task, or a queue)"]),
    ],
)
def test_help_says_a_command_serves_queues_too(command: str, says: list[str]) -> None:
    res = cli_in_process([command, "--help"], {})
    top = cli_in_process(["--help"], {})
    assert res.returncode == 0 and top.returncode == 0, (res.stderr, top.stderr)
    text = " ".join((res.stdout + top.stdout).split())  # click wraps at its width
    for piece in says:
        assert piece in text, (piece, text)


def test_top_level_help_lists_every_command_uncut() -> None:
    env = {**os.environ, "COLUMNS": "80"}
    res = subprocess.run(
        [sys.executable, "-m", "queueworks", "--help"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    listing = res.stdout.split("Commands:", 1)[1]
    assert isinstance(main, click.Group)
    ctx = click.Context(main, info_name="queueworks")
    assert len(main.list_commands(ctx)) == 16, main.list_commands(ctx)
    for name in main.list_commands(ctx):
        command = main.get_command(ctx, name)
        assert command is not None, name
        row = re.search(rf"^  {name}\s+(.+)$", listing, flags=re.M)
        assert row, (name, listing)
        assert row.group(1) == command.short_help, (name, row.group(1))
    assert "..." not in listing, listing


def test_submit_wait_says_why_a_task_waits_and_times_out(
    cluster: Cluster, redis_url: str, prefix: str, r: redis.Redis
) -> None:
    cluster.controller()
    cluster.worker(allow=("queueworks.examples",))
    cluster.wait_workers(r, 1)
    args = ["submit", "tests.handlers_cli:needs_file", "--count", "2", "--wait", "--timeout", "3"]
    res = cli(args, redis_url, prefix)
    assert res.returncode == 3, (res.stdout, res.stderr)
    assert (
        "waiting: no live worker may run 'tests.handlers_cli:needs_file': their --allow "
        "prefixes are queueworks.examples"
    ) in res.stderr, res.stderr
    assert "did not finish within 3.0 s" in res.stderr


# -- queueworks redis: the embedded server for development ----------------------------------


def _redis_command(port: int, data: Path) -> subprocess.Popen[str]:
    args = ["redis", "--port", str(port), "--dir", str(data)]
    return subprocess.Popen(
        [sys.executable, "-m", "queueworks", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _answers(port: int) -> bool:
    client = redis.Redis(port=port, socket_connect_timeout=0.5, socket_timeout=1)
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False
    finally:
        client.close()


def test_redis_command_serves_until_a_signal_and_keeps_its_dir(tmp_path: Path) -> None:
    port, data = free_port(), tmp_path / "data"
    for stop, value in ((signal.SIGINT, "kept"), (signal.SIGTERM, None)):
        proc = _redis_command(port, data)
        try:
            started = wait_for(
                lambda p=proc: _answers(port) or p.poll() is not None, 20, "the server answers"
            )
            assert started and proc.poll() is None, proc.communicate()
            server = redis.Redis(port=port)
            if value is None:  # the second start: the first one's data is there
                assert server.get("k") == b"kept"
            else:
                server.set("k", value)
            notify = server.config_get("notify-keyspace-events")["notify-keyspace-events"]
            assert set(str(notify)) == set("K$gx")  # what the processes listen to
            server.close()
            proc.send_signal(stop)
            out, err = proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, (out, err)
        assert f"on redis://127.0.0.1:{port}/0 (data in {data})" in out, out
        assert f"export QUEUEWORKS_REDIS_URL=redis://127.0.0.1:{port}/0" in out, out
        assert out.rstrip().endswith("stopped") and not err, (out, err)
        assert not _answers(port)  # stopped with us, not left behind
    assert (data / "appendonlydir").is_dir()


def test_redis_command_on_a_port_in_use_is_one_line(closed_url: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = cli(["redis", "--port", str(port)], closed_url)
    one_line_error(res, 1, f"port {port} on 127.0.0.1 is in use", "--port")


def test_redis_command_on_a_port_of_another_redis_does_not_advise_it(closed_url: str) -> None:
    """A Redis this command did not start is named as such, never offered for use."""
    with RedisServer() as other:
        res = cli(["redis", "--port", str(other.port)], closed_url)
    err = one_line_error(res, 1, f"port {other.port} on 127.0.0.1 is in use", "--port")
    assert "a Redis server this command did not start answers there" in err, err
    assert "use it" not in err, err


def test_redis_command_starts_again_at_once_on_its_port(tmp_path: Path) -> None:
    """Stopped while a client was connected (the server closes that connection first, so
    its port is in TIME_WAIT), it starts again on that port at once."""
    port, data = free_port(), tmp_path / "data"
    for round in range(2):
        proc = _redis_command(port, data)
        try:
            wait_for(lambda p=proc: _answers(port) or p.poll() is not None, 20, "it answers")
            assert proc.poll() is None, (round, proc.communicate())
            held = redis.Redis(port=port)
            held.ping()  # connected while the server stops
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=20)
            held.close()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, (round, out, err)


def test_redis_command_keeps_a_relative_dir_where_it_was_started(tmp_path: Path) -> None:
    """``--dir .redis`` as docs/cli.md shows it: the folder the command starts in."""
    port = free_port()
    args = ["redis", "--port", str(port), "--dir", ".redis"]
    env = {k: v for k, v in os.environ.items() if k not in PREFIX_ENV}
    proc = subprocess.Popen(
        [sys.executable, "-m", "queueworks", *args],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: _answers(port) or proc.poll() is not None, 20, "the server answers")
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, (out, err)
    assert f"(data in {tmp_path / '.redis'})" in out, out
    assert (tmp_path / ".redis" / "appendonlydir").is_dir()


def test_enqueue_creates_its_queue_with_every_setting_given(
    redis_url: str, prefix: str, client: Client
) -> None:
    """Every queue setting has its option (``QueueSettings`` declares them)."""
    args = ["enqueue", "sel", "tests.handlers:double", "--min-nodes", "2", "--max-nodes", "3"]
    args += ["--queue-priority", "5", "--max-attempts", "4", "--job-timeout", "1.5"]
    args += ["--result-ttl", "60", "--wait-timeout", "2", "--node-selector", "gpu=yes"]
    res = cli([*args, "--node-selector", "zone=a=b"], redis_url, prefix)
    assert res.returncode == 0, res.stderr
    settings = QueueSettings(2, 3, 5, 4, 1.5, 60.0, {"gpu": "yes", "zone": "a=b"}, 0, 2.0)
    assert client.queue("sel").settings == settings


# -- every number and name is checked where it enters ---------------------------------------

DEEP = "[" * 200 + "]" * 200


@pytest.mark.parametrize(
    ("args", "piece"),
    [
        (["enqueue", "q", "tests.handlers:double", "--delay", "nan"], "--delay"),
        (["enqueue", "q", "tests.handlers:double", "--delay", "inf"], "--delay"),
        (["enqueue", "q", "tests.handlers:double", "--delay", "1e308"], "--delay"),
        (["enqueue", "q\n", "tests.handlers:double"], "must match"),
        (["enqueue", "..", "tests.handlers:double"], "must match"),
        (["enqueue", "q", "tests.handlers:double", "--wait", "--timeout", "-1"], "--timeout"),
        (["enqueue", "q", "tests.handlers:double", "--job-timeout", "nan"], "--job-timeout"),
        (["enqueue", "q", "tests.handlers:double", "--queue-priority", "9" * 12], "--queue-"),
        (["enqueue", "q", "tests.handlers:double", "--priority", "6"], "--priority"),
        (["enqueue", "q", "tests.handlers:double", "--min-nodes", "0"], "--min-nodes"),
        (["enqueue", "q", "tests.handlers:double", "--result-ttl", "0"], "--result-ttl"),
        (["enqueue", "q", "tests.handlers:double", "--wait-timeout", "nan"], "--wait-timeout"),
        (["enqueue", "q", "tests.handlers:double", "--idle-after", "30"], "--idle-after"),
        (["enqueue", "q", "tests.handlers:double", "--node-selector", "gpu"], "--node-selector"),
        (["enqueue", "q", "tests.handlers:double", "--json", DEEP], "nested deeper than 100"),
        (["submit", "m:f", "--count", "1", "--wait", "--timeout", "-1"], "--timeout"),
        (["submit", "m:f", "--count", "-1"], "--count"),
        (["submit", "m:f", "--count", "1", "--partitions", "5000"], "--partitions"),
        (["dead", "T", "--limit", "0"], "--limit"),
        (["dead", "T", "--index", "-1"], "--index"),
        (["dead", "T\n"], "must match"),
        (["info", "--interval", "nan"], "--interval"),
        (["worker", "--allow", "x", "--heartbeat-interval", "inf"], "heartbeat_interval"),
        (["worker", "--allow", "x", "--prefix", "qw\n"], "prefix"),
    ],
    ids=lambda v: " ".join(v).replace("\n", "\\n")[:60] if isinstance(v, list) else None,
)
def test_bad_numbers_and_names_are_usage_errors(
    redis_url: str, prefix: str, r: redis.Redis, args: list[str], piece: str
) -> None:
    """Exit 2, one line naming the option (or the setting, or the name), nothing written."""
    one_line_error(cli(args, redis_url, prefix), 2, piece)
    assert list(r.scan_iter(match=f"{prefix}:*")) == []


@pytest.mark.parametrize(
    ("args", "env", "bad"),
    [
        (["--queues", "mails,bad name"], {}, "'bad name'"),
        (["--queues", "mails,,reports"], {}, "''"),
        ([], {"QUEUEWORKS_QUEUES": "mails,-x"}, "'-x'"),
    ],
    ids=["flag", "empty", "variable"],
)
def test_a_bad_queue_name_in_queues_is_a_usage_error(
    redis_url: str, prefix: str, r: redis.Redis, args: list[str], env: dict[str, str], bad: str
) -> None:
    """Exit 2, one line naming --queues and the name it refuses; the worker never starts."""
    res = cli(["worker", "--allow", "x", *args], redis_url, prefix, env=env)
    one_line_error(res, 2, "--queues", f"queue name {bad} must match")
    assert list(r.scan_iter(match=f"{prefix}:*")) == []


def test_info_shows_each_workers_queues_and_memberships(
    cluster: Cluster, redis_url: str, prefix: str, r: redis.Redis
) -> None:
    """A worker's --queues (flag or variable) reaches its record; `info` shows it and the
    queues it is a member of (which the worker writes as it joins and leaves them)."""
    keys = Keys(prefix)
    cluster.worker("w-flag", extra=["--queues", "mails, reports,mails"])
    cluster.worker("w-env", env={"QUEUEWORKS_QUEUES": "gpu-jobs"})
    record = WorkerRecord(id="w-any", host="h", pid=1, started_at=time.time())
    r.hset(keys.worker("w-any"), mapping=registered_worker(record, time.time()))
    r.zadd(keys.workers, {"w-any": time.time()})
    cluster.wait_workers(r, 3)
    client = Client.from_url(redis_url, prefix=prefix)
    for name in ("reports", "mails", "other"):  # w-flag joins the first two; w-env none
        client.queue(name)
    client.close()

    def member_of(wid: str) -> list[str]:
        return json.loads(r.hget(keys.worker(wid), "member_of") or b"[]")

    wait_for(lambda: member_of("w-flag") == ["mails", "reports"], 30, "w-flag's memberships")

    lines = {
        line.split()[0]: line
        for line in cli(["info"], redis_url, prefix).stdout.splitlines()
        if line.startswith("  w-")
    }
    assert " queues=mails,reports member_of=mails,reports " in lines["w-flag"], lines
    assert " queues=gpu-jobs member_of=- " in lines["w-env"], lines
    assert " queues=* member_of=- " in lines["w-any"], lines
    shown = json.loads(cli(["info", "--json"], redis_url, prefix).stdout)["workers"]
    by_id = {w["id"]: (w["queues"], w["member_of"]) for w in shown}
    assert by_id == {
        "w-flag": (["mails", "reports"], ["mails", "reports"]),
        "w-env": (["gpu-jobs"], []),
        "w-any": (None, []),
    }


def test_commands_say_when_no_controller_runs_and_count_a_queues_dead(
    cluster: Cluster, redis_url: str, prefix: str, r: redis.Redis
) -> None:
    """No controller: `submit --wait`, `enqueue --wait` and `info` say so in one line (and
    still do their work); `dead QUEUE` counts the queue's finished jobs."""
    none = "no controller is running: "
    res = cli(["submit", "m:f", "--count", "1", "--wait", "--timeout", "1"], redis_url, prefix)
    assert res.returncode == 3 and none in res.stderr, (res.stdout, res.stderr)
    assert "did not finish within 1.0 s" in res.stderr
    args = ["enqueue", "q", "tests.handlers:always_fails", "--max-attempts", "1"]
    res = cli([*args, "--wait", "--timeout", "1"], redis_url, prefix)
    assert res.returncode == 3 and none in res.stderr, (res.stdout, res.stderr)
    shown = cli(["info"], redis_url, prefix)
    assert shown.returncode == 0 and shown.stdout.startswith(none), shown.stdout
    assert (
        json.loads(cli(["info", "--json"], redis_url, prefix).stdout)["controller_running"] is False
    )

    cluster.controller()
    cluster.worker()
    cluster.wait_workers(r, 1)
    cluster.wait_leader(r)
    res = cli([*args, "--wait", "--timeout", "30"], redis_url, prefix)  # the job dies
    assert res.returncode == 3 and none not in res.stderr, (res.stdout, res.stderr)
    with Client.from_url(redis_url, prefix=prefix) as client:
        wait_for(lambda: client.queue("q").status().dead == 2, 30, "both jobs dead")
        # (the state is the controller's word, soon after the member joined)
        wait_for(lambda: client.queue("q").status().state == "running", 15, "q running")
    listed = cli(["dead", "q"], redis_url, prefix)
    assert listed.returncode == 0, listed.stderr
    assert (
        listed.stdout.splitlines()[0]
        == "queue q running: 2 dead of 2 finished, 2 dead letter(s) shown"
    )
    data = json.loads(cli(["dead", "q", "--json"], redis_url, prefix).stdout)
    assert (data["queue"], data["dead"], data["total"]) == (True, 2, 2)
    assert none not in cli(["info"], redis_url, prefix).stdout
