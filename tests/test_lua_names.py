"""The Lua scripts get every job field name from its codec (``queueworks.protocol.jobrecords``),
never
retype one: a quoted literal that is one of those names fails here, and the scripts as
loaded (``${NAME}`` substituted) must still hold the real names."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from queueworks.protocol import jobrecords
from queueworks.scripts import bound as scripts
from queueworks.scripts.calls import NAMES

pytestmark = pytest.mark.unit

FIELD_NAMES = set(jobrecords.LUA_NAMES.values())
_LITERAL = re.compile(r"""'([^'\n]*)'|"([^"\n]*)\"""")
_PLACEHOLDER = re.compile(r"\$\{([A-Z_]+)\}")


def _lua_files() -> dict[str, str]:
    folder = resources.files("queueworks").joinpath("lua")
    return {p.name: p.read_text() for p in folder.iterdir() if p.name.endswith(".lua")}


def _code(text: str) -> str:
    """The script without its comments (its contract speaks of the fields by name)."""
    return "\n".join(line.split("--", 1)[0] for line in text.splitlines())


def test_every_script_is_read() -> None:
    files = _lua_files()
    assert {f"{n}.lua" for n in NAMES} <= set(files)


@pytest.mark.parametrize("name", sorted(_lua_files()))
def test_no_script_retypes_a_job_field_name(name: str) -> None:
    literals = [a or b for a, b in _LITERAL.findall(_code(_lua_files()[name]))]
    retyped = sorted({x for x in literals if x in FIELD_NAMES})
    assert not retyped, f"{name} retypes job field names {retyped}: use ${{NAME}} from Python"


@pytest.mark.parametrize("name", sorted(NAMES))
def test_the_loaded_scripts_hold_the_real_names(name: str) -> None:
    raw = _lua_files()[f"{name}.lua"]
    source = scripts._source(name)
    assert "${" not in source
    used = set(_PLACEHOLDER.findall(raw))
    for placeholder in used & set(jobrecords.LUA_NAMES):
        assert f"'{jobrecords.LUA_NAMES[placeholder]}'" in source, (name, placeholder)


def test_the_job_scripts_write_the_codecs_names() -> None:
    """The template worked where it matters most: what settle_jobs.lua writes."""
    source = scripts._source("settle_jobs")
    for field in ("'s'", "'r'", "'reason'", "'err'", "'st'", "'ft'", "'a'", "'w'", "'h'", "'t'"):
        assert field in source
    for field in ("'entry'", "'job'", "'error'", "'attempts'", "'payload'", "'handler'"):
        assert field in source
    assert "'h', handler, 't', enqueued" in source  # the record of a job to run now
