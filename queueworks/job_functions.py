"""Typed job functions: ``@job`` makes a function of annotated parameters a job.

``charge.call(order, 3, note="hi")`` checks the arguments against the function's
signature (pydantic: types, required, unknown; a ``ValueError`` naming the parameter) and
encodes them to JSON by their annotations: a ``Call[R]`` that ``Queue.enqueue`` sends as
it is, typed ``Job[R]``. The worker imports the decorated function (the allow-list decides,
as for any handler), sees its ``JobFunction`` and decodes the arguments back to the
annotated types; the return value is encoded by the return annotation, and
``job.result()`` decodes it.

The wire form is a job's payload, nothing else: ``{"args": [...], "kwargs": {...}}``:
``args`` by position, ``kwargs`` by name, each as JSON (a datetime as ISO 8601, a UUID or a
Decimal as a string, an enum as its value, a dataclass or a model as an object). A Python
producer sends every argument by name. The parameter annotated ``JobContext`` (or
``SubtaskContext``) is given by the worker, never sent.

Everything a call needs is built once per function (``Signature``): the pydantic validator
and serializer of its arguments (a ``TypedDict`` of its parameters), the adapter of its
return type.
"""

from __future__ import annotations

import inspect
import json
import types
import typing
from collections.abc import Callable, Coroutine, Sequence
from functools import cached_property, update_wrapper
from typing import Any, Generic, NotRequired, ParamSpec, Required, cast, overload

from pydantic import ConfigDict, TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError, PydanticSerializationUnexpectedValue
from typing_extensions import TypedDict, TypeVar

from queueworks.context import JobContext, SubtaskContext
from queueworks.errors import BadArguments
from queueworks.protocol.models import parse_handler_path

P = ParamSpec("P")
R = TypeVar("R", default=Any)

ARGS, KWARGS = "args", "kwargs"  # the payload's two fields
_FIELDS = frozenset((ARGS, KWARGS))
_CONTEXTS = (JobContext, SubtaskContext)


class Call(Generic[R]):
    """One call of a job function, checked and encoded: what ``Queue.enqueue`` sends.
    ``path`` is the handler (``"module:function"``), ``body`` the payload's JSON."""

    __slots__ = ("body", "signature")

    def __init__(self, signature: Signature, body: str) -> None:
        self.signature, self.body = signature, body

    def __repr__(self) -> str:
        return f"Call({self.signature.name}, {self.body})"

    @property
    def path(self) -> str:
        return self.signature.path

    def decode(self, value: Any) -> R:
        """The job's result (JSON) as the function's return annotation says."""
        result: R = self.signature.decode_result(value)
        return result


