"""A queue's settings, declared once.

``QueueSettings`` is the one place a queue setting is spelled: each field carries its
default and a ``Setting`` (its bounds, its help text, where the queue's ``TaskSpec`` stores
it). Everything else is derived from it: the defaults (``DEFAULTS``), the check of what a
caller gives ``Client.queue`` (``check_queue_settings``), the ``TaskSpec`` a queue is
stored as and back (``QueueSettings.spec`` / ``.of``), the ``queueworks enqueue`` options
(``queueworks.cli.options.queue_setting_options``) and what the dashboard reads and
takes from a form; and the ones a live queue can change (``Setting.live``: ``LIVE``,
``check_live_settings``, the options of ``queueworks queue QUEUE set`` and the dashboard's
settings form). ``QueueOptions``, the keyword arguments of ``Client.queue`` and
``AsyncClient.queue``, must name the same fields, and ``LiveOptions``, those of
``Queue.configure``, the live ones (unit tests hold them together).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, TypedDict

from queueworks.protocol.job_options import MAX_BACKOFF, MAX_RETRY_DELAY
from queueworks.protocol.models import TaskSpec
from queueworks.protocol.retry_policy import (
    DEFAULT_RETRY_BACKOFF,
    DEFAULT_RETRY_DELAY,
    DEFAULT_RETRY_MAX_DELAY,
)
from queueworks.protocol.validate import (
    MAX_ATTEMPTS,
    MAX_NODES,
    MAX_PRIORITY,
    MAX_TIMEOUT,
    MAX_TTL,
    check_int,
    check_labels,
    check_number,
    check_resize,
)
from queueworks.transport.replication import Replicas, check_wait

SETTING = "queue_setting"  # the key of a field's ``Setting`` in its metadata
_MISSING: Any = object()


@dataclass(frozen=True)
class Setting:
    """What one queue setting is besides its name and default: a ``kind`` (``int``,
    ``float`` or ``dict``: labels, strings to strings) within ``low .. high`` (``above_low``:
    ``low`` itself excluded), None allowed if ``optional``; where the queue's spec keeps it
    (``stored``: a ``TaskSpec`` field, or a dotted path into it), only when it is not the
    default if ``sparse`` (a setting added later: the specs of queues that do not use it
    stay as they were); whether ``Queue.configure`` may change it on a live queue
    (``live``); the help text."""

    kind: type
    help: str
    low: float = 0
    high: float = 0
    above_low: bool = False
    optional: bool = False
    stored: str = ""
    sparse: bool = False
    live: bool = False
    name: str = ""
    default: Any = None

    @property
    def flag(self) -> str:
        """The command line's option: ``--min-nodes`` for ``min_nodes``."""
        return "--" + self.name.replace("_", "-")

    @property
    def path(self) -> tuple[str, ...]:
        """Where the spec keeps it: ``("subtask_timeout",)``, ``("options", "queue", ...)``."""
        return tuple((self.stored or self.name).split("."))

    @property
    def shown_default(self) -> str:
        """The default, as a person reads it: ``60``, ``no limit``, ``none``."""
        if self.default is None:
            return "no limit"
        if isinstance(self.default, dict):
            return ", ".join(f"{k}={v}" for k, v in self.default.items()) or "none"
        if isinstance(self.default, float):
            return f"{self.default:g}"
        return str(self.default)

    def check(self, value: Any) -> Any:
        """``value`` as this setting, or a ``ValueError`` naming the setting."""
        if value is None and self.optional:
            return None
        if self.kind is int:
            return check_int(self.name, value, int(self.low), int(self.high))
        if self.kind is float:
            return check_number(self.name, value, self.low, self.high, above_low=self.above_low)
        return check_labels(self.name, value)

    def stored_in(self, spec: TaskSpec | Mapping[str, Any], missing: Any = _MISSING) -> Any:
        """The value kept in a spec (a ``TaskSpec``, or one read as a dict), as it is
        there; a missing one: ``missing`` if given, else ``default``."""
        if missing is _MISSING:
            missing = self.default
        value: Any = spec
        for part in self.path:
            if isinstance(value, Mapping):
                value = value.get(part, _MISSING)
            elif isinstance(value, TaskSpec):
                value = getattr(value, part, _MISSING)
            else:
                value = _MISSING
            if value is _MISSING:
                return missing
        return value


def about(kind: type, help: str, **more: Any) -> dict[str, Setting]:
    """A ``QueueSettings`` field's metadata: its ``Setting``."""
    return {SETTING: Setting(kind, help, **more)}


