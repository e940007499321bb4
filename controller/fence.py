"""Fenced writes: every write of a controller pass takes effect only while its writer leads.

A pass collects its writes in a `Batch` (ops of ``queueworks/lua/fenced.lua``: set an
assignment, emit an event, move a task's state...), and `Fence.apply` runs them through that
script, which checks the fence first and writes nothing when it fails:

- **One server**: the fence is the lease itself. The whole batch is one script call (split
  only past ``CALL_OPS`` ops) that runs only if the lease holds this controller's token
  ``<id>#<term>`` at that moment; a controller whose lease expired, or that lost it to a
  standby and won it back, writes nothing with its old token.
- **Redis Cluster**: the lease lives in one slot and a pass writes keys of many, and a script
  may touch one slot only. Each slot has a term key (``qw:fence:{<tag>}``); a write of term
  *t* runs only if its slot's term key holds no term above *t*, and raises it to *t*. A new
  leader *seals* every slot (16,384 tiny scripts, pipelined per node) right after winning the
  lease and before it reads anything: from then on no write of an older term lands anywhere,
  and what an older leader wrote before the seal is in what the new one reads. Between the
  old lease's expiry and the seal an older leader's writes still land; nobody else writes
  then, and the new leader reads them. The term keys never expire (16,384 small strings).

Ops run in ``stage`` order; ``when`` makes an op depend on an earlier one's reply (an event
only when the state really changed). On one server all of it is one atomic call; on a
cluster each stage is one pipelined round trip, slot by slot, and the dependencies between
slots are resolved between stages.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import NoScriptError, ResponseError

from queueworks.protocol.keys import Keys
from queueworks.scripts.bound import ACTIVE, Scripts
from queueworks.transport.connection import Connection

from .tally import Tally

CALL_OPS = 2000  # ops per script call on one server: a call blocks Redis while it runs
SLOTS = 16384
Arg = str | int | float


@dataclass(frozen=True)
class Op:
    name: str
    keys: tuple[str, ...]
    args: tuple[Arg, ...]
    when: int = 0  # 0 always; +n only if op n (1-based) replied 1; -n only if it replied 0
    stage: int = 0
    unit: int = 0  # ops of one unit stay in one call on one server, run in stage order


@dataclass
class Batch:
    """The writes of one pass, in order. ``add`` returns the op's number, for ``when``."""

    ops: list[Op] = field(default_factory=list)
    units: int = 0

    def unit(self) -> int:
        """A new unit: ops that must run in stage order with each other (one call)."""
        self.units += 1
        return self.units

    def add(
        self,
        name: str,
        keys: Sequence[str],
        *args: Arg,
        when: int = 0,
        stage: int = 0,
        unit: int = 0,
    ) -> int:
        if when:
            if abs(when) > len(self.ops) or self.ops[abs(when) - 1].stage >= stage:
                raise ValueError(f"op {name}: `when` must name an op of an earlier stage")
            unit = self.ops[abs(when) - 1].unit
        self.ops.append(Op(name, tuple(keys), args, when, stage, unit or self.unit()))
        return len(self.ops)

    def xadd(self, stream: str, maxlen: int, body: dict[str, str], **kw: int) -> int:
        flat: list[Arg] = [maxlen]
        for k, v in body.items():
            flat += (k, v)
        return self.add("xadd", [stream], *flat, **kw)

    def __len__(self) -> int:
        return len(self.ops)


class Fenced(Exception):
    """The fence refused the writes: another controller leads now."""


