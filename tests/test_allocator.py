"""The allocator: worked examples, then properties over generated snapshots."""

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queueworks.controller.allocator import Plan, Snapshot, TaskView, WorkerView, allocate, matches
from tests.allocator_oracle import guards
from tests.conftest import EXAMPLES

pytestmark = pytest.mark.unit

PROPS = settings(max_examples=EXAMPLES, deadline=None)


def task(
    id: str,
    priority: int,
    lo: int,
    hi: int | None,
    *,
    seq: float = 0.0,
    nodes: Iterable[str] = (),
    selector: Mapping[str, str] | None = None,
) -> TaskView:
    return TaskView(
        id, priority, lo, hi, seq, selector=dict(selector or {}), nodes=frozenset(nodes)
    )


def queue(
    id: str, priority: int, lo: int, *, seq: float = 0.0, members: Iterable[str] = ()
) -> TaskView:
    return TaskView(id, priority, lo, None, seq, nodes=frozenset(members), queue=True)


def workers(*ids: str, **labels: str) -> tuple[WorkerView, ...]:
    return tuple(WorkerView(w, dict(labels)) for w in ids)


def apply(snapshot: Snapshot, plan: Plan) -> Snapshot:
    """The snapshot the controller sees once the plan is carried out and the workers have
    acted on it: a worker given a task leaves its queues; every live worker without one is
    a member of every queue it would serve (as workers join on their own), up to the
    queue's max_nodes (members first, then by id)."""
    live = {w.id: w for w in snapshot.workers}
    tasks = []
    for t in snapshot.tasks:
        if t.queue:
            serving = [
                w
                for w in sorted(live)
                if plan.assignment[w] is None
                and matches(live[w], t)
                and (live[w].queues is None or t.id in live[w].queues)
            ]
            serving.sort(key=lambda w: w not in t.nodes)
            tasks.append(replace(t, nodes=frozenset(serving[: t.max_nodes])))
            continue
        nodes = plan.nodes_of(t.id)
        tasks.append(replace(t, nodes=nodes, running=len(nodes) >= t.min_nodes))
    return Snapshot(tuple(tasks), snapshot.workers)


def kept(snapshot: Snapshot) -> dict[str, list[str]]:
    """Step 1 as the spec states it: live, matching, deduplicated by rank, capped at max."""
    owner: dict[str, str] = {}
    for t in sorted(tasks_of(snapshot), key=lambda t: (-t.priority, t.seq, t.id)):
        for w in sorted(t.nodes):
            owner.setdefault(w, t.id)
    live = {w.id: w for w in snapshot.workers}
    out = {}
    for t in tasks_of(snapshot):
        mine = sorted(w for w in t.nodes if owner[w] == t.id and w in live and matches(live[w], t))
        out[t.id] = mine[: t.max_nodes]
    return out


def consistent(snapshot: Snapshot) -> bool:
    """No worker is both a queue's member and a task's node (a worker given a task leaves
    its queues: the controller can see both only for a moment)."""
    listed = {w for t in tasks_of(snapshot) for w in t.nodes}
    return not any(t.queue and t.nodes & listed for t in snapshot.tasks)


def tasks_of(snapshot: Snapshot) -> list[TaskView]:
    """The snapshot's tasks that are not queues."""
    return [t for t in snapshot.tasks if not t.queue]


def may_take(s: Snapshot, w: WorkerView, t: TaskView) -> bool:
    """The worker fits the task and no queue guards it at the task's priority or above."""
    guard = guards(s)[0].get(w.id)
    return matches(w, t) and (guard is None or t.priority > guard)


# --- examples ---------------------------------------------------------------------------------


def test_high_priority_preempts_surplus_and_low_grows_back() -> None:
    ws = workers("w0", "w1", "w2", "w3")
    low = task("low", 0, 1, 4, seq=1, nodes=["w0", "w1", "w2", "w3"])
    high = task("high", 5, 3, 3, seq=2)
    s = Snapshot((low, high), ws)
    plan = allocate(s)
    assert plan.nodes_of("high") == {"w1", "w2", "w3"}  # surplus, highest ids first
    assert plan.nodes_of("low") == {"w0"}
    assert plan.moves(s) == {"w1": "high", "w2": "high", "w3": "high"}
    s = apply(s, plan)
    assert allocate(s).moves(s) == {}
    s = Snapshot((s.tasks[0],), ws)  # high completed
    assert allocate(s).nodes_of("low") == {"w0", "w1", "w2", "w3"}


