"""Local Redis Cluster and Sentinel setups on free ports, for tests and benchmarks.

``LocalCluster``: ``n`` primaries (``redis-server --cluster-enabled yes``, each with its own
dir, port and bus port), joined by ``redis-cli --cluster create ... --cluster-yes``, ready
when every node reports ``cluster_state:ok`` and agrees on the slot map.

``LocalSentinel``: a primary, its replicas and ``n`` sentinels (``redis-server <conf>
--sentinel``: a sentinel needs a config file it can rewrite, so it is started from one
rather than through ``RedisServer``), ready when every sentinel knows the primary, its
replicas and the other sentinels.

Also the handlers the cluster/sentinel tests run (``--allow tests.cluster_fixtures``): they
log every execution to a local file (one line each, ``O_APPEND``), not to Redis, so that a
failover cannot lose the record of what ran.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from queueworks.context import SubtaskContext
from queueworks.contrib.redis_server import RedisServer, find_server_binary, free_port

NODE_TIMEOUT_MS = 1000  # cluster-node-timeout: how soon a dead primary is failed over

_SENTINELS: set[subprocess.Popen[bytes]] = set()


@atexit.register
def _kill_leftover_sentinels() -> None:  # never leave a sentinel behind the interpreter
    for proc in list(_SENTINELS):
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def redis_cli() -> str:
    """``redis-cli`` next to the server binary (Debian: /usr/bin), else on PATH."""
    beside = Path(find_server_binary()).parent / "redis-cli"
    if beside.exists():
        return str(beside)
    found = shutil.which("redis-cli")
    if found is None:
        raise RuntimeError("redis-cli not found: install redis-tools")
    return found


def _wait(pred: Any, timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = pred()
            if value:
                return value
        except (redis.RedisError, OSError) as exc:
            last = exc
        time.sleep(interval)
    raise RuntimeError(f"timed out after {timeout} s waiting for {what} (last error: {last})")


# -- Redis Cluster -------------------------------------------------------------------------


class LocalCluster:
    """``primaries`` cluster primaries (and ``replicas`` replicas each) on free local ports."""

    def __init__(self, primaries: int = 3, replicas: int = 0, *, notify: str = "") -> None:
        self.n_primaries, self.n_replicas = primaries, replicas
        self.notify = notify
        self.nodes: list[RedisServer] = []

    @property
    def url(self) -> str:
        seeds = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[: self.n_primaries])
        return f"redis+cluster://{seeds}"

    def _node(self) -> RedisServer:
        bus = free_port()  # the cluster bus port, chosen free too (not port + 10000)
        args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
        args += ["--cluster-node-timeout", str(NODE_TIMEOUT_MS), "--appendonly", "no"]
        args += ["--cluster-port", str(bus), "--cluster-announce-ip", "127.0.0.1"]
        if self.notify:
            args += ["--notify-keyspace-events", self.notify]
        return RedisServer(extra_args=args)

    @staticmethod
    def bus_port(node: RedisServer) -> int:
        return int(node.extra_args[node.extra_args.index("--cluster-port") + 1])

    def start(self, timeout: float = 30.0) -> LocalCluster:
        total = self.n_primaries * (1 + self.n_replicas)
        for _ in range(total):
            node = self._node()
            self.nodes.append(node)
            node.start()
        if self.n_primaries >= 3:
            cmd = [redis_cli(), "--cluster", "create"]
            cmd += [f"127.0.0.1:{n.port}" for n in self.nodes]
            cmd += ["--cluster-replicas", str(self.n_replicas), "--cluster-yes"]
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
            if res.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed:\n{res.stdout}{res.stderr}")
        else:  # redis-cli wants 3 primaries at least: meet and assign the slots by hand
            self._create_small()
        self.wait_ready(timeout)
        return self

    def _create_small(self) -> None:
        if self.n_replicas:
            raise ValueError("replicas need 3 primaries or more (redis-cli --cluster create)")
        n = self.n_primaries
        for i, node in enumerate(self.nodes):
            with node.client(socket_timeout=5) as c:
                if i:
                    first = self.nodes[0]
                    c.execute_command(
                        "CLUSTER", "MEET", "127.0.0.1", first.port, self.bus_port(first)
                    )
                low, high = i * 16384 // n, (i + 1) * 16384 // n - 1
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", low, high)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Every running node says ``cluster_state:ok`` and they agree on the slot map."""

        def ready() -> bool:
            maps = set()
            for node in self.nodes:
                if not node.running:
                    continue
                with node.client(socket_timeout=2) as c:
                    info: Any = c.execute_command("CLUSTER", "INFO")
                    text = info.decode() if isinstance(info, bytes) else str(info)
                    if "cluster_state:ok" not in text:
                        return False
                    maps.add(self._slot_map(c))
            return len(maps) == 1

        _wait(ready, timeout, "cluster_state:ok on every node", 0.1)

    @staticmethod
    def _slot_map(c: redis.Redis) -> tuple[tuple[int, int, int], ...]:
        raw: Any = c.execute_command("CLUSTER", "SLOTS")
        rows = []
        for slot_range in raw:
            start, end, primary = slot_range[0], slot_range[1], slot_range[2]
            rows.append((int(start), int(end), int(primary[1])))
        return tuple(sorted(rows))

    def primaries(self) -> list[RedisServer]:
        """The running nodes that are primaries now (after failovers too)."""
        out = []
        for node in self.nodes:
            if not node.running:
                continue
            with node.client(socket_timeout=2) as c:
                role: Any = c.execute_command("ROLE")
                if role[0] in (b"master", "master"):
                    out.append(node)
        return out

    def node_for_port(self, port: int) -> RedisServer:
        return next(n for n in self.nodes if n.port == port)

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def __enter__(self) -> LocalCluster:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- Sentinel ------------------------------------------------------------------------------