class Signature:
    """What ``@job`` learns of a function once: where its ``ctx`` goes, the validator and
    serializer of its other parameters, and its return type."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn, self.name = fn, fn.__name__
        hints = typing.get_type_hints(fn, include_extras=True)
        params = inspect.signature(fn).parameters.values()
        self.ctx: str | None = None
        fields: dict[str, Any] = {}  # a TypedDict's: the arguments by name
        self.positional: list[str] = []  # filled by position, in order
        self.positional_only: list[inspect.Parameter] = []
        for p in params:
            hint = hints.get(p.name, Any)
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise TypeError(f"@job {self.name}: *args and **kwargs cannot be sent; name them")
            if _is_context(hint):
                self.ctx = p.name
                continue
            fields[p.name] = Required[hint] if p.default is p.empty else NotRequired[hint]
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                self.positional.append(p.name)
            if p.kind is p.POSITIONAL_ONLY:
                self.positional_only.append(p)
        self.most_positional = len(self.positional)
        self.by_position = bool(self.positional_only)
        make_typed_dict: Any = TypedDict  # its name, made here, is the function's
        arguments = make_typed_dict(self.name, fields)
        arguments.__pydantic_config__ = ConfigDict(extra="forbid")
        adapter = TypeAdapter(arguments)
        self._validate = adapter.validator.validate_python
        self._to_json = adapter.serializer.to_json
        returns = hints.get("return", Any)
        self.result: TypeAdapter[Any] | None = None if returns is Any else TypeAdapter(returns)
        # a JSON-native return type is checked by its type alone (no adapter per job)
        native = returns is None or isinstance(returns, type)
        self._native = _NATIVE.get(returns) if native else None

    @cached_property
    def path(self) -> str:
        """``"module:function"``: ``ValueError`` if no worker could import it."""
        return function_path(self.fn)

    # -- the producer's side ----------------------------------------------------------------

    def encode(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The payload JSON of a call with these arguments; ``ValueError`` naming the
        parameter that is wrong (nothing is sent)."""
        if kwargs or len(args) > self.most_positional:
            values = self._bound(args, kwargs)
        else:  # the commonest call: by position alone (no more than there are)
            values = dict(zip(self.positional, args))  # noqa: B905 (strict= costs ~0.3 µs)
        try:
            checked = self._validate(values)
        except ValidationError as exc:
            raise BadArguments(self.name, exc) from None
        return '{"args":[],"kwargs":' + self._to_json(checked).decode() + "}"

    def _checked(self, values: dict[str, Any]) -> dict[str, Any]:
        """The arguments by name, as their annotations say; ``BadArguments`` (a
        ``ValueError``) naming each parameter that is wrong, on one line."""
        try:
            checked: dict[str, Any] = self._validate(values)
        except ValidationError as exc:
            raise BadArguments(self.name, exc) from None
        return checked

    def _bound(self, args: Any, kwargs: Any) -> dict[str, Any]:
        if type(args) is not list and type(args) is not tuple:
            raise ValueError(f"{self.name}: 'args' must be a list, not {type(args).__name__}")
        if type(kwargs) is not dict:
            named = type(kwargs).__name__
            raise ValueError(f"{self.name}: 'kwargs' must be an object, not {named}")
        if len(args) > len(self.positional):
            raise ValueError(
                f"{self.name}() takes {len(self.positional)} positional arguments "
                f"but {len(args)} were given"
            )
        values = dict(zip(self.positional, args, strict=False))
        if kwargs:
            twice = values.keys() & kwargs.keys()
            if twice:
                raise ValueError(f"{self.name}(): more than one value for {sorted(twice)[0]!r}")
            if self.ctx is not None and self.ctx in kwargs:
                raise ValueError(f"{self.name}(): {self.ctx!r} is given by the worker, not sent")
            values.update(kwargs)
        return values

    # -- the worker's side ------------------------------------------------------------------

    def decode_call(self, payload: Any, ctx: Any) -> tuple[list[Any], dict[str, Any]]:
        """The arguments of a job's payload, as the annotations say (``ValueError`` naming
        what is wrong), with ``ctx`` where the function takes it."""
        if type(payload) is not dict or not payload.keys() <= _FIELDS:
            raise ValueError(
                f"{self.name}: a typed job's payload is "
                '{"args": [...], "kwargs": {...}}, not ' + repr(payload)[:200]
            )
        args, kwargs = payload.get(ARGS), payload.get(KWARGS)
        if not args and type(kwargs) is dict and (self.ctx is None or self.ctx not in kwargs):
            values = kwargs  # the commonest: by name alone (as a Python producer sends)
        else:
            values = self._bound(args or (), {} if kwargs is None else kwargs)
        checked = self._checked(values)
        given = [self._take(p, checked) for p in self.positional_only] if self.by_position else []
        if self.ctx is not None:
            checked[self.ctx] = ctx
        return given, checked

    @staticmethod
    def _take(p: inspect.Parameter, kwargs: dict[str, Any]) -> Any:
        return kwargs.pop(p.name) if p.name in kwargs else p.default

    def encode_result(self, value: Any) -> Any:
        """The return value as JSON-able data, by the return annotation (a value of
        another type is an error)."""
        native = self._native
        if native is not None and type(value) in native:
            return value
        if self.result is None:
            return value
        try:
            return self.result.dump_python(value, mode="json", warnings="error")
        except (PydanticSerializationError, PydanticSerializationUnexpectedValue) as exc:
            detail = str(exc).strip().splitlines()[-1].strip()  # one line: the last is the why
            raise TypeError(
                f"{self.name}() returned {type(value).__name__}, not what its return "
                f"annotation says: {detail}"
            ) from None

    def decode_result(self, value: Any) -> Any:
        return value if self.result is None else self.result.validate_python(value)

    def handler(self) -> Callable[..., Any]:
        """What a worker calls for a job: ``(payload, ctx)`` in, JSON-able data out (a
        coroutine function for an ``async def``)."""
        fn, decode, encode = self.fn, self.decode_call, self.encode_result
        if inspect.iscoroutinefunction(fn):

            async def run_async(payload: Any, ctx: Any = None) -> Any:
                args, kwargs = decode(payload, ctx)
                return encode(await fn(*args, **kwargs))

            return run_async

        def run(payload: Any, ctx: Any = None) -> Any:
            args, kwargs = decode(payload, ctx)
            return encode(fn(*args, **kwargs))

        if self.by_position:
            return run

        def run_by_name(payload: Any, ctx: Any = None) -> Any:
            return encode(fn(**decode(payload, ctx)[1]))

        return run_by_name


