"""How commands reach Redis: connections and URLs (``connection``, ``aio_connection``), the
cluster's slots (``topology``), the hottest command pre-built as bytes (``wire``,
``aio_wire``), plans (``plans``: operations planned once, without I/O) and the runners that
do them on a sync or asyncio client (``runner``, ``aio_runner``), waiting for replicas
(``replication``), the eviction check, and the small records the processes keep (worker
pools, lost workers). It imports ``scripts``, ``protocol`` and the layers below them;
never a task, a queue or a client.
"""
