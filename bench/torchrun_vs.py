"""queueworks step mode beside ``torchrun`` (TorchElastic) on the same elastic training job.

One job (``bench.torchrun_job``: data, model, Adam, one 32-sample shard per rank and step,
the same pacing per shard), trained once by each system through the same scenario on this
machine, loopback only::

    start 2 nodes -> add 2 -> SIGKILL 1 -> remove 1 gracefully -> run to the end

* **queueworks**: a private redis-server, a controller, one ``queueworks worker`` per
  node; a ``TaskSpec(mode="step")`` task whose factory is ``make_trainer`` below
  (``queueworks.torch.ElasticTrainer``). SIGKILL = the worker process; graceful = SIGTERM.
* **torchrun**: one agent per node, ``torchrun --nnodes=1:4 --nproc-per-node=1
  --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:PORT --max-restarts=50
  -m bench.torchrun_job`` (node 1 hosts the c10d store: ``--rdzv-conf is_host=true``, the
  others ``false``). SIGKILL = the node: its agent *and* its worker (they are in different
  sessions: killing only the agent leaves its worker training on as an orphan; killing
  only the worker makes the agent restart the group at the same size, by the agent's
  code). Graceful = SIGTERM to the agent, which stops its worker and exits.

The nodes are numbered in start order: node 2 is the one SIGKILLed and node 4 the one
removed, in both systems (node 1 hosts torchrun's c10d store, and is queueworks' leader).
Changes are made at the same points of the data for both (10%, 40% and 65% of the shards
trained), each only after the previous one has settled (a step at the new size), and
halfway between two torchrun snapshots (every ``checkpoint_steps`` = 20 steps, in both
systems): the average case of a change at a random moment.

Every figure comes from the step logs (one JSON line per rank and step, see
``bench.torchrun_job``) and the times the driver made each change:

* **to new size**: from the change to the first step at the new size;
* **paused**: the longest time without any step between the change and that first step;
* **repeated**: samples trained in a step whose update was thrown away after it was
  applied (torchrun: the steps since the last snapshot, redone after the restart) and
  then trained again;
* **aborted**: steps computed but never applied (queueworks: the step a SIGKILL broke;
  its shards run in a later step);
* **lost**: samples in no step of the final model; **twice**: samples in two of them;
* **wall**: first step to last step; samples/s over it; **startup**: processes started to
  the first step;
* **loss**: the final model's MSE on the evaluation set, beside one process trained on
  the same samples (one shard per step) and beside the system's own committed steps
  replayed in one process (equal when no update was lost or applied twice).

Profiles: ``default`` runs both systems with their defaults (queueworks heartbeat 1 s /
TTL 3 s; torchrun keep-alive 5 s x 3 = 15 s, last call 30 s); ``matched`` gives torchrun
queueworks' 3 s dead-node detection (keep-alive 1 s x 3) and a 1 s last call.

    python -m bench.torchrun_vs                        # both profiles, ~6 minutes here
    python -m bench.torchrun_vs --profiles matched     # ~2 minutes
    python -m bench.torchrun_vs --smoke --json out.json   # CI: 2400 shards, matched, ~2 minutes
    python -m bench.torchrun_vs --static 2 --repeat 3  # 2 nodes throughout, no failure:
                                                       # the steady step, medians of 3 runs
    python -m bench.torchrun_vs --rounds 8 --shards 4000   # 8 rounds: 2 nodes join at
                                                       # once, then leave (SIGTERM)

torchrun runs with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: in torch 2.13.0 with the
default (the agents' TCPStore shared with the workers) a node that joins a running job
never gets in and the job fails a minute later (``--torch-share-store`` shows it).
``BENCH_QW_LOG_LEVEL=info`` keeps the queueworks processes' info logs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from bench.common import private_redis, wait_for
from bench.torchrun_job import (
    Job,
    StepLog,
    build_model,
    build_optimizer,
    checkpoint_loss,
    eval_loss,
    reference_loss,
    shard_data,
    shard_loss,
)
from queueworks import Client, Task, TaskSpec
from queueworks.contrib.redis_server import free_port
from queueworks.torch import ElasticTrainer, StepContext, StepRecord, wait_released

ROOT = Path(__file__).resolve().parent.parent
HANDLER = "bench.torchrun_vs:make_trainer"
MAX_NODES = 4


# -- the queueworks side of the job ---------------------------------------------------------


def make_trainer(ctx: StepContext) -> ElasticTrainer:
    """The step-mode trainer factory: the job of ``bench.torchrun_job``, logged the same way."""
    opts = ctx.options["bench"]
    job = Job.from_json(opts["job"])
    torch.set_num_threads(1)
    log = StepLog(opts["log_dir"], "queueworks")
    model = build_model(job)
    opt = build_optimizer(job, model)

    def loss_fn(model: torch.nn.Module, payload: Any) -> tuple[torch.Tensor, int]:
        return shard_loss(job, model, int(payload["shard"]))

    def on_step(rec: StepRecord) -> None:
        if rec.shards:  # a step nobody had a shard for trains nothing
            log.write(
                gen=rec.generation,
                seq=rec.seq,
                step=rec.steps,
                world=rec.world_size,
                rank=rec.rank,
                shards=list(rec.shards),
                committed=rec.committed,
                loss=rec.loss,
            )

    return ElasticTrainer(ctx, model, opt, loss_fn, on_step=on_step)


# -- profiles and processes -----------------------------------------------------------------


@dataclass(frozen=True)
class Profile:
    name: str
    qw_env: dict[str, str]  # heartbeat settings of every queueworks process
    rdzv_conf: str  # torchrun --rdzv-conf


PROFILES = {
    "default": Profile("default", {}, ""),
    # the same 3 s dead-node detection (queueworks' default) and a 1 s last call
    "matched": Profile(
        "matched",
        {"QUEUEWORKS_HEARTBEAT_INTERVAL": "1", "QUEUEWORKS_HEARTBEAT_TTL": "3"},
        "keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=1",
    ),
}
BASE_ENV = {
    "PYTHONPATH": str(ROOT),
    "GLOO_SOCKET_IFNAME": "lo",  # loopback only, for both systems
    "OMP_NUM_THREADS": "1",
}


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with suppress(OSError):
            out += [int(x) for x in (task / "children").read_text().split()]
    return out


def _signal(pid: int, sig: int) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, sig)


@dataclass
class Node:
    name: str
    proc: subprocess.Popen[bytes]
    started: float
    pids: set[int] = field(default_factory=set)  # every process seen under it (for cleanup)

    def alive(self) -> bool:
        return self.proc.poll() is None


class System:
    """Nodes of one system; subclasses say how a node starts, dies and leaves."""

    name = ""

    def __init__(self, job: Job, profile: Profile, run_dir: Path) -> None:
        self.job, self.profile = job, profile
        self.dir = run_dir / self.name
        self.log_dir = self.dir / "steps"
        self.log_dir.mkdir(parents=True)
        self.checkpoint = self.dir / "model.pt"
        self.nodes: list[Node] = []
        self.others: list[subprocess.Popen[bytes]] = []

    def spawn(self, args: list[str], name: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
        out = (self.dir / f"{name}.log").open("ab")
        return subprocess.Popen(
            args,
            env={**os.environ, **BASE_ENV, **env},
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def add(self) -> None:
        name = f"n{len(self.nodes) + 1}"
        self.nodes.append(Node(name, self.start_node(name), time.time()))

    def start_node(self, name: str) -> subprocess.Popen[bytes]:
        raise NotImplementedError

    def kill(self, i: int) -> None:
        raise NotImplementedError

    def remove(self, i: int) -> None:
        self.nodes[i].proc.send_signal(signal.SIGTERM)

    def done(self) -> bool:
        raise NotImplementedError

    def failed(self) -> str | None:
        return None

    def members(self) -> int | None:
        """The size of the membership, where the system tells it."""
        return None

    def close(self) -> None:
        for node in self.nodes:
            node.pids.update(_children(node.proc.pid))
            _signal(node.proc.pid, signal.SIGTERM)
        for p in self.others:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for p in [n.proc for n in self.nodes] + self.others:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for node in self.nodes:  # workers torchrun started in their own sessions
            for pid in node.pids:
                _signal(pid, signal.SIGKILL)


class Queueworks(System):
    name = "queueworks"

    def __init__(self, job: Job, profile: Profile, run_dir: Path, url: str) -> None:
        super().__init__(job, profile, run_dir)
        self.prefix = f"tv{uuid.uuid4().hex[:6]}"
        self.env = {
            "QUEUEWORKS_REDIS_URL": url,
            "QUEUEWORKS_PREFIX": self.prefix,
            "QUEUEWORKS_TORCH_HOST": "127.0.0.1",
            "QUEUEWORKS_LOG_LEVEL": os.environ.get("BENCH_QW_LOG_LEVEL", "warning"),
            **profile.qw_env,
        }
        self.client = Client.from_url(url, prefix=self.prefix)
        self.others.append(self.spawn(self._qw("controller"), "controller", self.env))

    def add(self) -> None:
        super().add()
        if len(self.nodes) == 2:  # the task starts on 2 workers, as torchrun's first round
            wait_for(lambda: len(self.client.workers()) >= 2, 60, 0.02)
            self.task = self._submit()

    def _submit(self) -> Task:
        return self.client.submit(
            TaskSpec(
                name="torchrun-vs",
                handler=HANDLER,
                mode="step",
                subtasks=({"shard": i} for i in range(self.job.shards)),
                max_nodes=MAX_NODES,
                max_attempts=5,
                options={
                    "bench": {"job": self.job.to_json(), "log_dir": str(self.log_dir)},
                    "torch": {
                        "checkpoint_path": str(self.checkpoint),
                        "checkpoint_steps": self.job.checkpoint_steps,
                        "checkpoint_seconds": None,
                    },
                },
            )
        )

    @staticmethod
    def _qw(*args: str) -> list[str]:
        return [sys.executable, "-m", "queueworks", *args]

    def start_node(self, name: str) -> subprocess.Popen[bytes]:
        args = self._qw("worker", "--name", f"{self.prefix}-{name}", "--allow", "bench.torchrun_vs")
        return self.spawn(args, name, self.env)

    def kill(self, i: int) -> None:
        self.nodes[i].proc.kill()  # the worker runs the trainer in its own process

    def done(self) -> bool:
        if not self.task.status(with_nodes=False).finished:
            return False
        wait_released(self.task)  # the leader writes its last checkpoint as it leaves
        return True

    def members(self) -> int:
        return len(self.task.status().nodes)

    def failed(self) -> str | None:
        status = self.task.status(with_nodes=False)
        if status.finished and (status.state.value != "completed" or status.dead):
            return f"task {status.state.value}, {status.dead} dead"
        return None

    def close(self) -> None:
        super().close()
        self.client.close()


class Torchrun(System):
    name = "torchrun"

    def __init__(self, job: Job, profile: Profile, run_dir: Path, share_store: bool) -> None:
        super().__init__(job, profile, run_dir)
        self.port = free_port()  # the c10d store's, bound later by node 1
        self.env = {} if share_store else {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}

    def start_node(self, name: str) -> subprocess.Popen[bytes]:
        host = f"is_host={'true' if name == 'n1' else 'false'}"  # node 1 hosts the c10d store
        args = [
            sys.executable, "-m", "torch.distributed.run",
            f"--nnodes=1:{MAX_NODES}", "--nproc-per-node=1", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{self.port}", f"--rdzv-id=bench{self.port}",
            "--max-restarts=50", "--local-addr=127.0.0.1",
            f"--rdzv-conf={','.join(filter(None, [host, self.profile.rdzv_conf]))}",
            "-m", "bench.torchrun_job", "--job", self.job.to_json(),
            "--log-dir", str(self.log_dir), "--checkpoint", str(self.checkpoint),
        ]  # fmt: skip
        return self.spawn(args, name, self.env)

    def kill(self, i: int) -> None:
        """The node dies: its agent and the worker it runs (in another session)."""
        node = self.nodes[i]
        workers = _children(node.proc.pid)
        node.proc.kill()
        for pid in workers:
            _signal(pid, signal.SIGKILL)

    def done(self) -> bool:
        live = [n for n in self.nodes if n.alive()]
        if live:
            for n in live:
                n.pids.update(_children(n.proc.pid))
            return False
        return any(n.proc.returncode == 0 for n in self.nodes)

    def failed(self) -> str | None:
        if any(n.alive() for n in self.nodes) or self.done():
            return None
        return "every agent exited, none with 0"


# -- the step logs ----------------------------------------------------------------------------


class Logs:
    """Every rank's step log, read incrementally (only complete lines)."""

    def __init__(self, log_dir: Path) -> None:
        self.dir = log_dir
        self.offsets: dict[Path, int] = {}
        self.rows: list[dict[str, Any]] = []
        self.starts: list[dict[str, Any]] = []  # torchrun: one per worker process

    def read(self) -> list[dict[str, Any]]:
        for path in sorted(self.dir.glob("*.jsonl")):
            with path.open("rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            end = data.rfind(b"\n") + 1
            self.offsets[path] = self.offsets.get(path, 0) + end
            for line in data[:end].splitlines():
                row = json.loads(line)
                (self.rows if "step" in row else self.starts).append(row)
        return self.rows


@dataclass
class Step:
    """One step of the group, merged from its ranks' lines."""

    gen: str
    key: int  # queueworks: the step's seq in its generation; torchrun: its step number
    step: int  # updates applied once it committed
    t: float  # the earliest rank's line
    world: int
    shards: set[int]
    committed: bool


def steps_of(system: str, rows: list[dict[str, Any]]) -> list[Step]:
    out: dict[tuple[str, int], Step] = {}
    for r in rows:
        key = r["seq"] if system == "queueworks" else r["step"]
        s = out.setdefault(
            (r["gen"], key),
            Step(r["gen"], key, r["step"], r["t"], r["world"], set(), r["committed"]),
        )
        s.t = min(s.t, r["t"])
        s.step = max(s.step, r["step"])
        s.shards.update(r["shards"])
    return sorted(out.values(), key=lambda s: s.t)


def effective(system: str, steps: list[Step]) -> list[Step]:
    """The steps whose updates are in the final model, in order.

    queueworks never throws away a committed update while a member survives. torchrun
    throws away every step after the snapshot it restarts from: walking back from the end,
    a step is in the final model when its number is below every later step's.
    """
    if system == "queueworks":
        return [s for s in steps if s.committed]
    keep: list[Step] = []
    low = float("inf")
    for s in reversed(steps):
        if s.step < low:
            keep.append(s)
            low = s.step
    return keep[::-1]


# -- the scenario ---------------------------------------------------------------------------


@dataclass
class Change:
    what: str
    at: float  # fraction of the shards trained before it is made
    size: int  # node count after it
    act: Callable[[System], None]
    t: float = 0.0
    reached: bool = False
    members_t: float | None = None  # queueworks: the node set had the new size


def _watch(sys_: System, changes: list[Change]) -> None:
    made = [c for c in changes if c.t]
    if made and made[-1].members_t is None and sys_.members() == made[-1].size:
        made[-1].members_t = time.time()


def _add_two(s: System) -> None:
    s.add()  # both start at once, as a scale-up of 2 would
    s.add()


def scenario() -> list[Change]:
    return [
        Change("add 2", 0.10, 4, _add_two),
        Change("SIGKILL 1", 0.40, 3, lambda s: s.kill(1)),
        Change("remove 1 (SIGTERM)", 0.65, 2, lambda s: s.remove(3)),
    ]


def _remove_two(first: int) -> Callable[[System], None]:
    """SIGTERM nodes ``first`` and ``first + 1`` at once."""

    def act(s: System) -> None:
        s.remove(first)
        s.remove(first + 1)

    return act


def rounds(k: int) -> list[Change]:
    """``k`` rounds of: 2 nodes join at once, then the same 2 leave gracefully (SIGTERM),
    spread over the data: how fast every round of joins reaches its new size."""
    out = []
    span = 0.85 / k  # of the data, per round: the joins at its start, the leaves halfway
    for r in range(k):
        at = 0.05 + r * span
        out += [
            Change(f"add 2 (round {r + 1})", at, 4, _add_two),
            Change(f"remove 2 (round {r + 1})", at + span / 2, 2, _remove_two(2 + 2 * r)),
        ]  # (nodes are numbered in start order: this round's joiners are 2 + 2r and 3 + 2r)
    return out


def _progress(steps: list[Step], n: int) -> float:
    done = {x for s in steps if s.committed for x in s.shards}
    return len(done) / n


def _ready(job: Job, steps: list[Step], size: int, since: float, at: float) -> bool:
    """Time for the next change: the last one has settled (a step at its size), ``at`` of
    the shards are trained, and the step count is halfway between two torchrun snapshots
    (the average case of a change at a random time; the same rule for both systems)."""
    if not any(s.world == size and s.t > since for s in steps):
        return False
    if _progress(steps, job.shards) < at:
        return False
    last = max(s.step for s in steps if s.committed)
    return last % job.checkpoint_steps >= job.checkpoint_steps // 2


def drive(
    sys_: System, timeout: float, static: int = 0, k: int = 0
) -> tuple[float, list[Change], str | None]:
    """Run the scenario (or ``static`` nodes, no change; or ``k`` rounds of joins and
    leaves) on one system; returns (start time, changes, error or None)."""
    logs = Logs(sys_.log_dir)
    changes = [] if static else rounds(k) if k else scenario()
    t0 = time.time()
    for _ in range(static or 2):
        sys_.add()
    target, since = 2, t0
    deadline = time.monotonic() + timeout

    def at_size(size: int, after: float) -> bool:
        return any(s.world == size and s.t > after for s in steps_of(sys_.name, logs.read()))

    for change in changes:
        while True:
            steps = steps_of(sys_.name, logs.read())
            if _ready(sys_.job, steps, target, since, change.at):
                break
            if (err := sys_.failed()) or sys_.done():
                sizes = sorted({s.world for s in steps})
                done = _progress(steps, sys_.job.shards)
                why = f"finished before '{change.what}' (sizes stepped {sizes}, {done:.0%} trained)"
                return t0, changes, err or why
            if time.monotonic() > deadline:
                return t0, changes, f"no step at size {target} before '{change.what}'"
            _watch(sys_, changes)
            time.sleep(0.02)
        change.t = time.time()
        change.act(sys_)
        target, since = change.size, change.t
    while not sys_.done():  # polled 10 times a second: the driver's CPU is not the job's
        if err := sys_.failed():
            return t0, changes, err
        if time.monotonic() > deadline:
            return t0, changes, "did not finish in time"
        _watch(sys_, changes)
        time.sleep(0.1)
    for change in changes:
        change.reached = at_size(change.size, change.t)
    return t0, changes, None


# -- the figures ------------------------------------------------------------------------------


def replay_loss(job: Job, steps: list[Step]) -> float:
    """The committed steps replayed in one process: each one Adam step over its shards."""
    model = build_model(job)
    opt = build_optimizer(job, model)
    for s in steps:
        xs, ys = zip(*(shard_data(job, i) for i in sorted(s.shards)), strict=True)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(torch.cat(xs)), torch.cat(ys))
        torch.autograd.backward(loss)
        opt.step()
    return eval_loss(job, model)


