"""The data every process agrees on: the Redis key schema (``keys``), the codecs of each
record, entry and message (``records``, ``jobrecords``, ``messages``), the validated models
(``models``), the checks on every number and name (``validate``), a job's options, priority
and retry schedule, the handler allow-list, the events stream's fields, the membership
roster, the published wanted-worker counts. No I/O: a function here may take a connection
to read with, but nothing here builds one. It imports only ``queueworks.errors`` and
``queueworks.tracing``; every other part imports it.
"""