class SentinelProcess:
    """One sentinel: ``redis-server <conf> --sentinel`` on a free port, its own dir."""

    def __init__(self, primary_port: int, service: str, quorum: int) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="queueworks-sentinel-"))
        self.conf = self.dir / "sentinel.conf"
        self.conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\nprotected-mode no\ndir {self.dir}\n"
            f"logfile {self.dir / 'sentinel.log'}\n"
            f"sentinel monitor {service} 127.0.0.1 {primary_port} {quorum}\n"
            f"sentinel down-after-milliseconds {service} 1000\n"
            f"sentinel failover-timeout {service} 10000\n"
            f"sentinel parallel-syncs {service} 1\n"
        )
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # The binary path is used as found (Debian's redis-server is a multi-call symlink).
        self._proc = subprocess.Popen(
            [find_server_binary(), str(self.conf), "--sentinel"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=self.dir,
        )
        _SENTINELS.add(self._proc)

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)

    def log_tail(self, n: int = 30) -> str:
        try:
            lines = (self.dir / "sentinel.log").read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc is not None:
            _SENTINELS.discard(self._proc)
        shutil.rmtree(self.dir, ignore_errors=True)


class LocalSentinel:
    """A primary, ``replicas`` replicas and ``sentinels`` sentinels watching service
    ``service`` (quorum: a majority of the sentinels)."""

    def __init__(self, *, replicas: int = 1, sentinels: int = 3, service: str = "qw") -> None:
        self.service = service
        self.n_replicas, self.n_sentinels = replicas, sentinels
        self.servers: list[RedisServer] = []
        self.sentinels: list[SentinelProcess] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    def start(self, timeout: float = 30.0) -> LocalSentinel:
        primary = RedisServer()
        primary.start()
        self.servers.append(primary)
        for _ in range(self.n_replicas):
            replica = RedisServer(extra_args=["--replicaof", "127.0.0.1", str(primary.port)])
            replica.start()
            self.servers.append(replica)
        quorum = self.n_sentinels // 2 + 1
        for _ in range(self.n_sentinels):
            s = SentinelProcess(primary.port, self.service, quorum)
            s.start()
            self.sentinels.append(s)
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Replicas in sync, and every sentinel knows them and the other sentinels."""
        primary = self.primary()

        def ready() -> bool:
            with primary.client(socket_timeout=2) as c:
                info: Any = c.info("replication")
                if int(info.get("connected_slaves", 0)) < self.n_replicas:
                    return False
            for s in self.sentinels:
                with s.client() as c:
                    state: Any = c.execute_command("SENTINEL", "MASTER", self.service)
                    fields = _pairs(state)
                    if int(fields.get("num-slaves", 0)) < self.n_replicas:
                        return False
                    if int(fields.get("num-other-sentinels", 0)) < self.n_sentinels - 1:
                        return False
            return True

        _wait(ready, timeout, "sentinels to know the primary, replicas and each other", 0.1)

    def primary(self) -> RedisServer:
        """The server the sentinels name as primary now."""
        for s in self.sentinels:
            with contextlib.suppress(redis.RedisError, OSError), s.client() as c:
                addr: Any = c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
                if addr:
                    port = int(addr[1])
                    return next(x for x in self.servers if x.port == port)
        raise RuntimeError("no sentinel answered with the primary")

    def wait_failover(self, old_port: int, timeout: float = 30.0) -> RedisServer:
        """Until every sentinel names another primary, and that one says it is one."""

        def moved() -> RedisServer | None:
            ports = set()
            for s in self.sentinels:
                with s.client() as c:
                    addr: Any = c.execute_command(
                        "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service
                    )
                    ports.add(int(addr[1]))
            if len(ports) != 1 or old_port in ports:
                return None
            (port,) = ports
            new = next(x for x in self.servers if x.port == port)
            with new.client(socket_timeout=2) as c:
                role: Any = c.execute_command("ROLE")
                return new if role[0] in (b"master", "master") else None

        found: RedisServer = _wait(moved, timeout, "the sentinels to fail over", 0.1)
        return found

    def close(self) -> None:
        for s in self.sentinels:
            s.close()
        for srv in self.servers:
            srv.close()

    def __enter__(self) -> LocalSentinel:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pairs(flat: Any) -> dict[str, str]:
    if isinstance(flat, dict):
        return {_s(k): _s(v) for k, v in flat.items()}
    return {_s(flat[i]): _s(flat[i + 1]) for i in range(0, len(flat), 2)}


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


# -- handlers run by the workers of these tests ----------------------------------------------


def logged(payload: dict[str, Any], ctx: SubtaskContext) -> dict[str, Any]:
    """Appends "index|worker|attempt|epoch|t" to ``payload["log"]`` (a local file), works for
    ``payload["seconds"]`` (suspending at safe points), returns ``{"y": 2x, ...}``."""
    line = f"{ctx.index}|{ctx.worker_id}|{ctx.attempt}|{ctx.role.epoch}|{time.time()!r}\n"
    fd = os.open(payload["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    seconds = float(payload.get("seconds", 0.0))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        ctx.checkpoint()
        time.sleep(min(0.002, seconds))
    return {"y": int(payload["x"]) * 2, "worker": ctx.worker_id, "epoch": ctx.role.epoch}


def executions(path: Path | str) -> list[tuple[int, str, int, int, float]]:
    """The lines ``logged`` wrote: (index, worker, attempt, epoch, time)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) == 5:
            out.append((int(parts[0]), parts[1], int(parts[2]), int(parts[3]), float(parts[4])))
    return out