def test_gang_waits_for_min_then_starts() -> None:
    t = task("t", 0, 3, None)
    s = Snapshot((t,), workers("a", "b"))
    assert allocate(s).assignment == {"a": None, "b": None}
    s = Snapshot((t,), workers("a", "b", "c"))
    assert allocate(s).nodes_of("t") == {"a", "b", "c"}


def test_gang_task_releases_what_it_kept() -> None:
    t = task("t", 0, 3, None, nodes=["a", "b", "gone"])  # "gone" died
    s = Snapshot((t,), workers("a", "b"))
    assert allocate(s).moves(s) == {"a": None, "b": None}


def test_selector() -> None:
    ws = workers("cpu0", "cpu1", gpu="0") + workers("gpu0", "gpu1", gpu="1")
    gpu = task("gpu", 0, 1, None, selector={"gpu": "1"}, nodes=["cpu0", "gpu0"])
    plan = allocate(Snapshot((gpu,), ws))
    assert plan.nodes_of("gpu") == {"gpu0", "gpu1"}
    assert plan.assignment["cpu0"] is None


def test_fairness_queued_before_growth() -> None:
    running = task("running", 1, 1, None, seq=1, nodes=["w0"])
    queued = task("queued", 1, 2, None, seq=2)
    plan = allocate(Snapshot((running, queued), workers("w0", "w1", "w2")))
    assert plan.nodes_of("running") == {"w0"}
    assert plan.nodes_of("queued") == {"w1", "w2"}


def test_equal_priority_is_never_preempted() -> None:
    old = task("old", 1, 1, None, seq=1, nodes=["w0", "w1"])
    new = task("new", 1, 1, None, seq=2)
    s = Snapshot((old, new), workers("w0", "w1"))
    assert allocate(s).moves(s) == {}


def test_whole_preemption_and_no_useless_preemption() -> None:
    low = task("low", 0, 2, 2, nodes=["w0", "w1"])
    high = task("high", 1, 1, None)
    s = Snapshot((low, high), workers("w0", "w1"))
    plan = allocate(s)
    assert plan.nodes_of("low") == frozenset()  # below its min: suspended whole
    assert plan.nodes_of("high") == {"w0", "w1"}  # took w1, then grew into the released w0
    big = task("big", 1, 3, None)
    s = Snapshot((low, big), workers("w0", "w1"))
    assert allocate(s).moves(s) == {}  # 2 workers can never give big its 3


def test_preempted_task_can_restart_on_free_workers() -> None:
    low = task("low", 0, 1, 2, nodes=["w0", "w1"])
    high = task("high", 1, 2, 2, selector={"zone": "a"})
    ws = workers("w0", "w1", zone="a") + workers("w2", zone="b")
    s = Snapshot((low, high), ws)
    plan = allocate(s)
    assert plan.nodes_of("high") == {"w0", "w1"}  # surplus w1, then low whole for w0
    assert plan.nodes_of("low") == {"w2"}  # restarted on the worker high cannot use
    s = apply(s, plan)
    assert allocate(s).moves(s) == {}


def test_degraded_task_keeps_running_on_a_replacement() -> None:
    older = task("older", 1, 2, None, seq=1)
    degraded = task("degraded", 1, 2, None, seq=2, nodes=["w0", "dead"])
    plan = allocate(Snapshot((older, degraded), workers("w0", "w1")))
    assert plan.nodes_of("degraded") == {"w0", "w1"}


def test_degraded_task_that_cannot_recover_frees_nodes_for_older() -> None:
    older = task("older", 1, 2, None, seq=1)
    degraded = task("degraded", 1, 3, None, seq=2, nodes=["w0", "w1", "dead"])
    s = Snapshot((older, degraded), workers("w0", "w1"))
    plan = allocate(s)
    assert plan.nodes_of("older") == {"w0", "w1"}  # not only on the next pass
    s = apply(s, plan)
    assert allocate(s).moves(s) == {}


