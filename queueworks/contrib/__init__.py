"""What sits beside queueworks rather than inside it: integrations with other frameworks
(``django``: Django's Tasks framework), the autoscaler that runs a scale command with the
wanted worker count (``autoscaler``), a private Redis-compatible server for tests and demos
(``redis_server``), and ``queueworks demo`` (``demo``). Each imports the clients and the
layers below them; none is imported by the core (only the CLI, the worker and tests import
them). RQ's bridge is ``queueworks.rq``, at the top: RQ jobs store its functions' paths.
"""