def function_path(fn: Callable[..., Any]) -> str:
    """``"module:function"`` of a module-level function of an importable module (what a
    worker can import); ``ValueError`` if it is not one."""
    module, name = getattr(fn, "__module__", ""), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or "." in name or "<" in name:
        raise ValueError(
            f"handler {fn!r}: a worker can only import a module-level function of an "
            "importable module; give it as 'package.module:function'"
        )
    path = f"{module}:{name}"
    parse_handler_path(path)
    return path


def arguments_of(
    payload: str | None, positional: Sequence[str] = ()
) -> list[tuple[str, str]] | None:
    """A typed call's arguments as a page shows them: ``(name, JSON)`` each, by name (one
    given by position by its name in ``positional``, the function's ``Signature.positional``,
    else as ``#0``, ``#1``...); None if ``payload`` (JSON text) is no typed call's wire
    form."""
    if not payload or not payload.startswith("{"):
        return None
    try:
        value = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(value, dict) or not value or not value.keys() <= {ARGS, KWARGS}:
        return None
    args, kwargs = value.get(ARGS, []), value.get(KWARGS, {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        return None
    names = [*positional[: len(args)], *(f"#{i}" for i in range(len(positional), len(args)))]
    shown = [(n, json.dumps(v, ensure_ascii=False)) for n, v in zip(names, args, strict=True)]
    return shown + [(str(k), json.dumps(v, ensure_ascii=False)) for k, v in kwargs.items()]


_NATIVE: dict[Any, tuple[type, ...]] = {
    None: (type(None),),
    type(None): (type(None),),
    int: (int,),
    str: (str,),
    bool: (bool,),
    float: (float, int),
}


def _is_context(hint: Any) -> bool:
    """Whether an annotation is a job's context (``JobContext``, ``JobContext | None``)."""
    if hint in _CONTEXTS:
        return True
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        return any(arg in _CONTEXTS for arg in typing.get_args(hint))
    return False


class JobFunctionBase(Generic[P, R]):
    """What ``@job`` makes of a function: called as the function, and ``.call(...)``
    to make a job of it."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        update_wrapper(cast(Any, self), fn)
        self.signature = Signature(fn)

    def call(self, *args: P.args, **kwargs: P.kwargs) -> Call[R]:
        """A job of this function with these arguments, checked now: ``ValueError``
        naming a wrong parameter. ``Queue.enqueue`` it."""
        return Call(self.signature, self.signature.encode(args, kwargs))

    @property
    def path(self) -> str:
        """``"module:function"``, the handler that workers import."""
        return self.signature.path

    def __repr__(self) -> str:
        return f"<job {self.signature.fn.__module__}:{self.signature.fn.__qualname__}>"


class JobFunction(JobFunctionBase[P, R]):
    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        result: R = self.signature.fn(*args, **kwargs)
        return result


class AsyncJobFunction(JobFunctionBase[P, R]):
    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]:
        result: Coroutine[Any, Any, R] = self.signature.fn(*args, **kwargs)
        return result


@overload
def job(fn: Callable[P, Coroutine[Any, Any, R]]) -> AsyncJobFunction[P, R]: ...  # type: ignore[overload-overlap]
@overload
def job(fn: Callable[P, R]) -> JobFunction[P, R]: ...
def job(fn: Callable[..., Any]) -> JobFunctionBase[..., Any]:
    """Make ``fn`` a typed job function: ``fn.call(...)`` is a job to enqueue, ``fn(...)``
    still a plain call. Its parameters and return value must be of types pydantic can
    read and write as JSON; the one annotated ``JobContext`` gets the job's context."""
    if inspect.iscoroutinefunction(fn):
        return AsyncJobFunction(fn)
    return JobFunction(fn)