def test_corrupt_and_dead_nodes() -> None:
    high = task("high", 1, 1, 1, nodes=["w0", "w1", "dead"])
    low = task("low", 0, 1, None, nodes=["w1"])
    s = Snapshot((low, high), workers("w0", "w1"))
    plan = allocate(s)
    assert plan.assignment == {"w0": "high", "w1": "low"}  # w1 capped away from high
    assert plan.moves(s) == {"w1": "low"}


def test_queues_are_given_no_workers_and_cap_none() -> None:
    """A queue's members join it on their own: the plan gives it nothing, moves none of
    them, and its max_nodes caps nothing (neither does what it says it wants: not read)."""
    q = TaskView("q", 0, 1, 1, 0.0, nodes=frozenset({"w0", "w1", "w2"}), queue=True)
    s = Snapshot((q,), workers("w0", "w1", "w2"))
    plan = allocate(s)
    assert plan.assignment == {"w0": None, "w1": None, "w2": None}
    assert plan.nodes_of("q") == frozenset() and plan.moves(s) == {}
    idle = queue("idle", 0, 1)  # no member: nothing to give it either
    assert allocate(Snapshot((idle,), workers("w0"))).assignment == {"w0": None}


def test_two_queues_sharing_workers_guard_the_same_worker() -> None:
    ws = workers("w0", "w1", "w2")
    a = queue("a", 2, 1, seq=1, members=["w1", "w2"])
    b = queue("b", 1, 1, seq=2, members=["w0", "w1", "w2"])  # w0 by id, but a guards w1
    assert guards(Snapshot((a, b), ws))[0] == {"w1": 2}
    t = task("t", 1, 2, None)
    assert allocate(Snapshot((a, b, t), ws)).nodes_of("t") == {"w0", "w2"}


def test_a_guarded_worker_goes_only_to_a_higher_priority_task() -> None:
    ws = workers("w0", "w1", "w2")
    q = queue("q", 1, 1, members=["w0", "w1", "w2"])  # guards w0
    for p in (0, 1):  # lower or equal priority: the others, never w0
        plan = allocate(Snapshot((q, task("t", p, 1, None)), ws))
        assert plan.nodes_of("t") == {"w1", "w2"}
        gang = task("gang", p, 3, None)
        assert allocate(Snapshot((q, gang), ws)).nodes_of("gang") == frozenset()
    assert allocate(Snapshot((q, task("t", 2, 3, None)), ws)).nodes_of("t") == {"w0", "w1", "w2"}


def test_a_guarded_worker_is_kept_and_preempted_only_from_above() -> None:
    ws = workers("w0", "w1")
    q = queue("q", 1, 1, members=["w0", "w1"])  # guards w0
    low = task("low", 0, 1, None, nodes=["w0", "w1"])  # took them before the queue was there
    s = Snapshot((q, low), ws)
    # low keeps w0 (keeping is unaffected); q, its guarded member busy, takes low's surplus
    assert allocate(s).moves(s) == {"w1": None}
    mid = task("mid", 1, 2, None)  # may not take w0, so it cannot reach 2: preempts nothing
    assert allocate(Snapshot((q, low, mid), ws)).moves(s) == {"w1": None}
    high = task("high", 2, 2, None)
    assert allocate(Snapshot((q, low, high), ws)).nodes_of("high") == {"w0", "w1"}


def test_a_queue_short_of_members_claims_workers_from_lower_tasks_only() -> None:
    ws = workers("w0", "w1", "w2", "w3")
    low = task("low", 0, 2, None, nodes=["w0", "w1", "w2", "w3"])
    urgent = queue("urgent", 5, 1)  # no member: every worker runs `low`
    plan = allocate(Snapshot((low, urgent), ws))
    assert plan.moves(Snapshot((low, urgent), ws)) == {"w3": None}  # its surplus, highest id
    two = queue("two", 5, 3)
    assert plan_of(Snapshot((low, two), ws)) == {"w0": None, "w1": None, "w2": None, "w3": None}
    # a task of its priority or above keeps what it holds
    same = task("same", 5, 1, None, nodes=["w0", "w1", "w2", "w3"])
    assert allocate(Snapshot((same, urgent), ws)).moves(Snapshot((same, urgent), ws)) == {}


