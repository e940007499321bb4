"""A stand-in scale command for ``queueworks autoscale`` in tests: what ``docker compose up
-d --no-recreate --scale worker=N worker`` does, with local worker processes.

    python tests/scale_workers.py --state DIR [--label k=v ...] N

Keeps ``DIR/<name>.pid`` for each worker it started. Fewer than N alive: starts the missing
ones (``python -m queueworks worker``, in a session of their own, so they outlive this
command; Redis and prefix from the environment, as compose passes them). More: SIGTERMs the
newest surplus, as compose does, and waits until they exited (a warm stop: they finish or
hand back what they hold and leave), up to ``--wait`` s. Each call appends ``N`` to
``DIR/calls``. Exit 0 when every worker it stopped exited in time.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def alive(pid: int) -> bool:
    """True while the process runs (a zombie nobody reaped yet counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def workers(state: Path) -> list[tuple[float, Path, int]]:
    """The live workers started here, oldest first: (started, pid file, pid)."""
    out = []
    for f in state.glob("*.pid"):
        pid = int(f.read_text())
        if alive(pid):
            out.append((f.stat().st_mtime, f, pid))
        else:
            f.unlink()
    return sorted(out)


def start(state: Path, labels: list[str]) -> None:
    name = f"as-{uuid.uuid4().hex[:8]}"
    log = (state / f"{name}.log").open("ab")
    args = [sys.executable, "-m", "queueworks", "worker", "--name", name]
    args += ["--allow", "tests.handlers", "--allow", "queueworks.examples"]
    for label in labels:
        args += ["--label", label]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True)
    (state / f"{name}.pid").write_text(str(proc.pid))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--wait", type=float, default=30.0)
    parser.add_argument("--label", action="append", default=[], help="k=v for its workers")
    parser.add_argument("n", type=int)
    args = parser.parse_args()
    state: Path = args.state
    state.mkdir(parents=True, exist_ok=True)
    with (state / "calls").open("a") as calls:
        calls.write(f"{args.n}\n")
    live = workers(state)
    for _ in range(args.n - len(live)):
        start(state, args.label)
    surplus = live[args.n :] if args.n < len(live) else []
    for _, _, pid in surplus:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + args.wait
    while any(alive(pid) for _, _, pid in surplus) and time.monotonic() < deadline:
        time.sleep(0.05)
    return 1 if any(alive(pid) for _, _, pid in surplus) else 0


if __name__ == "__main__":
    sys.exit(main())
