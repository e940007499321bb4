"""Integrations of queueworks with other frameworks, each in a subpackage that imports its
framework (``queueworks.contrib.django``: Django's Tasks framework)."""