def _cause(changes: list[Change], start: float, end: float) -> int | None:
    """The change made while a torchrun generation ran (the one that ended it)."""
    for i, c in enumerate(changes):
        if start - 0.5 <= c.t <= end + 1.0:
            return i
    return None


def _wasted(
    job: Job, changes: list[Change], steps: list[Step], eff: list[Step]
) -> list[dict[str, int]]:
    """Repeated and aborted steps and samples, per change (a last row: none of them)."""
    rows = [dict.fromkeys(WASTE, 0) for _ in [*changes, None]]
    kept = {id(s) for s in eff}
    gens: dict[str, list[Step]] = defaultdict(list)
    for s in steps:
        gens[s.gen].append(s)
    for s in steps:
        if id(s) in kept:
            continue
        if s.committed:  # applied, then thrown away by a restart from an older snapshot
            kind, i = "repeated", _cause(changes, gens[s.gen][0].t, gens[s.gen][-1].t)
        else:  # never applied
            kind = "aborted"
            i = max((k for k, c in enumerate(changes) if c.t <= s.t), default=None)
        row = rows[-1 if i is None else i]
        row[f"{kind}_steps"] += 1
        row[f"{kind}_samples"] += len(s.shards) * job.shard_size
    return rows


WASTE = ("repeated_steps", "repeated_samples", "aborted_steps", "aborted_samples")


