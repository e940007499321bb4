"""The codecs of a queue's job, one per format it has in Redis: its stream ENTRY, its
RECORD (``qw:task:{Q}:job:<J>``) and its DEAD LETTER (``qw:task:{Q}:dead``, a format the
subtasks' dead letters share). Each format's field names are named here once; Python reads
and writes them through the functions below, and the Lua scripts get them from here
(``LUA_NAMES``, substituted as ``${NAME}`` by ``queueworks.scripts.bound``), never retyped.

The record and the dead letter are written by Lua alone (``settle_jobs.lua``, ``settle.lua``,
``sweep_lost.lua``, ``enqueue_jobs.lua``, ``promote_due.lua``, ``set_aside.lua``,
``cancel_job.lua``, ``requeue_job.lua``); Python decodes them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from queueworks.protocol.job_options import NO_OPTIONS, JobOptions
from queueworks.protocol.keys import PARKED
from queueworks.protocol.models import JobState, JobStatus
from queueworks.protocol.priorities import priority_of_id

# -- the entry -------------------------------------------------------------------------------

ENTRY_JOB = "j"
ENTRY_HANDLER = "h"
ENTRY_PAYLOAD = "p"
ENTRY_ENQUEUED = "t"
ENTRY_STARTS = "a"
ENTRY_OPTIONS = "o"

_J, _H, _P, _T, _A, _O = (n.encode() for n in "jhptao")
# ids an entry may name (a prioritised job's ends with its band)
JOB_ID = re.compile(rb"^(?:[0-9a-f]{1,64}(?:\.p-?\d)?|\d{1,19}-\d{1,19})$")


class JobEntry(NamedTuple):
    """A job's stream entry, decoded (``decode_entry``).

    =====  ==========================================================================
    ``h``  handler (``module:function``)
    ``p``  payload JSON
    ``t``  enqueued at (s since the epoch; a delayed job's: when it became due)
    ``j``  the job's id, when it is not the entry's own (a delayed, requeued or set
           aside job: it has had a record since it was enqueued)
    ``a``  an aside entry's only: the starts the job had before it was set aside
    ``o``  the job's own options, JSON (``queueworks.protocol.job_options``); absent: none
    =====  ==========================================================================

    ``job_options`` is ``o`` parsed (``JobOptions.parse``), once, by the function that
    decoded the entry: what a worker reads of a job's options (its group, its retry
    schedule, its unique key), from its read to its settle. A job without ``o`` gets the
    shared ``NO_OPTIONS``: nothing parsed, nothing made.
    """

    entry_id: str
    job_id: str  # the entry's id, or the id it names ('j')
    handler: str
    payload: str  # JSON, as enqueued
    enqueued: str  # 't', as written
    named: bool  # the entry names its job ('j')
    options: str = ""  # its 'o': the job's own options, JSON ('' = none), as written
    job_options: JobOptions = NO_OPTIONS  # its 'o' parsed


class BadEntry(ValueError):
    """An entry that holds no job of the queue; the text is the reason it is rejected."""


def entry_fields(handler: str, payload: str, enqueued: str, options: str = "") -> tuple[str, ...]:
    """A job to run now's entry, as ``XADD`` field/value arguments (``enqueue_jobs.lua``
    writes the same); ``options``: its ``o`` ('' = none, and no field)."""
    if options:
        return (
            ENTRY_HANDLER, handler, ENTRY_PAYLOAD, payload, ENTRY_ENQUEUED, enqueued,
            ENTRY_OPTIONS, options,
        )  # fmt: skip
    return (ENTRY_HANDLER, handler, ENTRY_PAYLOAD, payload, ENTRY_ENQUEUED, enqueued)


def decode_entry(entry_id: str, fields: Mapping[bytes, bytes]) -> JobEntry:
    """The job an entry holds; ``BadEntry`` for an entry without a handler or a payload,
    naming a job id that cannot be one, or whose names are not UTF-8."""
    named, path, raw_payload = fields.get(_J), fields.get(_H), fields.get(_P)
    if (named is not None and not JOB_ID.match(named)) or not path or raw_payload is None:
        raise BadEntry(f"malformed entry: fields {sorted(k.decode() for k in fields)}")
    try:
        handler, enqueued = path.decode(), fields.get(_T, b"").decode()
        job_id = named.decode() if named else entry_id
    except UnicodeDecodeError as exc:
        raise BadEntry(f"malformed entry: {exc}") from None
    payload = raw_payload.decode(errors="replace")
    raw = fields.get(_O)
    if raw is None:
        return JobEntry(entry_id, job_id, handler, payload, enqueued, bool(named))
    options = raw.decode(errors="replace")
    parsed = JobOptions.parse(options)
    return JobEntry(entry_id, job_id, handler, payload, enqueued, bool(named), options, parsed)


def entry_job(entry_id: str, fields: Mapping[bytes, bytes]) -> JobEntry | None:
    """``decode_entry`` that never raises (bytes that are no UTF-8 replaced): None for an
    entry with no handler or payload (it holds no job)."""
    path, named = fields.get(_H), fields.get(_J)
    if not path or _P not in fields:
        return None
    raw = fields.get(_O)
    options = "" if raw is None else raw.decode(errors="replace")
    return JobEntry(
        entry_id,
        named.decode(errors="replace") if named else entry_id,
        path.decode(errors="replace"),
        fields[_P].decode(errors="replace"),
        fields.get(_T, b"").decode(errors="replace"),
        bool(named),
        options,
        JobOptions.parse(options),
    )


def entry_payload(fields: Mapping[bytes, bytes]) -> bytes | None:
    """An entry's payload as stored, for a dead letter of an entry that is no job."""
    return fields.get(_P)