def test_a_new_queues_free_worker_is_kept_from_tasks_of_its_priority() -> None:
    """Before a free worker joins a new queue (it does on its own), the queue guards it."""
    ws = workers("w0", "w1")
    q = queue("fresh", 0, 1)
    t = task("t", 0, 1, None)
    assert allocate(Snapshot((q, t), ws)).nodes_of("t") == {"w1"}
    high = task("high", 1, 2, None)
    assert allocate(Snapshot((q, high), ws)).nodes_of("high") == {"w0", "w1"}


def plan_of(s: Snapshot) -> dict[str, str | None]:
    return dict(allocate(s).assignment)


def test_a_queue_guards_min_nodes_of_its_live_fitting_members() -> None:
    ws = workers("w0", "w1", zone="a") + workers("w2", "w3", zone="b")
    q = TaskView(
        "q", 1, 2, None, 0.0, {"zone": "b"}, frozenset({"dead", "w1", "w2", "w3"}), queue=True
    )
    assert guards(Snapshot((q,), ws))[0] == {"w2": 1, "w3": 1}
    t = task("t", 0, 1, None)
    assert allocate(Snapshot((q, t), ws)).nodes_of("t") == {"w0", "w1"}


def test_a_boards_guards_follow_its_queues_and_workers() -> None:
    from queueworks.controller.board import Board

    board = Board.of(Snapshot((queue("q", 1, 1, members=["w0", "w1"]),), workers("w0", "w1")))
    assert board.guards()[0] == {"w0": 1}
    board.put_task(queue("q", 1, 1, members=["w1"]))  # w0 left it
    assert board.guards()[0] == {"w1": 1}
    board.put_worker(WorkerView("w1", {"zone": "b"}))  # fits it still (it has no selector)
    board.put_task(queue("r", 2, 1, members=["w0", "w1"]))
    assert board.guards()[0] == {"w0": 2, "w1": 1}
    board.drop_worker("w0")
    assert board.guards()[0] == {"w1": 2}
    board.drop_task("r")
    assert board.guards()[0] == {"w1": 1}


# --- properties -------------------------------------------------------------------------------

labels = st.dictionaries(st.sampled_from(["gpu", "zone"]), st.sampled_from(["0", "1"]))
selectors = st.dictionaries(
    st.sampled_from(["gpu", "zone"]), st.sampled_from(["0", "1"]), max_size=1
)


@st.composite
def _snapshots(draw: st.DrawFn, crowded: bool) -> Snapshot:
    """0..16 workers, 0..8 tasks and 0..3 queues (members among a few workers, dead ones
    too);
    `crowded` draws many workers and tasks, so preemption is common."""
    names = st.text("abcdefgh", min_size=1, max_size=2)
    ids = draw(st.lists(names, unique=True, min_size=6 if crowded else 0, max_size=16))
    live = tuple(WorkerView(w, draw(labels)) for w in ids)
    listed = [*ids, "dead0", "dead1"]
    n = draw(st.integers(3 if crowded else 0, 8))
    owner = [draw(st.integers(-1, n - 1)) if n else -1 for _ in listed]
    dupes = draw(st.lists(st.tuples(st.sampled_from(listed), st.integers(0, 7)), max_size=2))
    tasks = []
    for k in range(n):
        lo = draw(st.integers(1, 4))
        nodes = {w for w, o in zip(listed, owner, strict=True) if o == k}
        nodes |= {w for w, o in dupes if o == k}
        tasks.append(
            TaskView(
                id=f"t{k}",
                priority=draw(st.integers(0, 3)),
                min_nodes=lo,
                max_nodes=draw(st.none() | st.integers(lo, lo + 4)),
                seq=float(draw(st.integers(0, 5))),
                selector=draw(selectors),
                nodes=frozenset(nodes),
                running=draw(st.booleans()),
            )
        )
    shared = listed[-6:]  # queues' members: from a few workers, so queues share them
    for k in range(draw(st.integers(0, 3))):
        tasks.append(
            TaskView(
                id=f"q{k}",
                priority=draw(st.integers(0, 3)),
                min_nodes=draw(st.integers(1, 3)),
                max_nodes=draw(st.none() | st.integers(1, 3)),
                seq=float(draw(st.integers(0, 5))),
                selector=draw(selectors),
                nodes=frozenset(draw(st.sets(st.sampled_from(shared), max_size=5))),
                queue=True,
            )
        )
    return Snapshot(tuple(tasks), live)


