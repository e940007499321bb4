"""The commands of ``queueworks`` but the ones that start processes: one module each
(``enqueue``, ``submit``, ``info``, ``dead``, ``health``, ``dashboard_server``, ``devserver``
for ``queueworks redis``), with what they share: ``options`` (every option written one way)
and ``errors`` (an expected failure is one line and an exit code).

``queueworks.cli`` assembles them into the ``queueworks`` group, beside ``worker``,
``controller`` and ``demo``, the commands that start worker and controller processes: no
module here imports ``workers/`` or ``controller/``.
"""
