"""Step mode under many members joining and leaving at once, with real worker processes and
real torch.distributed (gloo, CPU): two start together and later stop together, round after
round; and a seeded random schedule of joins, graceful leaves and SIGKILLs. Each change must
end in steps at the new size, and no joiner's run may end while the task runs.

Most of each test is worker start-up (importing torch takes seconds on a loaded machine);
the changes themselves take well under a second once every process is up."""

from __future__ import annotations

import json
import os
import random
import time
from types import SimpleNamespace
from typing import Any

import pytest
import redis
import structlog

from queueworks import Client, Task
from queueworks.protocol.keys import Keys
from tests.conftest import TORCH_INSTALL, Cluster, Proc, need_packages, wait_for

pytestmark = [pytest.mark.timeout(600)]

need_packages("torch", "numpy", install=TORCH_INSTALL)  # skipped for a user, a failure in CI

ALLOW = ("examples.elastic_training",)
ENV = {"QUEUEWORKS_TORCH_HOST": "127.0.0.1", "OMP_NUM_THREADS": "1"}
CHANGE_TIMEOUT = 60.0  # generous: a joiner's start-up is most of it, and CI is loaded
# the first steps: two workers start, import torch and form the gang (over 60 s in a suite at
# load average 20 on two cores)
START_TIMEOUT = 150.0


class Steps:
    """The members' step records (the example's Redis list), read incrementally."""

    def __init__(self, r: redis.Redis, key: str) -> None:
        self.r, self.key = r, key
        self.rows: list[dict[str, Any]] = []

    def read(self) -> list[dict[str, Any]]:
        more = self.r.lrange(self.key, len(self.rows), -1)
        self.rows += [json.loads(x) for x in more]
        return self.rows

    def at_size(self, size: int, since: float) -> bool:
        """A committed step with a shard at ``size`` members, recorded after ``since``."""
        return any(
            x["committed"] and x["shards"] and x["world_size"] == size and x["t"] > since
            for x in self.read()
        )


@pytest.mark.integration
def test_a_failed_group_init_leaves_the_next_group_named_as_its_peers_name_it(
    r: redis.Redis, keys: Keys
) -> None:
    """torch names the default group by a process-wide counter that a failed
    ``init_process_group`` advances (the node set changed in the middle of it): the next
    generation must still be named "0", as every peer names it, or it never forms."""
    import datetime

    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import PrefixStore, TCPStore

    from queueworks.protocol.models import Role
    from queueworks.task.steps import Generation
    from queueworks.torch.options import TorchOptions
    from queueworks.torch.rendezvous import Group

    second = datetime.timedelta(seconds=0.5)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=second)
    with pytest.raises(RuntimeError):  # rank 1 never comes
        dist.init_process_group(
            "gloo", store=PrefixStore("qw", store), rank=0, world_size=2, timeout=second
        )
    assert not dist.is_initialized()
    ctx = SimpleNamespace(
        redis=r, keys=keys.task("t1"), log=structlog.get_logger(), wait=lambda s: False
    )
    group = Group(ctx, TorchOptions(), torch.device("cpu"), "127.0.0.1")  # type: ignore[arg-type]
    try:
        group.form(Generation(Role(rank=0, world_size=1, epoch=1)))
        assert dist.distributed_c10d._get_default_group().group_name == "0"
    finally:
        group.close(forget=True)


@pytest.mark.integration
def test_a_rendezvous_has_one_fate_even_when_a_member_gives_up_as_the_last_one_comes(
    r: redis.Redis, keys: Keys
) -> None:
    """Members meet in the leader's store before ``init_process_group``. One that gives up
    (the node set changed) as the last one comes must agree with it: all go into
    ``init_process_group`` or none does. Else one waits there alone, its whole timeout."""
    import datetime
    import threading

    import torch
    from torch._C._distributed_c10d import TCPStore

    from queueworks.errors import StepAborted
    from queueworks.protocol.models import Role
    from queueworks.task.steps import Generation
    from queueworks.torch.options import TorchOptions
    from queueworks.torch.rendezvous import Group

    timeout = datetime.timedelta(seconds=5)

    def member(rank: int, world: int, wait: Any) -> tuple[Group, Generation]:
        ctx = SimpleNamespace(redis=r, keys=keys.task("t1"), log=structlog.get_logger(), wait=wait)
        group = Group(ctx, TorchOptions(), torch.device("cpu"), "127.0.0.1")  # type: ignore[arg-type]
        return group, Generation(Role(rank=rank, world_size=world, epoch=1))

    # The first to come gives up at once: the others, the last one too, give up with it.
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timeout)

    def unchanged(seconds: float) -> bool:
        time.sleep(seconds)
        return False

    def changed(seconds: float) -> bool:
        return True

    for rank, wait in enumerate([changed, unchanged, unchanged]):
        group, gen = member(rank, 3, wait)
        store = TCPStore("127.0.0.1", master.port, is_master=False, timeout=timeout)
        with pytest.raises(StepAborted):
            group._arrive(store, gen)

    # Every member came before one gave up: it goes on with them.
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timeout)
    last_came = threading.Event()
    outcome: list[str] = []

    def first() -> None:
        group, gen = member(0, 2, lambda s: last_came.wait(5) or True)
        try:
            group._arrive(master, gen)
            outcome.append("formed")
        except StepAborted as exc:
            outcome.append(f"gave up: {exc}")

    thread = threading.Thread(target=first)
    thread.start()
    group, gen = member(1, 2, unchanged)
    group._arrive(TCPStore("127.0.0.1", master.port, is_master=False, timeout=timeout), gen)
    last_came.set()
    thread.join(10)
    assert outcome == ["formed"]