def snapshots() -> st.SearchStrategy[Snapshot]:
    return _snapshots(crowded=False) | _snapshots(crowded=True)


@PROPS
@given(snapshots())
def test_plan_is_valid(s: Snapshot) -> None:
    plan = allocate(s)
    live = {w.id: w for w in s.workers}
    assert set(plan.assignment) == set(live)
    by_id = {t.id: t for t in s.tasks}
    assert {t for t in plan.assignment.values() if t is not None} <= set(by_id)
    assert not any(plan.nodes_of(t.id) for t in s.tasks if t.queue)
    seen: set[str] = set()
    for t in tasks_of(s):
        nodes = plan.nodes_of(t.id)
        assert not nodes & seen
        seen |= nodes
        assert all(matches(live[w], t) for w in nodes)
        assert not nodes or len(nodes) >= t.min_nodes
        assert t.max_nodes is None or len(nodes) <= t.max_nodes
        # maximal: no idle worker no queue guards fits a running task below its max (a
        # guarded one is the queue's: a task takes it only to reach its min)
        if consistent(s) and nodes and (t.max_nodes is None or len(nodes) < t.max_nodes):
            idle = [w for w, a in plan.assignment.items() if a is None]
            # (guarded before the plan, or after it: a queue may have claimed it)
            guarded = {*guards(s)[0], *guards(apply(s, plan))[0]}
            listed = {w for u in tasks_of(s) for w in u.nodes}
            grows = [w for w in idle if w not in guarded and w not in listed]
            assert not any(may_take(s, live[w], t) for w in grows)


@PROPS
@given(snapshots())
def test_priority_respected(s: Snapshot) -> None:
    """A task left without nodes could not have reached min from idle or lower-priority nodes
    that no queue guards at its priority or above (before the plan, or after it: a queue
    may have claimed a worker)."""
    plan = allocate(s)
    if not consistent(s):
        return  # (the plan settles in a few rounds: test_no_flapping)
    prio = {t.id: t.priority for t in s.tasks}
    after = guards(apply(s, plan))[0]
    for t in tasks_of(s):
        if not plan.nodes_of(t.id):
            usable = [
                w
                for w in s.workers
                if may_take(s, w, t)
                and after.get(w.id, t.priority - 1) < t.priority
                and ((a := plan.assignment[w.id]) is None or prio[a] < t.priority)
            ]
            assert len(usable) < t.min_nodes


@PROPS
@given(snapshots())
def test_preemption_only_to_reach_min(s: Snapshot) -> None:
    """A task at min in the snapshot loses a node only to a higher-priority task that was below
    min and now reaches it."""
    plan = allocate(s)
    before = kept(s)
    starters = [
        t
        for t in tasks_of(s)
        if len(before[t.id]) < t.min_nodes and len(plan.nodes_of(t.id)) >= t.min_nodes
    ]
    queues = [q for q in s.tasks if q.queue]  # (a queue short of members claims too)
    for t in tasks_of(s):
        lost = set(before[t.id]) - plan.nodes_of(t.id)
        if len(before[t.id]) >= t.min_nodes and lost:
            assert any(p.priority > t.priority for p in [*starters, *queues])


@PROPS
@given(snapshots(), st.data())
def test_deterministic(s: Snapshot, data: st.DataObject) -> None:
    plan = allocate(s)
    assert allocate(s) == plan
    tasks = data.draw(st.permutations(s.tasks))
    tasks = [replace(t, selector=dict(reversed(t.selector.items()))) for t in tasks]
    ws = [WorkerView(w.id, dict(reversed(w.labels.items()))) for w in s.workers]
    shuffled = Snapshot(tuple(tasks), tuple(data.draw(st.permutations(ws))))
    again = allocate(shuffled)
    assert list(again.assignment.items()) == list(plan.assignment.items())


