"""The handles a program holds, sync and asyncio side by side, name for name: ``Client``
(``sync``) and ``AsyncClient`` (``aio``), ``Queue``/``Job`` (``queue_handle``) and
``AsyncQueue``/``AsyncJob`` (``aio_queue_handle``), ``AsyncTask`` (``aio_tasks``; the sync
``Task`` is ``queueworks.task.tasks``), the asyncio result watcher (``aio_results``), what
both clients read and write themselves (``client_plans``), and operator actions
(``admin``). Each runs the plans of ``queue``, ``task`` and ``transport``; it imports those
and the layers below them, never a worker, the controller or the CLI.
"""
