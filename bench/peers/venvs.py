"""One virtual environment per peer, with pinned packages from PyPI.

A venv is reused while its pin list is unchanged (``.bench-pins`` inside it); delete the
folder to rebuild it. ``python -m bench.peers.venvs NAME...`` builds (or checks) the named
ones ahead of a run: CI builds the asyncio peers' beside its other set-up.

Every venv gets ``hiredis``, the parser queueworks uses, so every
system's redis-py client parses replies the same way (streaq's own client is coredis; its
venv gets redis-py only for the harness's probes and marks).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_DIR = Path(__file__).resolve().parent / ".venvs"
HIREDIS = "hiredis==3.5.0"


@dataclass(frozen=True)
class VenvSpec:
    name: str
    pins: tuple[str, ...]
    package: str  # the distribution whose version names the peer

    def dir(self, root: Path) -> Path:
        return root / self.name

    def python(self, root: Path) -> Path:
        return self.dir(root) / "bin" / "python"


VENVS: dict[str, VenvSpec] = {
    spec.name: spec
    for spec in (
        VenvSpec("rq", ("rq==3.0.0", HIREDIS), "rq"),
        VenvSpec("celery", ("celery[redis]==5.7.0", HIREDIS), "celery"),
        VenvSpec("dramatiq", ("dramatiq[redis]==2.2.1", HIREDIS), "dramatiq"),
        VenvSpec("arq", ("arq==0.28.0", HIREDIS), "arq"),
        VenvSpec("streaq", ("streaq==7.2.0", "redis==8.1.0", HIREDIS), "streaq"),
        # saq[redis] wants redis<8; saq imports typing_extensions without declaring it
        VenvSpec(
            "saq",
            ("saq[redis]==0.26.4", "redis==7.4.1", "typing_extensions==4.16.0", HIREDIS),
            "saq",
        ),
        VenvSpec("report", ("matplotlib==3.11.2",), "matplotlib"),
    )
}


@dataclass
class Built:
    spec: VenvSpec
    python: Path | None
    versions: dict[str, str]
    seconds: float
    error: str = ""


def _freeze(python: Path) -> dict[str, str]:
    out = subprocess.run(
        [str(python), "-m", "pip", "list", "--format", "json", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {row["name"].lower(): row["version"] for row in json.loads(out)}


def ensure(spec: VenvSpec, root: Path = DEFAULT_DIR) -> Built:
    """Create (or reuse) the venv; never raises: a failure is returned as its reason."""
    t0 = time.monotonic()
    target, marker = spec.dir(root), spec.dir(root) / ".bench-pins"
    try:
        if not (marker.exists() and marker.read_text() == "\n".join(spec.pins)):
            root.mkdir(parents=True, exist_ok=True)
            _run([sys.executable, "-m", "venv", "--clear", str(target)])
            pip = [str(spec.python(root)), "-m", "pip", "install", "--disable-pip-version-check"]
            _run([*pip, "--quiet", *spec.pins])
            marker.write_text("\n".join(spec.pins))
        versions = _freeze(spec.python(root))
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or ""
        reason = f"{type(exc).__name__}: {exc}\n{detail[-1500:]}".strip()
        return Built(spec, None, {}, time.monotonic() - t0, reason)
    return Built(spec, spec.python(root), versions, time.monotonic() - t0)


def _run(argv: list[str]) -> None:
    subprocess.run(argv, capture_output=True, text=True, check=True, timeout=900)


def main(argv: list[str]) -> int:
    """Build the named venvs (every one if none is named), side by side; 1 if one failed."""
    import concurrent.futures

    names = argv or list(VENVS)
    unknown = sorted(set(names) - set(VENVS))
    if unknown:
        print(f"unknown venv(s) {unknown}; known: {sorted(VENVS)}", file=sys.stderr)
        return 2
    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        built = list(pool.map(ensure, (VENVS[n] for n in names)))
    for b in built:
        print(f"{b.spec.name}: {'ok' if b.python else 'FAILED'} in {b.seconds:.1f} s {b.error}")
    return 0 if all(b.python for b in built) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