def _timing(c: Change, steps: list[Step], starts: list[dict[str, Any]]) -> dict[str, Any]:
    """To the first step at the change's size; the longest stretch without a step meanwhile;
    the sizes stepped at; torchrun: when the new workers were started."""
    first = next((s for s in steps if s.t > c.t and s.world == c.size and s.committed), None)
    if first is None:
        return {"to_new_size": None, "paused": None, "sizes_seen": [], "settled": None}
    done = [s.t for s in steps if s.committed]
    ts = [max([t for t in done if t <= c.t], default=c.t)]
    ts += [t for t in done if c.t < t < first.t] + [first.t]
    seen: list[int] = []
    for s in steps:
        if c.t < s.t <= first.t and (not seen or seen[-1] != s.world):
            seen.append(s.world)
    launched = [x["launched"] for x in starts if x["gen"] == first.gen]
    settled = c.members_t if c.members_t is not None else (min(launched) if launched else None)
    return {
        "to_new_size": first.t - c.t,
        "paused": max(b - a for a, b in itertools.pairwise(ts)),
        "sizes_seen": seen,
        "settled": None if settled is None else settled - c.t,
    }


def _overlaps(steps: list[Step]) -> int:
    """Pairs of generations that stepped at the same time (two groups training at once)."""
    spans: dict[str, list[float]] = {}
    for s in steps:
        span = spans.setdefault(s.gen, [s.t, s.t])
        span[1] = s.t
    ordered = sorted(spans.values())
    return sum(1 for a, b in itertools.pairwise(ordered) if b[0] < a[1])


