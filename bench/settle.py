"""The settle step alone: µs per subtask of ``settle.lua`` now against an earlier revision's.

    python -m bench.settle                    # against the revision before completion by index
    python -m bench.settle --against REV --n 200000 --repeat 5
    python -m bench.settle --python-against REV   # the same settle.lua, REV's Scripts class
    python -m bench.settle --python-against REV --no-redis   # the Python side alone

Both scripts run against one private Redis, on identical tasks (``--n`` subtasks, read
with XREADGROUP COUNT 100 beforehand, settled in batches of 100), alternating, so the
ratio is what the per-index completion check costs on the hot path. With
``--python-against``, both sides run today's settle.lua, one through today's
``Scripts.settle``, the other through REV's ``queueworks/scripts/bound.py``: the ratio is what
the Python side of the call costs. ``--no-redis`` times that Python side alone: each
script replaced by a function returning a constant reply, ``--calls`` calls of 100 each,
the best of ``--repeat`` rounds per side.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import types
import uuid
from typing import Any

from bench.common import ROOT, private_redis
from queueworks import Client, TaskSpec
from queueworks.scripts.bound import Scripts

BATCH = 100
BEFORE_BY_INDEX = "1add547"  # the last revision that completed by count


def _prepared(client: Client, n: int) -> tuple[Any, list[list[tuple[str, int, str]]]]:
    task = client.submit(TaskSpec(name="s", handler="m:f", subtasks=({"x": i} for i in range(n))))
    tk = client.keys.task(task.id)
    batches = []
    while True:
        reply: Any = client.redis.xreadgroup(tk.group, "w", {tk.stream: ">"}, count=BATCH)
        if not reply:
            return tk, batches
        batches.append([(e.decode(), int(f[b"i"]), "0") for e, f in reply[0][1]])


def run_current(url: str, n: int) -> float:
    client = Client.from_url(url, prefix=f"s{uuid.uuid4().hex[:6]}")
    tk, batches = _prepared(client, n)
    t0 = time.perf_counter()
    for ok in batches:
        client.scripts.settle(tk, tk.stream, "w", time.time(), ok)
    spent = time.perf_counter() - t0
    assert client.task(tk.task_id).status().done == n
    return spent / n * 1e6


def run_old(url: str, n: int, source: str) -> float:
    client = Client.from_url(url, prefix=f"s{uuid.uuid4().hex[:6]}")
    script = client.redis.register_script(source)
    tk, batches = _prepared(client, n)
    keys = [tk.stream, tk.record, tk.results, tk.dead]
    t0 = time.perf_counter()
    for ok in batches:
        argv: list[Any] = [tk.group, repr(time.time()), "w", len(ok), 0]
        for entry in ok:
            argv += entry
        script(keys=keys, args=argv)
    spent = time.perf_counter() - t0
    assert client.task(tk.task_id).status().done == n
    return spent / n * 1e6


def run_old_python(url: str, n: int, source: str) -> float:
    """Today's settle.lua through the ``Scripts`` class of another revision's scripts.py."""
    module = types.ModuleType("bench_old_scripts")
    sys.modules[module.__name__] = module  # its dataclasses look their module up
    exec(compile(source, "old queueworks/scripts/bound.py", "exec"), module.__dict__)
    client = Client.from_url(url, prefix=f"s{uuid.uuid4().hex[:6]}")
    scripts = module.Scripts(client.redis)
    tk, batches = _prepared(client, n)
    t0 = time.perf_counter()
    for ok in batches:
        scripts.settle(tk, tk.stream, "w", time.time(), ok)
    spent = time.perf_counter() - t0
    assert client.task(tk.task_id).status().done == n
    return spent / n * 1e6


class _ConstantReplies:
    """Stands in for a client: every script it registers returns a settle-shaped reply."""

    def register_script(self, source: str) -> Any:
        return lambda keys, args, client=None: [BATCH, 0, 0, 0, 1]


def python_side(source: str, calls: int, repeat: int, against: str) -> None:
    module = types.ModuleType("bench_old_scripts")
    sys.modules[module.__name__] = module
    exec(compile(source, "old queueworks/scripts/bound.py", "exec"), module.__dict__)
    sides = {"now": Scripts(_ConstantReplies()), against: module.Scripts(_ConstantReplies())}
    tk = Client.from_url("redis://unused").keys.task("t")
    ok = [(f"{i}-0", i, "0") for i in range(BATCH)]
    best = dict.fromkeys(sides, float("inf"))
    for rep in range(repeat):
        for name, scripts in sides.items() if rep % 2 == 0 else reversed(sides.items()):
            t0 = time.perf_counter()
            for _ in range(calls):
                scripts.settle(tk, tk.stream, "w", 1.0, ok)
            best[name] = min(best[name], (time.perf_counter() - t0) / calls * 1e6)
    print(f"Scripts.settle without Redis, {calls} calls of {BATCH}, best of {repeat} (µs per call)")
    for name, us in best.items():
        print(f"{name:<10} {us:6.2f}")
    print(f"now - {against}: {best['now'] - best[against]:+.2f} µs per call")


def _git_show(rev: str, path: str) -> str:
    return subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--against", default=BEFORE_BY_INDEX, help="git revision to compare with")
    ap.add_argument(
        "--python-against", default=None, help="compare the Python side with REV's instead"
    )
    ap.add_argument("--no-redis", action="store_true", help="with --python-against: no Redis")
    ap.add_argument("--calls", type=int, default=10_000, help="with --no-redis")
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    against = args.python_against or args.against
    if args.no_redis:
        if not args.python_against:
            ap.error("--no-redis needs --python-against REV")
        source = _git_show(against, "queueworks/scripts/bound.py")
        python_side(source, args.calls, args.repeat, against)
        return
    if args.python_against:
        source = _git_show(against, "queueworks/scripts/bound.py")
        other = run_old_python
        what = f"settle.lua, Scripts.settle now vs {against}'s"
    else:
        source = _git_show(against, "queueworks/lua/settle.lua")
        other = run_old
        what = "settle.lua"
    rows: dict[str, list[float]] = {"now": [], against: []}
    with private_redis() as server:
        for rep in range(args.repeat):
            pair = [("now", lambda: run_current(server.url, args.n))]
            pair.append((against, lambda: other(server.url, args.n, source)))
            for name, run in pair if rep % 2 == 0 else pair[::-1]:
                rows[name].append(run())
            server.client().flushall()
    print(f"{what}, n={args.n} in batches of {BATCH}, repeat={args.repeat} (µs per subtask)")
    for name, vals in rows.items():
        print(f"{name:<10} median {sorted(vals)[len(vals) // 2]:6.2f}   best {min(vals):6.2f}")
    ratios = sorted(a / b for a, b in zip(rows["now"], rows[against], strict=True))
    print(f"now / {against}: {ratios[len(ratios) // 2]:.2f} (median of pairs)")


if __name__ == "__main__":
    main()