class Fence:
    """This controller's fence: its lease token (one server) or its term (a cluster)."""

    def __init__(self, r: Connection, keys: Keys, scripts: Scripts, tally: Tally) -> None:
        self.r, self.keys, self.scripts, self.tally = r, keys, scripts, tally
        self.cluster = isinstance(r, RedisCluster)
        self.rc: RedisCluster | None = r if isinstance(r, RedisCluster) else None
        self.token, self.term = "", 0
        self._tags: list[str] = _slot_tags() if self.cluster else []

    def arm(self, token: str, term: int) -> None:
        self.token, self.term = token, term

    def apply(self, batch: Batch) -> list[int]:
        """Run the batch; each op's reply (1 done, 0 not), in order. ``Fenced`` if refused."""
        if not batch.ops:
            return []
        if self.cluster:
            order = sorted(range(len(batch.ops)), key=lambda n: batch.ops[n].stage)
            return self._apply_cluster(batch, order)
        replies = [0] * len(batch.ops)
        for chunk in _chunks(batch.ops):
            keys, args = self._encode(batch.ops, chunk, [self.keys.leader])
            self.tally.commands += 1
            reply = self.scripts.fenced(keys, ["lease", self.token, ACTIVE, *args])
            if reply[0] != 1:
                raise Fenced(f"lease no longer holds {self.token}")
            for n, value in zip(chunk, reply[1:], strict=True):
                replies[n] = value
        return replies

    def apply_held(self, batch: Batch, held: Callable[[], bool]) -> list[int]:
        """``apply``, refused here first (``Fenced``) if ``held`` says the lease may have
        expired by this process's clock: the local half of the fence, for the leader's own
        writes (schedules, wanted workers) as ``Controller._before_apply`` is for a pass's.
        Counts the ops in the tally."""
        if not held():
            raise Fenced("the lease may have expired (by this process's clock)")
        self.tally.ops += len(batch)
        return self.apply(batch)

    def seal(self) -> None:
        """Cluster: raise every slot's term to ours before reading anything as a new leader."""
        if not self.cluster:
            return
        self._run_groups({slot: [] for slot in range(SLOTS)}, [], [])

    def _apply_cluster(self, batch: Batch, order: list[int]) -> list[int]:
        replies: list[int | None] = [None] * len(batch.ops)
        stages: dict[int, list[int]] = defaultdict(list)
        for n in order:
            stages[batch.ops[n].stage].append(n)
        for stage in sorted(stages):
            groups: dict[int, list[int]] = defaultdict(list)
            for n in stages[stage]:
                op = batch.ops[n]
                ref = abs(op.when) - 1
                if op.when and ref not in groups.get(_slot(op), ()):  # of an earlier stage
                    wanted = 1 if op.when > 0 else 0
                    if replies[ref] != wanted:
                        replies[n] = 0
                        continue
                groups[_slot(op)].append(n)
            self._run_groups(groups, batch.ops, replies)
        return [x or 0 for x in replies]

    def _run_groups(
        self, groups: dict[int, list[int]], ops: list[Op], replies: list[int | None]
    ) -> None:
        """One ``fenced.lua`` call per slot, in one plain pipeline per primary (a cluster
        pipeline costs ~0.2 ms a command in the client: too slow for 16,384 seals). A call
        refused as NOSCRIPT or MOVED did not run: it is sent again once, after the script
        is loaded or the slot map read again."""
        todo = list(groups.items())
        for attempt in range(2):
            failed: list[tuple[int, list[int]]] = []
            assert self.rc is not None
            for node, calls in self._by_node(todo):
                pipe = self.rc.get_redis_connection(node).pipeline(transaction=False)
                for slot, members in calls:
                    keys, args = self._encode(
                        ops, members, [self.keys.fence(self._tags[slot])], True
                    )
                    argv = ["term", self.term, ACTIVE, *args]
                    sha = self.scripts.sha("fenced")
                    pipe.execute_command("EVALSHA", sha, len(keys), *keys, *argv)  # type: ignore[no-untyped-call]
                self.tally.commands += len(pipe)
                results = pipe.execute(raise_on_error=False)
                for (slot, members), result in zip(calls, results, strict=True):
                    if attempt == 0 and _not_run(result):
                        failed.append((slot, members))
                        continue
                    if isinstance(result, Exception):
                        raise result
                    if int(result[0]) != 1:
                        raise Fenced(f"a slot's term is above ours ({self.term})")
                    for n, value in zip(members, result[1:], strict=True):
                        replies[n] = int(value)
            if not failed:
                return
            self.rc.nodes_manager.initialize()
            self.rc.script_load(self.scripts.source("fenced"))  # on every primary
            todo = failed

    def _by_node(self, calls: list[tuple[int, list[int]]]) -> list[tuple[Any, list[Any]]]:
        """The calls grouped by the primary that serves their slot."""
        assert self.rc is not None
        out: dict[str, tuple[Any, list[tuple[int, list[int]]]]] = {}
        for slot, members in calls:
            node = self.rc.nodes_manager.get_node_from_slot(slot)
            out.setdefault(node.name, (node, []))[1].append((slot, members))
        return list(out.values())

    def _encode(
        self, ops: list[Op], members: list[int], keys: list[str], resolved: bool = False
    ) -> tuple[list[str], list[Any]]:
        """KEYS and the op part of ARGV for ``members`` (op numbers, in run order)."""
        at: dict[str, int] = {k: i + 1 for i, k in enumerate(keys)}
        local = {n: i + 1 for i, n in enumerate(members)}
        args: list[Any] = [len(members)]
        for n in members:
            op = ops[n]
            for k in op.keys:
                if k not in at:
                    keys.append(k)
                    at[k] = len(keys)
            ref = abs(op.when) - 1
            when = 0
            if op.when and ref in local:
                when = local[ref] if op.when > 0 else -local[ref]
            elif op.when and not resolved:
                raise ValueError("`when` across script calls")
            args += (op.name, when, len(op.keys), len(op.args))
            args += [at[k] for k in op.keys]
            args += op.args
        return keys, args


def _not_run(result: object) -> bool:
    """A reply that says the script did not run at all (so it may be sent again)."""
    if isinstance(result, NoScriptError):
        return True
    return isinstance(result, ResponseError) and str(result).startswith(("MOVED", "ASK"))


def _chunks(ops: list[Op]) -> list[list[int]]:
    """The calls of a batch on one server: whole units, about ``CALL_OPS`` ops a call, each
    call's ops in stage order."""
    units: dict[int, list[int]] = {}
    for n, op in enumerate(ops):
        units.setdefault(op.unit, []).append(n)
    chunks: list[list[int]] = [[]]
    for members in units.values():
        if chunks[-1] and len(chunks[-1]) + len(members) > CALL_OPS:
            chunks.append([])
        chunks[-1].extend(members)
    return [sorted(c, key=lambda n: (ops[n].stage, n)) for c in chunks]


def _slot(op: Op) -> int:
    slots = {key_slot(k.encode()) for k in op.keys}
    if len(slots) != 1:
        raise ValueError(f"op {op.name}: its keys are in more than one slot")
    return slots.pop()


def _slot_tags() -> list[str]:
    """For every cluster slot, a short string that hashes to it."""
    tags: list[str | None] = [None] * SLOTS
    left, n = SLOTS, 0
    while left:
        tag = format(n, "x")
        slot = key_slot(tag.encode())
        if tags[slot] is None:
            tags[slot] = tag
            left -= 1
        n += 1
    return [t or "" for t in tags]