def _step_ms(steps: list[Step]) -> dict[int, float]:
    """Median time per committed step at each size, between consecutive steps of one
    generation (steps torchrun threw away later count: they ran as fast)."""
    gaps: dict[int, list[float]] = defaultdict(list)
    for a, b in itertools.pairwise(s for s in steps if s.committed):
        if a.gen == b.gen and a.world == b.world:
            gaps[a.world].append(b.t - a.t)
    return {w: 1000 * statistics.median(v) for w, v in sorted(gaps.items())}


def _rate_at(job: Job, steps: list[Step], size: int) -> float | None:
    """Samples/s over the committed steps at ``size`` nodes, first to last (the steps after
    the first, over the time they took): a run's rate without its start-up or changes."""
    at = [s for s in steps if s.committed and s.world == size]
    if len(at) < 2:
        return None
    samples = sum(len(s.shards) for s in at[1:]) * job.shard_size
    return samples / (at[-1].t - at[0].t)


def analyse(
    name: str,
    job: Job,
    t0: float,
    changes: list[Change],
    logs: Logs,
    checkpoint: Path,
    size: int = 2,
) -> dict[str, Any]:
    """Every figure of one system's run (``size``: the node count whose steady rate counts)."""
    steps = steps_of(name, logs.rows)
    eff = effective(name, steps)
    in_eff: dict[int, int] = defaultdict(int)
    for s in eff:
        for x in s.shards:
            in_eff[x] += 1
    waste = _wasted(job, changes, steps, eff)
    per = [
        {"what": c.what, "size": c.size, "t": c.t - t0, **w, **_timing(c, steps, logs.starts)}
        for c, w in zip(changes, waste, strict=False)
    ]
    sizes = [k for k, _ in itertools.groupby(s.world for s in eff)]
    stepped = [k for k, _ in itertools.groupby(s.world for s in steps if s.committed)]
    final, final_steps = checkpoint_loss(job, checkpoint)
    first_t, last_t = eff[0].t, eff[-1].t
    return {
        "system": name,
        "changes": per,
        "unattributed": waste[-1],
        "sizes": sizes,  # of the steps in the final model
        "sizes_stepped": stepped,  # of every committed step
        "generations": len({s.gen for s in steps}),
        "overlapping_generations": _overlaps(steps),
        "steps": len(eff),
        "step_ms": _step_ms(steps),
        "checkpoint_steps": final_steps,
        "lost_samples": sum(job.shard_size for x in range(job.shards) if x not in in_eff),
        "twice_samples": sum(job.shard_size * (k - 1) for k in in_eff.values() if k > 1),
        "repeated_samples": sum(w["repeated_samples"] for w in waste),
        "aborted_steps": sum(w["aborted_steps"] for w in waste),
        "startup": first_t - t0,
        "wall": last_t - first_t,
        "samples_per_s": job.shards * job.shard_size / (last_t - first_t),
        "samples_per_s_at": _rate_at(job, steps, size),
        "final_loss": final,
        "replay_loss": replay_loss(job, eff),
    }