def start(cluster: Cluster) -> Proc:
    return cluster.worker(allow=ALLOW, env=ENV)


def runs_ended(proc: Proc) -> list[str]:
    """The outcomes of the task runs a worker's log says ended."""
    out = []
    for line in proc.log().splitlines():
        if '"task_run_ended"' in line:
            out.append(json.loads(line)["outcome"])
    return out


def reach(steps: Steps, size: int, since: float, what: str) -> float:
    timeout = START_TIMEOUT if since == 0.0 else CHANGE_TIMEOUT
    wait_for(lambda: steps.at_size(size, since), timeout, what, 0.05)
    return time.time() - since


def running_task(
    cluster: Cluster, client: Client, log: str, shards: int, pace: float = 0.1
) -> Task:
    from examples.elastic_training import Config, task_spec

    # paced by sleeping (0.1 s a shard): the tests wait on process starts, and every step
    # taken meanwhile costs each member CPU (a collective, a step record, the optimizer)
    cfg = Config(shards=shards, pace=pace, step_log=log)
    cluster.controller()
    return client.submit(task_spec(cfg))


def stop_together(procs: list[Proc]) -> None:
    for p in procs:
        p.signal(15)
    for p in procs:
        p.p.wait(30)


@pytest.mark.system
@pytest.mark.slow(30)
def test_two_join_and_two_leave_at_once_round_after_round(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str
) -> None:
    steps = Steps(r, f"{prefix}:steps")
    task = running_task(cluster, client, steps.key, shards=20_000)
    base = [start(cluster), start(cluster)]
    reach(steps, 2, 0.0, "steps on 2 workers")
    for rnd in range(2):
        t = time.time()
        joiners = [start(cluster), start(cluster)]
        took = reach(steps, 4, t, f"round {rnd}: steps on 4 workers")
        print(f"round {rnd}: stepping at 4 {took:.2f} s after the 2 processes started")
        for p in joiners:  # no joiner's run ended while the task runs
            assert runs_ended(p) == [], (p.name, p.log()[-3000:])
        t = time.time()
        for p in joiners:
            p.signal(15)
        took = reach(steps, 2, t, f"round {rnd}: steps on 2 workers again")
        print(f"round {rnd}: stepping at 2 {took:.2f} s after both were stopped")
        assert took < 10.0, took  # a graceful leave needs no failure detection
        stop_together(joiners)
        for p in joiners:
            assert runs_ended(p) == ["stopping"], (p.name, p.log()[-3000:])
    assert all(p.alive() for p in base)
    assert not task.status(with_nodes=False).finished
    task.cancel()


def schedule(rng: random.Random, changes: int) -> list[tuple[str, int]]:
    """Changes that keep the node set between 1 and 4: (what, how many)."""
    size, out = 2, []
    for _ in range(changes):
        moves = [("join", k) for k in (1, 2) if size + k <= 4]
        moves += [("leave", k) for k in (1, 2) if size - k >= 1]
        moves += [("kill", 1)] if size >= 2 else []
        what, k = rng.choice(moves)
        size += k if what == "join" else -k
        out.append((what, k))
    return out


