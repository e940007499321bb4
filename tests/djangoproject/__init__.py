"""A small Django project for tests/test_django.py: settings, and tasks its workers run."""
