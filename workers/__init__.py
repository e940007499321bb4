"""The worker process: pool registration, heartbeat, notification watcher, suspend/resume,
reclaim, role-based reading, handler execution and graceful leave. Installed as
``queueworks.workers`` (kept at the repository's root). A queue job's side: ``queue_set``
reads, ``queue_loop`` runs and settles, ``flow_gate`` applies a queue's rate and group
limits; a task's side: ``member`` (the membership protocol), ``loop``, ``lockstep``. It
imports the clients' layers and below (never the controller, the dashboard or the CLI).
"""
