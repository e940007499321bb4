"""asyncio: ``AsyncClient`` and its handles on ``redis.asyncio`` (docs/asyncio.md)."""

from queueworks.aio.client import AsyncClient
from queueworks.aio.queue_handle import AsyncJob, AsyncQueue
from queueworks.aio.tasks import AsyncTask

__all__ = ["AsyncClient", "AsyncJob", "AsyncQueue", "AsyncTask"]
