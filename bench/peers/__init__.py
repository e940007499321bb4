"""queueworks side by side with RQ, Celery, Dramatiq, arq and streaq: ``python -m bench.peers.run``.

Layout: ``harness`` (the five workloads, written once against the small ``Peer`` interface),
one ``peer_<name>`` module per system (its jobs/actors and its ``Driver``), ``driver`` (the
entry point run inside each peer's own virtual environment), ``venvs`` (pinned installs),
``run`` (the one command), ``report`` (docs/peers.md) and ``chart`` (docs/peers.png).

Everything a peer's venv imports from here (``harness``, ``jobs``, ``driver``, ``peer_*``)
depends only on the standard library, redis-py and that peer's own package.
"""
