"""Issue 7: elastic data-parallel training in step mode, with real worker processes, real
torch.distributed (gloo, CPU) and a real SIGKILL. Budget: ~60 s for the file."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis

from queueworks import Client, TaskState
from queueworks.protocol.keys import Keys
from tests.conftest import ROOT, TORCH_INSTALL, Cluster, need_packages, wait_for

pytestmark = [pytest.mark.system, pytest.mark.timeout(600)]  # torch is slow to start


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """The tests' own torch work (the one-process reference, reading checkpoints) is of
    tiny tensors: on more threads it only spins, beside the workers (20x the CPU here)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# found, not imported: the tests import torch (seconds) where they run, not every worker
need_packages("torch", "numpy", install=TORCH_INSTALL)  # its CPU wheel lacks numpy

if TYPE_CHECKING:
    from examples.elastic_training import Config

ALLOW = ("examples.elastic_training",)
ENV = {"QUEUEWORKS_TORCH_HOST": "127.0.0.1"}


def records(r: redis.Redis, key: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in r.lrange(key, 0, -1)]


def committed_steps(rows: list[dict[str, Any]], world: int) -> int:
    return len(
        {
            (x["generation"], x["seq"])
            for x in rows
            if x["committed"] and x["shards"] and x["world_size"] == world
        }
    )


def sizes_by_epoch(r: redis.Redis, keys: Keys, task_id: str) -> dict[int, int]:
    """The node set's size at each epoch, from the task's history (join/leave/prune)."""
    out = {}
    for _, f in r.xrange(keys.task(task_id).history):
        if b"size" in f and f.get(b"cause") != b"rebalanced":
            out[int(f[b"epoch"])] = int(f[b"size"])
    return out


def load(source: Path | bytes, cfg: Config) -> tuple[float, dict[str, int]]:
    """A checkpoint (file or bytes): its model's loss and its progress."""
    import torch

    from examples.elastic_training import build_model, eval_loss

    f = io.BytesIO(source) if isinstance(source, bytes) else source
    state = torch.load(f, map_location="cpu", weights_only=True)
    model = build_model(cfg)
    model.load_state_dict(state["model"])
    return eval_loss(cfg, model), state["progress"]