# -- running and printing -----------------------------------------------------------------


@contextmanager
def system(
    name: str, job: Job, profile: Profile, run_dir: Path, url: str, share_store: bool
) -> Iterator[System]:
    s: System = (
        Queueworks(job, profile, run_dir, url)
        if name == "queueworks"
        else Torchrun(job, profile, run_dir, share_store)
    )
    try:
        yield s
    finally:
        s.close()


def run_profile(job: Job, profile: Profile, run_dir: Path, url: str, args: Any) -> dict[str, Any]:
    """Each system through the scenario (or ``--static``), ``--repeat`` times, alternately."""
    out: dict[str, Any] = {"profile": profile.name, "static": args.static, "systems": []}
    for rep, name in itertools.product(range(args.repeat), args.systems.split(",")):
        where = run_dir / profile.name / str(rep)
        with system(name, job, profile, where, url, args.torch_share_store) as s:
            t_start = time.monotonic()
            t0, changes, err = drive(s, args.timeout, args.static, args.rounds)
            logs = Logs(s.log_dir)
            logs.read()
            res: dict[str, Any] = {"system": name, "error": err}
            if err is None:
                figures = analyse(name, job, t0, changes, logs, s.checkpoint, args.static or 2)
                res = {**figures, "error": None}
            res["total"] = time.monotonic() - t_start
            res["run_dir"] = str(s.dir)
            out["systems"].append(res)
            print(
                f"  {profile.name}/{name}: {'ok' if err is None else err}"
                f" in {res['total']:.0f} s (logs: {s.dir})",
                flush=True,
            )
    return out


