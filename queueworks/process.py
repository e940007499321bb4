"""What a long-lived queueworks process (worker, controller) does once it is set up."""

from __future__ import annotations

import gc


def freeze_heap() -> None:
    """Move every object alive now (modules, classes, settings, clients: what the process
    keeps until it exits) out of the cyclic garbage collector's sight (``gc.freeze``).

    A worker allocates a few dozen objects per job, and every so often the collector's
    oldest generation walks the whole heap: a burst of milliseconds in a process that
    otherwise runs for microseconds between waits on Redis. Frozen, the collector walks
    only what came since. Measured (2 workers and one producer on 2 cores, one call per
    job, side by side): with the workers' heaps frozen the rate was higher in 7 rounds of
    8 (median 14,000 against 9,700 jobs/s); the same with the processes pinned so that
    redis-server and the producer share a core (about 20,000 both), so what it changes is
    likely where the scheduler puts redis-server after such a burst: a job costs a
    cross-core wake-up each way when it is not beside the producer."""
    gc.collect()
    gc.freeze()