def starts_before(fields: Mapping[bytes, bytes]) -> int:
    """The starts a job had before it was set aside (its aside entry's ``a``); 0 for any
    other entry."""
    raw = fields.get(_A)
    return int(raw) if raw is not None and raw.isdigit() and len(raw) <= 6 else 0


# -- the record ------------------------------------------------------------------------------

JOB_STATE = "s"
JOB_HANDLER = "h"
JOB_ENTRY = "e"
JOB_ENQUEUED = "t"
JOB_RUN_AT = "at"
JOB_PAYLOAD = "p"
JOB_STARTED = "st"
JOB_FINISHED = "ft"
JOB_ATTEMPTS = "a"
JOB_WORKER = "w"
JOB_RESULT = "r"
JOB_REASON = "reason"
JOB_ERROR = "err"
JOB_ASIDE = "aside"
JOB_WHY = "why"
JOB_OPTIONS = "o"
JOB_TRACE = "tr"  # while tracing, the trace id of its last run (written by its settle)
JOB_PROGRESS = "pg"
JOB_PROGRESS_MESSAGE = "pm"
JOB_DEPS = "deps"

RESULT_FIELDS = [JOB_STATE, JOB_RESULT, JOB_REASON, JOB_ERROR]  # what a result poll reads


def decode_record(raw: Mapping[bytes, bytes]) -> dict[str, str]:
    """A job's record (an HGETALL reply) as text, by field name.

    ==========  ================================================================================
    ``s``       ``JobState``: scheduled, deferred, queued, done, dead, cancelled ("running" is
                read off the stream's pending list: a queued job a member has read)
    ``h``       handler (``module:function``)
    ``e``       its stream entry's id, once on the stream (a delayed, requeued or aside job)
    ``t``       enqueued at (s)
    ``at``      when a delayed job runs (a retry waiting: when it runs again)
    ``p``       its payload: a delayed (or deferred) job's until it is due (released; a
                retry waiting's too), a finished job's for as long as its record (a done
                job's up to ``DONE_PAYLOAD_KEPT`` characters)
    ``st``      started at          ``ft``  finished at
    ``a``       attempts            ``w``   the worker that settled it
    ``r``       result JSON (done)
    ``reason``  why it died (dead)  ``err`` its traceback (dead; else the last failed
                attempt's, once one failed: a retry waits, or ran)
    ``aside``   the handler whose aside stream its entry ``e`` is on (set aside: no member that
                read it could run it)
    ``why``     why it waits there (shown while it is queued)
    ``o``       its own options, JSON (``queueworks.protocol.job_options``), while it waits off the
                stream (a delayed or deferred job, a retry waiting for its time)
    ``pg``      its progress, a fraction from 0 to 1 (``ctx.progress``: the last report)
    ``pm``      the message of that report (absent: none)
    ``deps``    a deferred job's: how many dependencies it was enqueued with (the ones still
                awaited are the set ``TaskKeys.deps``)
    ``tr``      while tracing, the trace id of the run that settled it (written by the worker
                right after the settle; ``queueworks.otel``)
    ==========  ================================================================================

    A job to run now has no record until it settles or is cancelled: its entry is all of
    it (``waiting_record`` says what it reads as). One whose handler reports progress
    while it runs gets a *partial* record first: ``pg`` and ``pm`` alone, no ``s``, expiring
    ``result_ttl`` after each report (``job_progress.lua``); the settle adds the rest.
    """
    return {k.decode(): v.decode() for k, v in raw.items()}


_S = JOB_STATE.encode()


def has_state(raw: Mapping[bytes, bytes]) -> bool:
    """Whether a record (an HGETALL reply) is a whole one: not empty, nor the partial record
    of a job to run now that reported progress before it settled."""
    return _S in raw


