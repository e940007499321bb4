"""Django's Tasks framework where this Django has it: ``django.tasks`` (Django 6.0 and
later) or the ``django-tasks`` backport (Django 5.2). ``TASKS`` holds the names both
spell alike, whichever was found."""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any

try:
    import django
except ImportError as exc:  # pragma: no cover - the extra is the way to get it
    raise ImportError(
        "queueworks.contrib.django needs Django: pip install 'queueworks[django]'"
    ) from exc


def _tasks_api() -> Any:
    if django.VERSION >= (6, 0):
        base = importlib.import_module("django.tasks")
        names = {
            "exceptions": "django.tasks.exceptions",
            "backends": "django.tasks.backends.base",
            "signals": "django.tasks.signals",
            "json": "django.utils.json",
        }
        invalid = "InvalidTask"
    else:
        try:
            base = importlib.import_module("django_tasks")
        except ImportError as exc:
            raise ImportError(
                "queueworks.contrib.django on Django 5.2 needs the django-tasks backport: "
                "pip install django-tasks (or 'queueworks[django]')"
            ) from exc
        names = {
            "exceptions": "django_tasks.exceptions",
            "backends": "django_tasks.backends.base",
            "signals": "django_tasks.signals",
            "json": "django_tasks.utils",
        }
        invalid = "InvalidTaskError"
    mods = {k: importlib.import_module(v) for k, v in names.items()}
    core = importlib.import_module(base.__name__ + ".base")
    return SimpleNamespace(
        task_backends=base.task_backends,
        BaseTaskBackend=mods["backends"].BaseTaskBackend,
        Task=core.Task,
        TaskResult=core.TaskResult,
        TaskResultStatus=core.TaskResultStatus,
        TaskError=core.TaskError,
        TaskContext=core.TaskContext,
        InvalidTask=getattr(mods["exceptions"], invalid),
        TaskResultDoesNotExist=mods["exceptions"].TaskResultDoesNotExist,
        task_enqueued=mods["signals"].task_enqueued,
        task_started=mods["signals"].task_started,
        task_finished=mods["signals"].task_finished,
        normalize_json=mods["json"].normalize_json,
    )


TASKS: Any = _tasks_api()
