"""The worker process: pool registration, heartbeat, notification watcher, suspend/resume,
reclaim, role-based reading, handler execution and graceful leave."""