def test_import_queueworks_does_not_import_torch() -> None:
    code = (
        "import sys, queueworks, queueworks.client.sync, queueworks.cli, "
        "queueworks.workers.worker, "
        "queueworks.workers.lockstep; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


@pytest.mark.slow(50)
@pytest.mark.usefixtures("one_torch_thread")
def test_train_on_2_add_1_kill_1_finish(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str, keys: Keys, tmp_path: Path
) -> None:
    from examples.elastic_training import Config, single_process, task_spec
    from queueworks.torch import wait_released

    log = f"{prefix}:steps"
    cfg = Config(shards=900, pace=0.04, step_log=log)
    checkpoint = tmp_path / "model.pt"
    cluster.controller()
    for _ in range(2):
        cluster.worker(allow=ALLOW, env=ENV)
    cluster.wait_workers(r, 2)
    task = client.submit(task_spec(cfg, checkpoint=str(checkpoint), checkpoint_steps=50))
    wait_for(lambda: committed_steps(records(r, log), 2) >= 5, 120, "steps on 2 workers")
    cluster.worker(allow=ALLOW, env=ENV)
    wait_for(lambda: committed_steps(records(r, log), 3) >= 5, 120, "steps on 3 workers")
    rows = records(r, log)
    assert task.status().done < cfg.shards, "training ended before the kill: raise shards"
    last = max((x for x in rows if x["world_size"] == 3), key=lambda x: x["epoch"])
    leader = next(x["worker"] for x in rows if x["epoch"] == last["epoch"] and x["rank"] == 0)
    victim = next(p for p in cluster.procs if p.name == leader)
    victim.kill()  # the leader: its TCPStore goes too
    task.wait(timeout=300)
    status = wait_released(task)  # the leader writes its last checkpoint as it leaves
    assert status.state == TaskState.COMPLETED, status
    assert (status.done, status.dead) == (cfg.shards, 0)

    rows = records(r, log)
    steps: dict[tuple[str, int], dict[str, Any]] = {}
    for x in rows:
        step = steps.setdefault((x["generation"], x["seq"]), {"committed": set(), "shards": set()})
        step["committed"].add(x["committed"])
        step["shards"].update(x["shards"])
    # every member followed the same decision for every step
    assert all(len(s["committed"]) == 1 for s in steps.values())
    in_committed: dict[int, int] = defaultdict(int)
    in_aborted: dict[int, int] = defaultdict(int)
    for s in steps.values():
        for shard in s["shards"]:
            (in_committed if True in s["committed"] else in_aborted)[shard] += 1
    # every shard contributed to exactly one committed step; any other step it was in aborted
    assert dict(in_committed) == {i: 1 for i in range(cfg.shards)}
    assert in_aborted, "the kill aborted no step"
    # torch's rank and world size are the node set's, in every epoch
    sizes = sizes_by_epoch(r, keys, task.id)
    by_epoch: dict[int, set[tuple[str, int]]] = defaultdict(set)
    for x in rows:
        if x["torch_rank"] >= 0:
            assert (x["torch_rank"], x["torch_world_size"]) == (x["rank"], x["world_size"]), x
            assert x["world_size"] == sizes[x["epoch"]], (x, sizes)
            by_epoch[x["epoch"]].add((x["worker"], x["rank"]))
    for epoch, members in by_epoch.items():  # one rank per worker, one worker per rank
        ranks = [rank for _, rank in members]
        assert len(set(ranks)) == len(ranks) == len({w for w, _ in members}), (epoch, members)
    assert {x["world_size"] for x in rows if x["committed"]} >= {2, 3}
    # the final model: every sample applied exactly once, loss as good as one process's
    final, progress = load(checkpoint, cfg)
    committed = sum(1 for s in steps.values() if True in s["committed"] and s["shards"])
    assert progress == {"steps": committed, "samples": cfg.shards * cfg.shard_size}
    reference = single_process(cfg)
    assert abs(final - reference) <= 0.05 * reference, (final, reference)


@pytest.mark.slow(30)
@pytest.mark.usefixtures("one_torch_thread")
def test_losing_every_member_resumes_from_the_checkpoint(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str, keys: Keys
) -> None:
    """Checkpoints in Redis this time; the only member is SIGKILLed, a new one resumes."""
    from examples.elastic_training import Config, task_spec
    from queueworks.torch import wait_released

    log = f"{prefix}:steps"
    cfg = Config(shards=300, pace=0.02, step_log=log)
    cluster.controller()
    first = cluster.worker(allow=ALLOW, env=ENV)
    spec = task_spec(cfg, checkpoint_redis=True, checkpoint_steps=20, checkpoint_seconds=None)
    task = client.submit(spec)
    key = keys.task(task.id).checkpoint

    def saved_steps() -> int:
        blob = r.get(key)
        return load(blob, cfg)[1]["steps"] if blob else 0

    wait_for(lambda: saved_steps() >= 40, 120, "two checkpoints", 0.2)
    first.kill()
    at_kill = saved_steps()
    second = cluster.worker(allow=ALLOW, env=ENV)
    task.wait(timeout=300)
    status = wait_released(task)
    assert status.state == TaskState.COMPLETED, status
    assert (status.done, status.dead) == (cfg.shards, 0)
    mine = [x for x in records(r, log) if x["worker"] == second.name and x["applied"]]
    # resumed from a checkpoint, not from zero (a save in flight at the kill may land late)
    resumed = mine[0]["steps"] - 1
    assert resumed >= at_kill >= 40 and resumed % 20 == 0, (at_kill, mine[0])
    final, progress = load(r.get(key) or b"", cfg)
    # the final model: the checkpoint, then one shard per step of the new member; the
    # updates the first one made after its last checkpoint died with it (documented)
    assert progress["steps"] == resumed + len(mine) == mine[-1]["steps"], progress
    assert progress["samples"] == progress["steps"] * cfg.shard_size, progress
    assert final < 0.15, final  # still trained: the noise floor is 0.09
