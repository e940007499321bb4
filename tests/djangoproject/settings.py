"""Settings of the test project: Django's Tasks framework on queueworks, the Redis URL and
key prefix from the environment (``QUEUEWORKS_REDIS_URL``, ``QUEUEWORKS_PREFIX``: the
worker processes the tests start have them)."""

import os
import tempfile

import django

SECRET_KEY = "queueworks-tests-only"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = [] if django.VERSION >= (6, 0) else ["django_tasks"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        # a file (an in-memory database is never closed); the tasks only open connections
        "NAME": os.path.join(tempfile.gettempdir(), "queueworks-djangoproject.sqlite3"),
        "CONN_MAX_AGE": 0,  # as a request does: closed after each job
    }
}
TASKS = {
    "default": {
        "BACKEND": "queueworks.contrib.django.QueueworksBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {
            "redis_url": os.environ.get("QUEUEWORKS_REDIS_URL", "redis://localhost:6379/0"),
            "prefix": os.environ.get("QUEUEWORKS_PREFIX", "qw"),
            "allow": ["tests.djangoproject"],
            "queue_settings": {"max_attempts": 1},
        },
    }
}