@PROPS
@given(snapshots())
def test_no_flapping(s: Snapshot) -> None:
    """Carried out (tasks take their nodes, workers leave and join queues as they do),
    plans settle: without queues the next plan moves nothing; with them, within three
    rounds (a worker that joins a queue can change which workers the queues guard)."""
    plan = allocate(s)
    applied = apply(s, plan)
    rounds = 3 if any(t.queue for t in s.tasks) else 1
    for _ in range(rounds):
        again = allocate(applied)
        if not again.moves(applied):
            break
        applied = apply(applied, again)
    else:
        raise AssertionError(f"still moving after {rounds} rounds: {again.moves(applied)}")
    if rounds == 1:
        assert again == plan


@PROPS
@given(snapshots())
def test_moves_are_the_difference(s: Snapshot) -> None:
    plan = allocate(s)
    moves = plan.moves(s)
    after = apply(s, plan)
    ranked = sorted(tasks_of(s), key=lambda t: (-t.priority, t.seq, t.id))
    for w in plan.assignment:
        was = next((t.id for t in ranked if w in t.nodes), None)
        assert (w in moves) == (was != plan.assignment[w])
    assert plan.moves(after) == {}


# --- the board: the same plan as the straightforward allocator, built at once or view by view


handlers = st.sampled_from(["", "app.jobs:a", "other.jobs:b"])
allows = st.none() | st.sampled_from([("app",), ("other",), ("app", "other"), ()])


@st.composite
def _rich(draw: st.DrawFn) -> Snapshot:
    """Snapshots with every input the allocator reads: labels, allow prefixes, handlers,
    refusals, queues and their guards, and many alike waiting tasks (the classes the board
    skips)."""
    base = draw(_snapshots(crowded=draw(st.booleans())))
    ws = tuple(replace(w, allow=draw(allows)) for w in base.workers)
    ids = [w.id for w in ws]
    tasks = []
    for t in base.tasks:
        if t.queue:  # its jobs name handlers; a member never refuses it
            named = draw(st.lists(handlers.filter(bool), unique=True, max_size=2))
            tasks.append(replace(t, handlers=tuple(sorted(named))))
            continue
        refused = draw(st.sets(st.sampled_from(ids))) if ids and draw(st.booleans()) else set()
        tasks.append(replace(t, handler=draw(handlers), refused=frozenset(refused)))
    for k in range(draw(st.integers(0, 12))):  # a backlog of alike tasks, some never runnable
        tasks.append(
            TaskView(
                f"b{k}",
                draw(st.integers(0, 3)),
                draw(st.integers(1, 3)),
                None,
                float(draw(st.integers(0, 8))),
                selector=draw(selectors),
                handler=draw(handlers),
            )
        )
    return Snapshot(tuple(tasks), ws)


@PROPS
@given(_rich())
def test_same_plan_as_the_oracle(s: Snapshot) -> None:
    from queueworks.controller.board import Board
    from tests import allocator_oracle

    assert allocate(s) == allocator_oracle.allocate(s)
    assert Board.of(s).guards(allocator_oracle._Pass(s, held_only=True).kept()) == guards(s)


def _levels(board: Any) -> list[Any]:
    return [
        (p, [t.id for t in held], sorted([t.id for t in c] for c in classes))
        for p, held, classes in board.levels()
    ]


@PROPS
@given(_rich(), _rich(), st.randoms(use_true_random=False))
def test_a_board_updated_view_by_view_plans_as_one_built_at_once(
    a: Snapshot, b: Snapshot, rnd: Any
) -> None:
    from queueworks.controller.board import Board

    board = Board.of(a)
    allocate(board)  # fills what the board remembers (guards, kept nodes): updates keep it true
    steps: list[tuple[str, Any]] = [("drop_task", t.id) for t in a.tasks]
    steps += [("drop_worker", w.id) for w in a.workers]
    steps += [("put_task", t) for t in b.tasks] + [("put_worker", w) for w in b.workers]
    rnd.shuffle(steps)
    for name, arg in steps:  # drops of what b puts again are undone by the put that follows
        if name.startswith("drop") and (
            arg in {t.id for t in b.tasks} or arg in {w.id for w in b.workers}
        ):
            continue
        getattr(board, name)(arg)
    fresh = Board.of(b)
    assert [t.id for t in board.holders()] == [t.id for t in fresh.holders()]
    assert _levels(board) == _levels(fresh)  # classes in any order: the merge sorts them
    assert allocate(board) == allocate(b)
