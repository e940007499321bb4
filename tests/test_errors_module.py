"""One errors module: every public exception of queueworks is a ``QueueworksError``, keeps
the built-in base callers catch it by, and is defined in ``queueworks.errors``; the
handler's stop signals are not errors (``BaseException``, as ``asyncio.CancelledError``)."""

from __future__ import annotations

import inspect

import pytest
import redis

import queueworks
from queueworks import errors
from queueworks.context import Cancelled, Fenced, Stopped, Suspended

# each public exception and the built-in base it always had
BUILT_IN: dict[str, type[BaseException]] = {
    "JobFailed": Exception,
    "NotFinished": TimeoutError,
    "SubmitError": ValueError,
    "TaskNotFound": LookupError,
    "QueueNotFound": LookupError,
    "RedisUnavailable": redis.ConnectionError,
    "BadUrl": ValueError,
    "EvictingRedis": RuntimeError,
    "BadArguments": ValueError,
    "AdminError": ValueError,
    "NoServerBinary": RuntimeError,
    "NotReplicated": RuntimeError,
    "TargetTaskFailed": RuntimeError,
    "TargetTaskCancelled": RuntimeError,
    "StepAborted": Exception,
    "NotJSON": ValueError,
}


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_each_public_exception_is_a_queueworks_error(name: str) -> None:
    cls = getattr(errors, name)
    assert cls.__module__ == "queueworks.errors"
    assert issubclass(cls, errors.QueueworksError)
    assert issubclass(cls, BUILT_IN[name])


@pytest.mark.unit
def test_the_module_holds_no_other_exception() -> None:
    """A new exception in errors.py is listed above (and so checked)."""
    defined = {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value)
        and issubclass(value, BaseException)
        and value.__module__ == "queueworks.errors"
    }
    assert defined == {*BUILT_IN, "QueueworksError"}


@pytest.mark.unit
def test_the_package_exports_are_the_same_classes() -> None:
    for name in ("JobFailed", "SubmitError", "TaskNotFound", "QueueNotFound", "QueueworksError",
                 "RedisUnavailable", "EvictingRedis"):  # fmt: skip
        assert getattr(queueworks, name) is getattr(errors, name)


@pytest.mark.unit
def test_the_stop_signals_stay_the_handlers_contract() -> None:
    for signal in (Stopped, Fenced, Cancelled):
        assert not issubclass(signal, Exception)
        assert not issubclass(signal, errors.QueueworksError)
    assert not issubclass(Suspended, errors.QueueworksError)