def waiting_record(
    fields: Mapping[bytes, bytes], partial: Mapping[bytes, bytes] | None = None
) -> dict[bytes, bytes]:
    """What the record of a job that waits (or runs) as its entry alone reads as: its
    entry's, with what a ``partial`` record holds (its progress)."""
    return {
        **(partial or {}),
        _S: JobState.QUEUED.value.encode(),
        JOB_HANDLER.encode(): fields.get(_H, b""),
        JOB_ENQUEUED.encode(): fields.get(_T, b""),
    }


def queued_entry(raw: Mapping[bytes, bytes]) -> tuple[bytes, str] | None:
    """A queued job's entry id and the handler whose aside stream it is on ('' = the
    queue's own), from its record; None if it is not queued with an entry."""
    entry = raw.get(JOB_ENTRY.encode())
    if raw.get(JOB_STATE.encode()) != JobState.QUEUED.value.encode() or not entry:
        return None
    return entry, (raw.get(JOB_ASIDE.encode()) or b"").decode()


def _text(raw: Any) -> str | None:
    if raw is None:
        return None
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _int(raw: str | None) -> int:
    return int(raw) if raw else 0


def _float(raw: str | None) -> float | None:
    return float(raw) if raw else None


def _fraction(raw: str | None) -> float | None:
    """A stored progress: None unless it is a number from 0 to 1 (one written by hand)."""
    try:
        value = float(raw) if raw else None
    except ValueError:
        return None
    return value if value is not None and 0.0 <= value <= 1.0 else None


# what ``job_status`` reads of a record: a list of jobs reads these (HMGET), never the
# payload or the result, which a record keeps whole (``STATUS_FIELDS``, ``status_record``)
STATUS_FIELDS = (
    JOB_STATE,
    JOB_HANDLER,
    JOB_ENQUEUED,
    JOB_RUN_AT,
    JOB_STARTED,
    JOB_FINISHED,
    JOB_ATTEMPTS,
    JOB_WORKER,
    JOB_REASON,
    JOB_ERROR,
    JOB_WHY,
    JOB_PROGRESS,
    JOB_PROGRESS_MESSAGE,
    JOB_DEPS,
)
_STATUS_NAMES = tuple(name.encode() for name in STATUS_FIELDS)


def status_record(reply: Any) -> dict[bytes, bytes]:
    """A record as an HMGET of ``STATUS_FIELDS`` read it (an HGETALL reply of those
    fields); an error or no record: empty."""
    if not isinstance(reply, list):
        return {}
    return {k: v for k, v in zip(_STATUS_NAMES, reply, strict=False) if v is not None}


def job_status(
    queue: str,
    job_id: str,
    raw: Mapping[bytes, bytes],
    pending: Any,
    now: float,
    waits: Sequence[str] = (),
) -> JobStatus:
    """A job's status from its record and, for a queued job, its pending-list row (an
    XPENDING range reply: empty if no member has read it yet); ``waits``: a deferred job's
    dependencies still awaited."""
    f = decode_record(raw)
    state = JobState(f.get(JOB_STATE, JobState.QUEUED.value))
    attempts, worker = _int(f.get(JOB_ATTEMPTS)), f.get(JOB_WORKER)
    started = _float(f.get(JOB_STARTED))
    if state == JobState.QUEUED and pending and _text(pending[0]["consumer"]) != PARKED:
        row = pending[0]  # a member has it (a parked one waits to be taken over)
        state, worker = JobState.RUNNING, _text(row["consumer"])
        attempts = int(row["times_delivered"])
        started = now - int(row["time_since_delivered"]) / 1000
    error = reason = last_error = None
    if state == JobState.QUEUED:
        reason = f.get(JOB_WHY) or None
    lines = (f.get(JOB_ERROR) or "").strip().splitlines()
    if state == JobState.DEFERRED:
        total = max(_int(f.get(JOB_DEPS)), len(waits))
        reason = f"waits for {len(waits)} of {total} dependencies: {', '.join(sorted(waits))}"
    if state == JobState.DEAD:
        died = f.get(JOB_REASON, "dead")
        error = f"{died}: {lines[-1]}" if lines else died
    elif lines:
        last_error = lines[-1]
    return JobStatus(
        id=job_id,
        queue=queue,
        handler=f.get(JOB_HANDLER, ""),
        state=state,
        attempts=attempts,
        worker=worker,
        enqueued_at=_float(f.get(JOB_ENQUEUED)) or 0.0,
        run_at=_float(f.get(JOB_RUN_AT)),
        started_at=started,
        finished_at=_float(f.get(JOB_FINISHED)),
        error=error,
        reason=reason,
        progress=_fraction(f.get(JOB_PROGRESS)),
        progress_message=f.get(JOB_PROGRESS_MESSAGE),
        last_error=last_error,
        waits_for=sorted(waits) if state == JobState.DEFERRED else [],
        priority=priority_of_id(job_id),
    )


