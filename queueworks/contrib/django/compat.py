"""Django's Tasks framework where this Django has it: ``django.tasks`` (Django 6.0 and
later) or the ``django-tasks`` backport (Django 5.2). ``TASKS`` holds the names both
spell alike, whichever was found."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

try:
    import django
except ImportError as exc:  # pragma: no cover - the extra is the way to get it
    raise ImportError(
        "queueworks.contrib.django needs Django: pip install 'queueworks[django]'"
    ) from exc


def _tasks_api() -> Any:
    # fixed module names, by version (never a name read from data)
    if django.VERSION >= (6, 0):
        from django.tasks import base, exceptions, signals, task_backends
        from django.tasks.backends import base as backends_base
        from django.utils import json

        invalid = exceptions.InvalidTask
    else:
        try:
            from django_tasks import (  # type: ignore[import-not-found,unused-ignore]
                base,
                exceptions,
                signals,
                task_backends,
            )
            from django_tasks import utils as json  # type: ignore[import-not-found,unused-ignore]
            from django_tasks.backends import (  # type: ignore[import-not-found,unused-ignore]
                base as backends_base,
            )
        except ImportError as exc:
            raise ImportError(
                "queueworks.contrib.django on Django 5.2 needs the django-tasks backport: "
                "pip install django-tasks (or 'queueworks[django]')"
            ) from exc
        invalid = exceptions.InvalidTaskError
    return SimpleNamespace(
        task_backends=task_backends,
        BaseTaskBackend=backends_base.BaseTaskBackend,
        Task=base.Task,
        TaskResult=base.TaskResult,
        TaskResultStatus=base.TaskResultStatus,
        TaskError=base.TaskError,
        TaskContext=base.TaskContext,
        InvalidTask=invalid,
        TaskResultDoesNotExist=exceptions.TaskResultDoesNotExist,
        task_enqueued=signals.task_enqueued,
        task_started=signals.task_started,
        task_finished=signals.task_finished,
        normalize_json=json.normalize_json,
    )


TASKS: Any = _tasks_api()
