"""Queues of jobs: the job's path as the clients plan it (``queues``: enqueue, results,
settles' codecs), a queue's settings declared once (``queue_settings``) and changed live
(``configure``), its operations planned once for both clients (``queue_plans``), operator
actions on a whole queue (``queue_admin``), flow control (``flow``: rate and group limits),
periodic jobs (``schedules``, ``schedule_plans``), listings by state (``job_lists``), the
keys of unfinished jobs (``job_keys``), stops of running jobs (``job_stops``), jobs set
aside (``aside_jobs``), and a queue whose keys vanished (``vanished``). It imports ``task``
and the layers below it; never a client or a process.
"""
