"""Typed job functions (``@job``) the typed-jobs tests enqueue; workers import them with
``--allow tests.handlers_typed``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from enum import Enum
from uuid import UUID

from pydantic import BaseModel

from queueworks import JobContext, job


class Color(Enum):
    RED = "red"
    BLUE = "blue"


@dataclass
class Point:
    x: int
    y: float


class Order(BaseModel):
    id: UUID
    amount: Decimal


class Everything(BaseModel):
    """One of each supported type, and what the worker saw each argument as."""

    when: datetime
    day: date
    uid: UUID
    amount: Decimal
    color: Color
    point: Point
    order: Order
    orders: list[Order]
    points: dict[str, Point]
    seen: dict[str, str]


@job
def everything(
    when: datetime,
    day: date,
    uid: UUID,
    amount: Decimal,
    color: Color,
    point: Point,
    order: Order,
    orders: list[Order],
    points: dict[str, Point],
) -> Everything:
    args = {"when": when, "day": day, "uid": uid, "amount": amount, "color": color}
    args |= {"point": point, "order": order, "orders": orders, "points": points}
    seen = {name: type(value).__name__ for name, value in args.items()}
    seen["orders[0]"] = type(orders[0]).__name__
    seen["points[a]"] = type(points["a"]).__name__
    return Everything(**args, seen=seen)


@job
def add(a: int, b: int, *, note: str = "") -> int:
    return a + b + len(note)


@job
def named(first: str, *, note: str = "none") -> str:
    return f"{first}/{note}"


@job
def who(job: JobContext, n: int) -> str:
    """Its context is its first parameter, by annotation: not the first argument sent."""
    return f"{job.job_id}:{n}"


@job
async def add_later(a: int, b: int, *, ctx: JobContext | None = None) -> int:
    await asyncio.sleep(0.01)
    return a + b if ctx is None else a + b + 1000 * ctx.attempt  # on a worker: + 1000


@job
def square(x: int) -> int:
    return x * x


@job
def wrong_return(x: int) -> int:
    return "not an int"  # type: ignore[return-value]