# -- the dead letter -------------------------------------------------------------------------

DEAD_ENTRY = "entry"
DEAD_JOB = "job"
DEAD_INDEX = "index"
DEAD_REASON = "reason"
DEAD_ERROR = "error"
DEAD_ATTEMPTS = "attempts"
DEAD_PAYLOAD = "payload"
DEAD_HANDLER = "handler"
DEAD_WORKER = "worker"
DEAD_TS = "ts"
DEAD_OPTIONS = "o"

DEAD_FIELDS = (
    DEAD_ENTRY,
    DEAD_JOB,
    DEAD_INDEX,
    DEAD_REASON,
    DEAD_ERROR,
    DEAD_ATTEMPTS,
    DEAD_PAYLOAD,
    DEAD_HANDLER,
    DEAD_WORKER,
    DEAD_TS,
    DEAD_OPTIONS,
)


def decode_dead_letter(raw: Mapping[bytes, bytes], errors: str = "strict") -> dict[str, str | None]:
    """One entry of a dead-letter stream, by field name: its text, None where it is missing.
    ``errors``: how bytes that are no UTF-8 are decoded (``"strict"``: ``UnicodeDecodeError``).

    ============  ==============================================================================
    ``entry``     the stream entry it was ('' for a subtask swept as lost)
    ``job``       a queue's: the job's id ('' for an entry that was no job: ``rejected``)
    ``index``     a task's: the subtask's index ('' if the entry had none)
    ``reason``    why it died; ``rejected`` for an entry that was no job or subtask
    ``error``     the traceback, or what was wrong with the entry
    ``attempts``  the starts it had
    ``payload``   its payload JSON, as enqueued (to requeue it)
    ``handler``   a queue's: the job's handler
    ``worker``    the worker that dead-lettered it
    ``ts``        when (s)
    ``o``         a queue's job: its own options (``job_options``), when it had any; a
                  requeue puts them back on its entry
    ============  ==============================================================================
    """
    out: dict[str, str | None] = {}
    for name in DEAD_FIELDS:
        value = raw.get(name.encode())
        out[name] = None if value is None else value.decode(errors=errors)
    return out


# -- the index of done jobs ------------------------------------------------------------------

DONE_KEPT = 10_000  # the done jobs' ids a queue keeps (``TaskKeys.done``), newest first
# the longest payload (characters) a done job's record keeps (settle_jobs.lua); a dead
# job's is kept whole, as its dead letter's
DONE_PAYLOAD_KEPT = 64 * 1024

# -- names the Lua scripts get -----------------------------------------------------------------

LUA_NAMES = {
    "ENTRY_JOB": ENTRY_JOB,
    "ENTRY_HANDLER": ENTRY_HANDLER,
    "ENTRY_PAYLOAD": ENTRY_PAYLOAD,
    "ENTRY_ENQUEUED": ENTRY_ENQUEUED,
    "ENTRY_STARTS": ENTRY_STARTS,
    "ENTRY_OPTIONS": ENTRY_OPTIONS,
    "JOB_STATE": JOB_STATE,
    "JOB_HANDLER": JOB_HANDLER,
    "JOB_ENTRY": JOB_ENTRY,
    "JOB_ENQUEUED": JOB_ENQUEUED,
    "JOB_RUN_AT": JOB_RUN_AT,
    "JOB_PAYLOAD": JOB_PAYLOAD,
    "JOB_STARTED": JOB_STARTED,
    "JOB_FINISHED": JOB_FINISHED,
    "JOB_ATTEMPTS": JOB_ATTEMPTS,
    "JOB_WORKER": JOB_WORKER,
    "JOB_TRACE": JOB_TRACE,
    "JOB_RESULT": JOB_RESULT,
    "JOB_REASON": JOB_REASON,
    "JOB_ERROR": JOB_ERROR,
    "JOB_ASIDE": JOB_ASIDE,
    "JOB_WHY": JOB_WHY,
    "JOB_OPTIONS": JOB_OPTIONS,
    "JOB_PROGRESS": JOB_PROGRESS,
    "JOB_PROGRESS_MESSAGE": JOB_PROGRESS_MESSAGE,
    "JOB_DEPS": JOB_DEPS,
    **{f"DEAD_{name.upper()}": name for name in DEAD_FIELDS},
    "DEAD_OPTIONS": DEAD_OPTIONS,
    "DONE_KEPT": str(DONE_KEPT),
}