def _f(v: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def table(result: dict[str, Any]) -> str:
    """Markdown: one row per system and change, then one per system."""
    lines = [
        f"profile {result['profile']}:",
        "",
        "| system | change | to new size (s) | paused (s) | sizes seen | membership"
        " settled (s) | repeated steps / samples | aborted steps |",
        "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for s in result["systems"]:
        if s.get("error"):
            lines.append(f"| {s['system']} | failed: {s['error']} | | | | | | |")
            continue
        for c in s["changes"]:
            lines.append(
                f"| {s['system']} | {c['what']} | {_f(c['to_new_size'], '{:.2f}')}"
                f" | {_f(c['paused'], '{:.2f}')} | {' → '.join(map(str, c['sizes_seen']))}"
                f" | {_f(c['settled'], '{:.2f}')}"
                f" | {c['repeated_steps']} / {c['repeated_samples']} | {c['aborted_steps']} |"
            )
    lines += [
        "",
        "| system | startup (s) | wall (s) | samples/s | ms/step at 2 / 3 / 4 | lost / twice"
        " | generations | final loss | replayed | one process |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in result["systems"]:
        if not s.get("error"):
            lines.append(
                f"| {s['system']} | {s['startup']:.1f} | {s['wall']:.1f} | {s['samples_per_s']:.0f}"
                f" | {' / '.join(_f(s['step_ms'].get(w), '{:.0f}') for w in (2, 3, 4))}"
                f" | {s['lost_samples']} / {s['twice_samples']} | {s['generations']}"
                f" | {s['final_loss']:.4f} | {s['replay_loss']:.4f} | {result['reference']:.4f} |"
            )
    return "\n".join(lines)


def steady(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per system, medians over its runs: the steady step (ms, at the static size, else at
    2 nodes) and samples/s (static: over the steps at that size, start-up left out; else
    over the whole run)."""
    out: dict[str, dict[str, float]] = {}
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in result["systems"]:
        if not s.get("error"):
            runs[s["system"]].append(s)
    for name, rs in runs.items():
        size = result.get("static") or 2
        ms = [r["step_ms"][size] for r in rs if size in r["step_ms"]]
        key = "samples_per_s_at" if result.get("static") else "samples_per_s"
        rates = [r[key] for r in rs if r.get(key)]
        joins = [
            c["to_new_size"] for r in rs for c in r.get("changes", ()) if c["what"][:3] == "add"
        ]
        out[name] = {
            "runs": len(rs),
            "step_ms": statistics.median(ms) if ms else float("nan"),
            "samples_per_s": statistics.median(rates) if rates else float("nan"),
        }
        if joins:  # a join that never reached its size counts as the worst: infinite
            worst = [float("inf") if j is None else j for j in joins]
            out[name] |= {
                "joins": len(joins),
                "join_s": statistics.median(worst),
                "join_worst_s": max(worst),
            }
    return out


def steady_table(result: dict[str, Any]) -> str:
    """Rows: the steady step and the samples/s, each system beside the others (medians)."""
    figures = steady(result)
    if not figures:
        return ""
    names = list(figures)
    size = result.get("static") or 2
    rate = f"samples/s at {size} nodes, no failure" if result.get("static") else "samples/s"
    runs = min(f["runs"] for f in figures.values())
    lines = [
        f"| median of {runs} run(s) | {' | '.join(names)} |"
        + (" queueworks ÷ torchrun |" if {"queueworks", "torchrun"} <= set(names) else ""),
        "| --- |" + " ---: |" * (len(names) + ({"queueworks", "torchrun"} <= set(names))),
    ]
    rows = [
        ("step_ms", f"steady step at {size} nodes (ms)", "{:.1f}"),
        ("samples_per_s", rate, "{:.0f}"),
    ]
    if all("joins" in f for f in figures.values()):
        joins = min(f["joins"] for f in figures.values())
        rows += [
            ("join_s", f"2 joining at once: to new size (s), median of {joins}", "{:.2f}"),
            ("join_worst_s", "2 joining at once: to new size (s), worst", "{:.2f}"),
        ]
    for key, label, fmt in rows:
        row = f"| {label} | " + " | ".join(fmt.format(figures[n][key]) for n in names) + " |"
        if {"queueworks", "torchrun"} <= set(names):
            row += f" {figures['queueworks'][key] / figures['torchrun'][key]:.2f} |"
        lines.append(row)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="a faster pace, matched profile (CI)")
    ap.add_argument("--profiles", help="comma list of default,matched [both; matched with --smoke]")
    ap.add_argument("--systems", default="queueworks,torchrun")
    ap.add_argument("--shards", type=int, help="shards of 32 samples [2400]")
    ap.add_argument("--pace", type=float, help="seconds per shard [0.03; 0.02 with --smoke]")
    ap.add_argument("--timeout", type=float, help="per system run [300 s; 240 s with --smoke]")
    ap.add_argument(
        "--torch-share-store",
        action="store_true",
        help="leave torch's TCPStore sharing on (torch 2.13.0: joiners never get in)",
    )
    ap.add_argument("--static", type=int, default=0, help="N nodes throughout, no change")
    ap.add_argument(
        "--rounds", type=int, default=0, help="K rounds of 2 joins then 2 leaves, no failure"
    )
    ap.add_argument("--repeat", type=int, default=1, help="runs per system, alternately [1]")
    ap.add_argument("--json", help="write every figure here")
    args = ap.parse_args(argv)
    # the driver's own training (the one-process reference, the replays) is of tiny
    # tensors: more threads only spin, beside the systems' processes (19 CPU-s, not 1)
    torch.set_num_threads(1)
    args.profiles = args.profiles or ("matched" if args.smoke else "default,matched")
    args.timeout = args.timeout or (240.0 if args.smoke else 300.0)  # smoke: CI, under load
    job = Job(
        shards=args.shards or 2400,  # smoke: a joiner's start may take 15 s under load
        pace=args.pace if args.pace is not None else (0.02 if args.smoke else 0.03),
    )
    run_dir = Path(tempfile.mkdtemp(prefix="qw-torchrun-vs-"))
    print(
        f"torch {torch.__version__}, {os.cpu_count()} cpus; {job.shards} shards of"
        f" {job.shard_size} samples, pace {job.pace} s/shard; logs: {run_dir}",
        flush=True,
    )
    results: dict[str, Any] = {"job": asdict(job), "torch": torch.__version__, "profiles": []}
    with private_redis() as server:
        for p in args.profiles.split(","):
            results["profiles"].append(run_profile(job, PROFILES[p], run_dir, server.url, args))
    ref = reference_loss(job)
    for r in results["profiles"]:
        r["reference"] = ref
        r["steady"] = steady(r)
        print("\n" + table(r) + "\n\n" + steady_table(r))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