MAX_WAIT_REPLICAS = 100  # replicas an enqueue may wait for
MAX_RATE = 1_000_000.0  # rate_limit: jobs started per second
MAX_GROUP_LIMIT = 1_000_000  # group_limit: jobs of a group running at once


@dataclass(frozen=True)
class QueueSettings:
    """A queue's settings; the defaults are a new queue's."""

    min_nodes: int = field(
        default=1,
        metadata=about(int, "fewest workers the queue runs on", low=1, high=MAX_NODES),
    )
    max_nodes: int | None = field(
        default=None,
        metadata=about(int, "most workers the queue runs on", low=1, high=MAX_NODES, optional=True),
    )
    priority: int = field(
        default=0,
        metadata=about(
            int,
            "higher runs first and may take nodes from lower",
            low=-MAX_PRIORITY,
            high=MAX_PRIORITY,
        ),
    )
    max_attempts: int = field(
        default=3,
        metadata=about(
            int, "runs of a failing job before it is dead", low=1, high=MAX_ATTEMPTS, live=True
        ),
    )
    job_timeout: float = field(
        default=60.0,
        metadata=about(
            float,
            "seconds a job may run before it is interrupted (a failed attempt)",
            high=MAX_TIMEOUT,
            above_low=True,
            stored="subtask_timeout",
            live=True,
        ),
    )
    result_ttl: float = field(
        default=24 * 3600.0,
        metadata=about(
            float,
            "seconds a finished job's result (or error) is kept",
            high=MAX_TTL,
            above_low=True,
            live=True,
        ),
    )
    node_selector: dict[str, str] = field(
        default_factory=dict,
        metadata=about(dict, "k=v label a worker must have to run the queue's jobs (repeat)"),
    )
    wait_replicas: int = field(
        default=0,
        metadata=about(
            int,
            "replicas that must hold a job before enqueue returns (WAIT; 0: do not wait)",
            high=MAX_WAIT_REPLICAS,
            stored="options.queue.wait_replicas",
            sparse=True,
            live=True,
        ),
    )
    wait_timeout: float = field(
        default=1.0,
        metadata=about(
            float,
            "seconds an enqueue waits for wait_replicas before it raises NotReplicated",
            high=MAX_TIMEOUT,
            above_low=True,
            stored="options.queue.wait_timeout",
            sparse=True,
            live=True,
        ),
    )

    retry_delay: float = field(
        default=DEFAULT_RETRY_DELAY,
        metadata=about(
            float,
            "seconds before a failed job's 2nd attempt (0: at once), grown by retry_backoff",
            high=MAX_RETRY_DELAY,
            sparse=True,
            live=True,
        ),
    )
    retry_backoff: float = field(
        default=DEFAULT_RETRY_BACKOFF,
        metadata=about(
            float,
            "each retry waits this many times the one before",
            low=1.0,
            high=MAX_BACKOFF,
            sparse=True,
            live=True,
        ),
    )
    retry_max_delay: float = field(
        default=DEFAULT_RETRY_MAX_DELAY,
        metadata=about(
            float,
            "seconds a retry waits at most (before jitter)",
            high=MAX_RETRY_DELAY,
            sparse=True,
            live=True,
        ),
    )

    rate_limit: float | None = field(
        default=None,
        metadata=about(
            float,
            "jobs started per second at most, across every member (bursts: a tenth of a "
            "second's worth, at least 1)",
            high=MAX_RATE,
            above_low=True,
            optional=True,
            stored="options.queue.rate_limit",
            sparse=True,
            live=True,
        ),
    )
    group_limit: int | None = field(
        default=None,
        metadata=about(
            int,
            "jobs of one group (enqueue group=...) running at once at most, across every member",
            low=1,
            high=MAX_GROUP_LIMIT,
            optional=True,
            stored="options.queue.group_limit",
            sparse=True,
            live=True,
        ),
    )

    def spec(self, name: str) -> TaskSpec:
        """The queue's ``TaskSpec`` (mode ``queue``), each setting where ``Setting.stored``
        says."""
        spec: dict[str, Any] = {"name": name, "mode": "queue"}
        for s in SETTINGS.values():
            if s.sparse and getattr(self, s.name) == s.default:
                continue
            *outer, last = s.path
            place = spec
            for part in outer:
                place = place.setdefault(part, {})
            place[last] = getattr(self, s.name)
        return TaskSpec(**spec)

    @classmethod
    def of(cls, spec: TaskSpec) -> QueueSettings:
        """The settings of a stored queue's spec. One kept inside the spec's ``options``
        that is missing or wrong is the default; what else the options hold (an older
        version's ``idle_after``) is not read."""
        return cls(**{s.name: stored_setting(s, spec) for s in SETTINGS.values()})

    def given(self) -> dict[str, Any]:
        """All of them, as ``Client.queue`` is given settings."""
        return asdict(self)


