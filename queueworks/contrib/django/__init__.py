"""Django and queueworks: ``QueueworksBackend`` for Django's Tasks framework (``TASKS``
setting), ``run_task`` the handler a worker runs Django tasks with (``queueworks worker
--django SETTINGS --allow myapp``). Needs Django 6, or Django 5.2 with ``django-tasks``."""

from .backend import QueueworksBackend, job_priority
from .results import HANDLER
from .worker import TaskFailed, run_task, setup_django

__all__ = ["HANDLER", "QueueworksBackend", "TaskFailed", "job_priority", "run_task", "setup_django"]