@pytest.mark.system
@pytest.mark.slow(35)
def test_random_joins_leaves_and_kills(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str
) -> None:
    seed = int(os.environ.get("QW_JOINS_SEED", random.randrange(1 << 30)))
    plan = schedule(random.Random(seed), 3)
    print(f"seed {seed} (QW_JOINS_SEED={seed} repeats it): {plan}")
    steps = Steps(r, f"{prefix}:steps")
    task = running_task(cluster, client, steps.key, shards=20_000)
    members = [start(cluster), start(cluster)]
    reach(steps, 2, 0.0, "steps on 2 workers")
    rng = random.Random(seed)
    for what, k in plan:
        t = time.time()
        if what == "join":
            members += [start(cluster) for _ in range(k)]
        else:
            gone = rng.sample(members, k)
            members = [p for p in members if p not in gone]
            if what == "kill":
                for p in gone:
                    p.kill()
            else:
                stop_together(gone)
                assert all(runs_ended(p) == ["stopping"] for p in gone), seed
        took = reach(steps, len(members), t, f"seed {seed}: {what} {k} -> {len(members)}")
        print(f"{what} {k}: stepping at {len(members)} after {took:.2f} s")
        for p in members:  # nobody still in the node set ended its run
            assert runs_ended(p) == [], (seed, p.name, p.log()[-3000:])
    assert not task.status(with_nodes=False).finished
    task.cancel()


@pytest.mark.system
@pytest.mark.slow(30)
def test_a_member_paused_past_its_ttl_comes_back_and_nothing_trains_twice(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str
) -> None:
    """A member frozen in the middle of its steps (SIGSTOP) is pruned; its peer trains on
    alone. Thawed, it finds its step's end fenced: whatever update it applied without the
    node set is dropped (its state comes from the peer at the next group), it rejoins, and
    every shard is in exactly one committed step. (Thawed inside the step's collective,
    that collective fails instead, and it leaves as pruned and joins again.)"""
    steps = Steps(r, f"{prefix}:steps")
    shards = 600  # (it ends the test: paced to end in seconds after the thaw)
    task = running_task(cluster, client, steps.key, shards=shards, pace=0.03)
    # a TTL twice the default: the frozen member is pruned all the same, a few seconds
    # later, but the peer's heartbeat is not lost in a loaded suite's stalls (it would then
    # be pruned too, and rejoin: a second run of its own, which is not what is tested here)
    slow_ttl = {**ENV, "QUEUEWORKS_HEARTBEAT_TTL": "6"}
    frozen, peer = (
        cluster.worker(allow=ALLOW, env=slow_ttl),
        cluster.worker(allow=ALLOW, env=slow_ttl),
    )
    reach(steps, 2, 0.0, "steps on 2 workers")
    frozen.signal(19)  # SIGSTOP: no heartbeat, no step
    t = time.time()
    reach(steps, 1, t, "the peer steps alone after the prune")
    frozen.signal(18)  # SIGCONT
    t = time.time()
    reach(steps, 2, t, "steps on 2 workers after the thaw")
    task.wait(timeout=CHANGE_TIMEOUT * 2)
    log = frozen.log()
    # Thawed at its step's end, it finds that end fenced and rejoins in the same run.
    # Thawed inside the step's collective (the peer gone from it), the collective fails,
    # the step is aborted, and it finds itself pruned: that run ends (revoked) and it joins
    # again. Either way its step is not committed (the counts below).
    fenced = '"fenced"' in log
    aborted = '"step_aborted"' in log and runs_ended(frozen)[:1] == ["revoked"]
    assert fenced or aborted, log[-3000:]
    # one run each, ended with the task (the frozen one's first, too, if it was aborted)
    assert len(runs_ended(peer)) <= 1, (peer.name, peer.log()[-3000:])
    assert len(runs_ended(frozen)) <= (1 if fenced else 2), log[-3000:]
    assert "state_kept_ahead" not in frozen.log()  # a peer had the node set's state
    decisions: dict[tuple[str, int], set[bool]] = {}
    in_step: dict[tuple[str, int], set[int]] = {}
    for x in steps.read():
        if x["own"] is not None and not x["shards"]:
            continue  # pruned in the middle of it: it saw no records (nor, maybe, a decision)
        key = (x["generation"], x["seq"])
        decisions.setdefault(key, set()).add(x["committed"])
        in_step.setdefault(key, set()).update(x["shards"])
    assert all(len(d) == 1 for d in decisions.values())  # every member followed one decision
    counts: dict[int, int] = {}
    for key, d in decisions.items():
        if True in d:
            for shard in in_step[key]:
                counts[shard] = counts.get(shard, 0) + 1
    twice = {k for k, v in counts.items() if v != 1}
    about = [x for x in steps.read() if set(x["shards"]) & twice or x["own"] in twice]
    assert counts == {i: 1 for i in range(shards)}, (twice, about)
    status = task.status(with_nodes=False)
    assert (status.done, status.dead) == (shards, 0)
