"""Target tasks: submitting one (``submit``, planned once for both clients), its handle and
the plans it runs (``tasks``), jobs and tasks that wait for others (``dependencies``), and
the step contract of lockstep training (``steps``). It imports ``transport``, ``scripts``,
``protocol`` and the layers below them; never a queue, a client or a process.
"""
