"""A queue setting is declared once (``QueueSettings``): the keyword arguments of
``Client.queue`` (``QueueOptions``), the ``enqueue`` command's options and the dashboard's
queue page all follow the declaration, so a setting cannot be added in one place only."""

from __future__ import annotations

import inspect
import math
from dataclasses import fields
from typing import Any, get_type_hints

import click
import pytest
from click.testing import CliRunner

from queueworks.cli.enqueue import enqueue
from queueworks.client.aio import AsyncClient
from queueworks.client.sync import Client
from queueworks.dashboard.queue_reader import RECORD_SETTINGS, shown_settings
from queueworks.dashboard.views import QueueDetail
from queueworks.protocol.models import StoredSpec
from queueworks.queue.queue_settings import (
    DEFAULTS,
    SETTINGS,
    QueueOptions,
    QueueSettings,
    check_queue_settings,
)

pytestmark = pytest.mark.unit

DECLARED = [f.name for f in fields(QueueSettings)]


def test_the_typeddict_names_every_setting_with_its_type() -> None:
    assert list(QueueOptions.__annotations__) == DECLARED
    assert QueueOptions.__required_keys__ == frozenset()
    assert get_type_hints(QueueOptions) == get_type_hints(QueueSettings)
    assert list(SETTINGS) == DECLARED


def test_the_clients_take_the_settings_as_keywords() -> None:
    for method in (Client.queue, AsyncClient.queue):
        params = inspect.signature(method).parameters
        assert params["settings"].kind is inspect.Parameter.VAR_KEYWORD
        assert "Unpack[QueueOptions]" in str(params["settings"].annotation)
        assert params["reopen"].kind is inspect.Parameter.KEYWORD_ONLY


def test_enqueue_has_an_option_for_every_setting() -> None:
    options = {p.name: p for p in enqueue.params if isinstance(p, click.Option)}
    settings = [name for name in options if name in SETTINGS]
    assert settings == DECLARED
    for name in DECLARED:  # (the queue's priority: --priority is the job's there)
        flag = "--queue-priority" if name == "priority" else "--" + name.replace("_", "-")
        assert options[name].opts == [flag]
        assert options[name].help == SETTINGS[name].help


def test_the_dashboard_shows_every_setting() -> None:
    shown = set(shown_settings(DEFAULTS.spec("q").model_dump())) | set(RECORD_SETTINGS)
    assert shown == set(DECLARED)
    assert shown - set(RECORD_SETTINGS) <= set(QueueDetail.model_fields)


def test_the_enqueue_options_are_the_declared_ones() -> None:
    """The old hand-written options, exactly: flags, help, shown defaults, bounds."""
    text = CliRunner().invoke(enqueue, ["--help"], terminal_width=200).output
    for line in (
        "--min-nodes INTEGER RANGE",
        "fewest workers the queue runs on  [default: the queue's own; 1 if new; 1<=x<=1000000]",
        "most workers the queue runs on  [default: the queue's own; no limit if new;",
        "higher runs first and may take nodes from lower  [default: the queue's own; 0 if new;"
        " -1000000000<=x<=1000000000]",
        "runs of a failing job before it is dead  [default: the queue's own; 3 if new; 1<=x<=1000]",
        "seconds a job may run before it is interrupted (a failed attempt)  [default: the "
        "queue's own; 60 if new; 0<x<=604800.0]",
        "--node-selector KEY=VALUE",
    ):
        assert line in text


def test_defaults_and_spec_round_trip() -> None:
    assert QueueSettings(1, None, 0, 3, 60.0, 24 * 3600.0, {}) == DEFAULTS
    assert DEFAULTS.node_selector is not QueueSettings().node_selector
    settings = QueueSettings(2, 5, 7, 4, 1.5, 60.0, {"gpu": "a100"})
    spec = settings.spec("q")
    assert (spec.mode, spec.subtask_timeout, spec.options) == ("queue", 1.5, {})
    stored = StoredSpec.model_validate_json(spec.model_dump_json(exclude={"subtasks"}))
    assert QueueSettings.of(stored) == settings
    values = (2, 5, 7, 4, 1.5, 60.0, {"gpu": "a100"}, 0, 1.0, 0.0, 2.0, 600.0, None, None)
    assert settings.given() == dict(zip(DECLARED, values, strict=True))


@pytest.mark.parametrize("idle_after", [30.0, 0, None, -1, "soon"])
def test_an_older_specs_idle_after_is_not_read(idle_after: Any) -> None:
    """A queue stored by an older version keeps ``idle_after`` in its options: the spec
    reads back and its settings are the ones it has besides."""
    spec = QueueSettings(priority=3, wait_replicas=1).spec("q").model_dump(mode="json")
    spec["options"]["queue"]["idle_after"] = idle_after
    stored = StoredSpec.model_validate(spec)
    assert QueueSettings.of(stored) == QueueSettings(priority=3, wait_replicas=1)
    shown = shown_settings(spec)
    assert "idle_after" not in shown and shown["wait_replicas"] == 1


@pytest.mark.parametrize(
    ("given", "error"),
    [
        ({"min_nodes": None}, "min_nodes must be an integer, got None"),
        ({"max_nodes": 0}, "max_nodes must be between 1 and 1000000, got 0"),
        ({"priority": True}, "priority must be an integer, got True"),
        ({"max_attempts": 1001}, "max_attempts must be between 1 and 1000, got 1001"),
        ({"job_timeout": 0}, "job_timeout must be > 0 and <= 604800, got 0"),
        ({"result_ttl": math.inf}, "result_ttl must be a finite number, got inf"),
        ({"node_selector": {"a": 1}}, "node_selector must be a dict of strings to strings"),
        ({"min_nodes": 3, "max_nodes": 2}, r"max_nodes \(2\) must be >= min_nodes \(3\)"),
    ],
)
def test_bad_settings_are_named(given: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        check_queue_settings(given)


def test_settings_are_checked_in_declared_order_and_unknown_ones_refused() -> None:
    with pytest.raises(ValueError, match=r"^min_nodes"):
        check_queue_settings({"job_timeout": -1, "min_nodes": 0})
    assert check_queue_settings({"max_nodes": None, "job_timeout": 2}) == {
        "max_nodes": None,
        "job_timeout": 2.0,
    }
    with pytest.raises(TypeError, match="unexpected keyword argument 'min_node'"):
        check_queue_settings({"min_node": 1})
    with pytest.raises(TypeError, match="unexpected keyword argument 'idle_after'"):
        check_queue_settings({"idle_after": 30.0})


def test_configure_takes_the_live_settings_with_their_types() -> None:
    from queueworks.queue.queue_settings import LIVE, LiveOptions

    assert set(LiveOptions.__annotations__) == set(LIVE)
    hints = get_type_hints(QueueSettings)
    assert get_type_hints(LiveOptions) == {name: hints[name] for name in LIVE}
    assert "min_nodes" not in LIVE and "node_selector" not in LIVE
