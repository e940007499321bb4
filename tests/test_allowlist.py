"""Issue 9: the handler allowlist cannot be bypassed, and data is JSON only.

``resolve`` takes exactly ``package.module:function`` (ASCII identifiers, no dunders, no
attribute chains), imports nothing outside the ``--allow`` prefixes, and returns only a
plain Python function defined under them. Payloads and results are JSON: a result JSON
cannot carry is dead-lettered, and no code under ``queueworks/``, ``controller/`` or
``workers/`` unpickles, unmarshals, evals or execs anything.

Budget: ~4 s (one worker process; the rest is pure).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from queueworks import Client, SubmitError, TaskSpec, TaskState
from queueworks.protocol.models import parse_handler_path
from queueworks.workers.handlers import HandlerRefused, allowed, resolve
from tests.conftest import ROOT, Cluster
from tests.handlers_poison import NOT_JSON

EXAMPLES = ["queueworks.examples"]


@pytest.mark.unit
@pytest.mark.parametrize(
    "path",
    [
        "builtins:__import__",
        "queueworks.examples:__class__",
        "queueworks.examples:__builtins__",
        "queueworks.examples.__builtins__:x",
        "queueworks.examples:double.__globals__",
        "queueworks.examples:double.__code__",
        "a..b:c",
        ".queueworks.examples:double",
        "queueworks.examples.:double",
        "a:b.c",
        "a: b",
        " queueworks.examples:double",
        "queueworks.examples:double ",
        "queueworks.examples:double\n",  # `$` matches before a final newline
        "queueworks.examples:double\x00",
        "queueworks.examples::double",
        "queueworks.examples:double:double",
        "queueworks/examples:double",
        "queueworks.examples",
        ":double",
        "",
        # unicode lookalikes: Cyrillic a, fullwidth colon, fullwidth d, dotless i, NBSP
        "queueworks.ex\u0430mples:double",
        "queueworks.examples\uff1adouble",
        "queueworks.examples:\uff44ouble",
        "queueworks.examples:doubl\u0131",
        "queueworks.examples:\u00a0double",
    ],
)
def test_malformed_or_dunder_paths_are_refused(path: str) -> None:
    with pytest.raises(HandlerRefused):
        resolve(path, [*EXAMPLES, "os", "builtins", "a"])
    with pytest.raises(ValueError):  # and refused at submit, before anything is written
        parse_handler_path(path)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("path", "prefixes"),
    [
        ("queueworks.examples:double", ["queueworks.ex"]),
        ("queueworks.examples:double", ["queueworks.ex."]),
        ("queueworks.examples_evil:double", ["queueworks.examples"]),
        ("queueworks.examples:double", ["queueworks.examples.sub"]),
        ("queueworks.examples:double", [""]),
        ("queueworks.examples:double", ["."]),
        ("queueworks.examples:double", []),
        ("queueworks.examples:double", ["Queueworks.Examples"]),
        ("os.path:join", ["os.pat"]),
        ("os.path:join", ["queueworks"]),
    ],
)
def test_prefix_tricks_are_refused(path: str, prefixes: list[str]) -> None:
    with pytest.raises(HandlerRefused, match="outside the allowed module prefixes"):
        resolve(path, prefixes)


@pytest.mark.unit
def test_prefixes_allow_the_module_and_its_submodules_only() -> None:
    assert allowed("queueworks.examples", ["queueworks.examples"])
    assert allowed("queueworks.examples", ["queueworks.examples."])
    assert allowed("queueworks.examples.sub", ["queueworks"])
    assert not allowed("queueworks.examples_evil", ["queueworks.examples"])
    assert not allowed("queueworks", ["queueworks.examples"])
    assert resolve("queueworks.examples:double", ["queueworks"]).fn({"x": 2}) == 4


@pytest.mark.system
def test_a_refused_module_is_never_imported() -> None:
    """The allowlist is checked before the import: a refused module's top level never runs
    (``this`` prints the Zen of Python when imported)."""
    code = (
        "import sys\n"
        "from workers.handlers import HandlerRefused, resolve\n"
        "for path in ('this:x', 'tests.handlers_evil:x', 'antigravity:x'):\n"
        "    try:\n"
        "        resolve(path, ['tests.handlers', 'queueworks'])\n"
        "    except HandlerRefused:\n"
        "        pass\n"
        "    else:\n"
        "        raise SystemExit('resolved ' + path)\n"
        "print(sorted(m for m in ('this', 'antigravity') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


@pytest.mark.unit
@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("os:system", "not a plain Python function"),  # even with --allow os
        ("builtins:eval", "not a plain Python function"),  # even with --allow builtins
        ("builtins:print", "not a plain Python function"),
        ("tests.handlers_poison:NotAFunction", "not a plain Python function"),  # a class
        ("tests.handlers_poison:not_a_function", "not a plain Python function"),
        ("tests.handlers_poison:a_builtin", "not a plain Python function"),  # len
        ("tests.handlers_poison:a_module", "not a plain Python function"),  # os
        ("tests.handlers_poison:NOT_JSON", "not a plain Python function"),  # a dict
        ("tests.handlers_poison:os", "not a plain Python function"),  # an imported module
        ("queueworks.examples:time", "not a plain Python function"),
        ("queueworks.examples:hashlib", "not a plain Python function"),
        ("queueworks.examples:annotations", "not a plain Python function"),  # __future__
        ("queueworks.examples:SubtaskContext", "not a plain Python function"),
        ("queueworks.examples:nothing_here", "has no 'nothing_here'"),
        ("queueworks.examples.nope:f", "cannot import"),
        # a function imported into an allowed module from one that is not allowed
        ("tests.handlers_poison:reexported", "defined in 'json'"),
    ],
)
def test_only_plain_functions_defined_under_the_prefixes(path: str, why: str) -> None:
    with pytest.raises(HandlerRefused, match=why):
        resolve(path, ["tests.handlers_poison", "queueworks.examples", "os", "builtins"])


@pytest.mark.unit
def test_allowed_handlers_resolve() -> None:
    h = resolve("tests.handlers_poison:mixed", ["tests.handlers_poison"])
    assert h.takes_ctx and h.fn.__name__ == "mixed"
    h = resolve("tests.handlers_poison:a_lambda", ["tests.handlers_poison"])
    assert not h.takes_ctx and h.fn({"a": 1}) == {"a": 1}


@pytest.mark.unit
def test_a_handler_is_resolved_once_a_process_and_a_refusal_each_time() -> None:
    """A worker serving thousands of queues meets one path in each: it is resolved once
    for the process (the same handler, for the same prefixes); a refusal is not kept."""
    prefixes = ["tests.handlers_poison"]
    first = resolve("tests.handlers_poison:mixed", prefixes)
    assert resolve("tests.handlers_poison:mixed", list(prefixes)) is first
    assert resolve("tests.handlers_poison:mixed", [*prefixes, "queueworks"]) is not first
    refusals = []
    for _ in range(2):
        with pytest.raises(HandlerRefused) as refused:
            resolve("tests.handlers_poison:nothing_here", prefixes)
        refusals.append(refused.value)
    assert refusals[0] is not refusals[1]


# -- JSON only ----------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), b"x", {1, 2}, object()])
def test_payloads_json_cannot_carry_are_refused_at_submit(client: Client, bad: object) -> None:
    spec = TaskSpec(name="t", handler="m:f", subtasks=[{"x": 1}, {"x": bad}])
    with pytest.raises(SubmitError, match=r"subtasks\[1\]"):
        client.submit(spec)


@pytest.mark.system
def test_results_json_cannot_carry_are_dead_lettered(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    cluster.controller()
    cluster.worker(allow=("tests.handlers_poison",))
    kinds = sorted(NOT_JSON)
    subtasks = [{"result": k} for k in kinds] + [{"x": i} for i in range(5)]
    task = client.submit(
        TaskSpec(name="results", handler="tests.handlers_poison:mixed", subtasks=subtasks)
    )
    status = task.wait(timeout=30)
    assert status.state == TaskState.COMPLETED, status
    assert (status.done, status.dead) == (5, len(kinds)), status
    letters = task.dead_letters()
    assert {d.index for d in letters} == set(range(len(kinds)))
    assert {d.reason for d in letters} == {"result is not JSON"}
    assert all(d.attempts == 1 for d in letters)  # never retried: it would fail the same way
    results = dict(task.results())
    assert {i - len(kinds): v["y"] for i, v in results.items()} == {i: 2 * i for i in range(5)}
    for raw in r.hvals(client.keys.task(task.id).results):
        json.loads(raw, parse_constant=_refuse)  # strict JSON: no NaN/Infinity stored


def _refuse(name: str) -> None:
    raise AssertionError(f"{name} stored in a result")


# -- no unpickling, no eval ---------------------------------------------------------------

FORBIDDEN_MODULES = {"pickle", "_pickle", "cPickle", "marshal", "shelve", "dill"}
FORBIDDEN_MODULES |= {"cloudpickle", "jsonpickle", "joblib"}
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__"}
IMPORTERS = {  # the only places that import modules named by data, and why
    "workers/handlers.py",  # resolve(): behind the --allow prefixes
    "queueworks/rq.py",  # RQ jobs (subtasks_factory, on_stopped): RQ's own trust model
    # a Django task's module: behind the worker's --allow, or the backend's allow (else the
    # project's installed apps) where a result is read
    "queueworks/contrib/django/results.py",
    # a typed job's parameter names for its page: behind the dashboard's own --allow
    "queueworks/dashboard/arguments.py",
    # a public name's module, or a command's, on first use: from the file's own table of
    # constant module names, never from data
    "queueworks/__init__.py",
    "queueworks/cli/group.py",
}


def _sources() -> list[Path]:
    files = [p for d in ("queueworks", "controller", "workers") for p in (ROOT / d).rglob("*.py")]
    assert len(files) > 20
    return files


def _offences(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    rel = path.relative_to(root).as_posix()
    out = []
    for node in ast.walk(tree):
        where = f"{rel}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            out += [f"{where} import {a.name}" for a in node.names if _root(a.name)]
        elif isinstance(node, ast.ImportFrom) and _root(node.module or ""):
            out.append(f"{where} from {node.module} import ...")
        elif isinstance(node, ast.Call):
            name = _called(node.func)
            if name in FORBIDDEN_CALLS and _owner(node.func) in ("", "builtins"):
                out.append(f"{where} {name}()")
            if name == "import_module" and rel not in IMPORTERS:
                out.append(f"{where} import_module() outside the allowlisted importers")
            if name == "load" and _owner(node.func) == "torch":
                safe = any(
                    k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value
                    for k in node.keywords
                )
                if not safe:
                    out.append(f"{where} torch.load without weights_only=True")
            if name == "load" and _owner(node.func) == "yaml":
                out.append(f"{where} yaml.load (use yaml.safe_load)")
    return out


def _root(module: str) -> bool:
    return module.split(".")[0] in FORBIDDEN_MODULES


def _called(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _owner(func: ast.expr) -> str:
    """``x`` of a call ``x.f()``; "" for a bare ``f()``; "?" for anything else."""
    if isinstance(func, ast.Attribute):
        return func.value.id if isinstance(func.value, ast.Name) else "?"
    return ""


@pytest.mark.unit
def test_no_unpickling_unmarshalling_or_eval_in_the_code_base() -> None:
    offences = [o for path in _sources() for o in _offences(path)]
    assert offences == []


@pytest.mark.unit
def test_the_source_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    """The scanner itself: every forbidden form is reported, and nothing else."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import pickle\n"
        "from marshal import loads\n"
        "import cloudpickle as cp\n"
        "eval('1')\n"
        "exec('x=1')\n"
        "__import__('os')\n"
        "import builtins\n"
        "builtins.compile('1', 'f', 'eval')\n"
        "import torch\n"
        "torch.load('f')\n"
        "torch.load('f', weights_only=True)\n"
        "import yaml\n"
        "yaml.load('a')\n"
        "import importlib\n"
        "importlib.import_module('os')\n"
        "import re\n"
        "re.compile('fine')\n"
    )
    found = [o.split(" ", 1)[1] for o in _offences(bad, tmp_path)]
    assert found == [
        "import pickle",
        "from marshal import ...",
        "import cloudpickle",
        "eval()",
        "exec()",
        "__import__()",
        "compile()",
        "torch.load without weights_only=True",
        "yaml.load (use yaml.safe_load)",
        "import_module() outside the allowlisted importers",
    ], found