class QueueOptions(TypedDict, total=False):
    """The keyword arguments ``Client.queue`` takes for settings: ``QueueSettings``'s
    fields, with their types (any left out: the queue's own, or the default)."""

    min_nodes: int
    max_nodes: int | None
    priority: int
    max_attempts: int
    job_timeout: float
    result_ttl: float
    node_selector: dict[str, str]
    wait_replicas: int
    wait_timeout: float
    retry_delay: float
    retry_backoff: float
    retry_max_delay: float
    rate_limit: float | None
    group_limit: int | None


class LiveOptions(TypedDict, total=False):
    """The keyword arguments ``Queue.configure`` takes: the settings marked ``live``."""

    max_attempts: int
    job_timeout: float
    result_ttl: float
    wait_replicas: int
    wait_timeout: float
    retry_delay: float
    retry_backoff: float
    retry_max_delay: float
    rate_limit: float | None
    group_limit: int | None


DEFAULTS = QueueSettings()
SETTINGS: dict[str, Setting] = {  # by name, in the order they are declared
    f.name: replace(f.metadata[SETTING], name=f.name, default=getattr(DEFAULTS, f.name))
    for f in fields(QueueSettings)
}


def stored_setting(setting: Setting, spec: TaskSpec | Mapping[str, Any]) -> Any:
    """A setting of a stored queue's spec (a dict), or its default if it is kept inside
    ``options`` and is missing or wrong there (``TaskSpec`` checked the others as it was
    read)."""
    value = setting.stored_in(spec)
    if len(setting.path) == 1:
        return dict(value) if isinstance(value, dict) else value
    try:
        return setting.check(value)
    except ValueError:
        return setting.default


def check_queue_settings(given: Mapping[str, Any]) -> dict[str, Any]:
    """The settings a caller gave ``Client.queue`` (any of them), checked one by one in
    the order they are declared, the error naming the setting as the caller wrote it;
    a ``TypeError`` for a name that is no setting."""
    for name in given:
        if name not in SETTINGS:
            raise TypeError(f"queue() got an unexpected keyword argument {name!r}")
    out = {name: s.check(given[name]) for name, s in SETTINGS.items() if name in given}
    if "min_nodes" in out and out.get("max_nodes") is not None:
        check_resize(out["min_nodes"], out["max_nodes"])
    return out


def queue_wait(settings: QueueSettings, replicas: int | None, timeout: float | None) -> Replicas:
    """What one enqueue waits for: the replicas and timeout given, else the queue's."""
    return check_wait(
        settings.wait_replicas if replicas is None else replicas,
        settings.wait_timeout if timeout is None else timeout,
        "enqueue",
    )


LIVE = tuple(name for name, s in SETTINGS.items() if s.live)  # what ``configure`` changes


def check_live_settings(given: Mapping[str, Any]) -> dict[str, Any]:
    """The settings a caller gave ``Queue.configure``, checked as ``Client.queue`` checks
    them (``ValueError`` naming the setting); a ``TypeError`` for a name that is no setting
    a live queue can change (its node set's: ``q.task.resize``, ``q.task.set_priority``)."""
    for name in given:
        if name not in LIVE:
            why = "its node set's (q.task.resize, q.task.set_priority)"
            raise TypeError(
                f"configure() got an unexpected keyword argument {name!r}"
                + (f": it is {why}" if name in SETTINGS else "")
            )
    return {name: SETTINGS[name].check(given[name]) for name in LIVE if name in given}


def configured_spec(stored: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """A stored queue's spec (read as a dict) with ``changes`` (checked) written where each
    setting is kept; the rest as it was."""
    spec: dict[str, Any] = json.loads(json.dumps(stored))  # a deep copy
    for name, value in changes.items():
        *outer, last = SETTINGS[name].path
        place = spec
        for part in outer:
            inner = place.get(part)
            if not isinstance(inner, dict):
                inner = place[part] = {}
            place = inner
        place[last] = value
    return spec
