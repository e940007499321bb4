"""Settings: built once in each entry point from flags and ``QUEUEWORKS_*`` variables."""

from __future__ import annotations

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from queueworks.protocol.validate import PREFIX_PATTERN

HOUR, DAY = 3600.0, 86400.0  # bounds of the intervals: finite, so a sleep never overflows


class Settings(BaseSettings):
    """Every knob of the processes. Flags override environment variables."""

    model_config = SettingsConfigDict(
        env_prefix="QUEUEWORKS_", extra="forbid", hide_input_in_errors=True, allow_inf_nan=False
    )

    redis_url: str = "redis://localhost:6379/0"
    prefix: str = Field(default="qw", pattern=rf"^{PREFIX_PATTERN}$")
    heartbeat_interval: float = Field(default=1.0, gt=0, le=HOUR)
    heartbeat_ttl: float = Field(default=3.0, gt=0, le=DAY)
    lease_ttl: float = Field(default=5.0, gt=0, le=DAY)
    reconcile_interval: float = Field(default=1.0, gt=0, le=HOUR)
    full_pass_interval: float = Field(default=0.0, ge=0, le=DAY)  # sweep round; 0: 50 ids/s
    drain_target: float = Field(default=60.0, gt=0, le=DAY)  # s: wanted workers drain by then
    wanted_interval: float = Field(default=1.0, gt=0, le=HOUR)  # s between wanted counts
    stats_interval: float = Field(default=60.0, gt=0, le=DAY)  # s between `controller_stats`
    fault_stop_before_apply: int = Field(default=0, ge=0)  # tests only: controller.main
    batch_size: int = Field(default=100, ge=1, le=10_000)
    concurrency: int = Field(default=1, ge=1, le=10_000)
    grace_period: float = Field(default=10.0, ge=0, le=DAY)
    allow_eviction: bool = False  # run on a Redis whose maxmemory-policy may evict keys
    policy_check_interval: float = Field(default=60.0, gt=0, le=DAY)  # s between two reads
    log_level: str = "info"
    # None: console when stderr is a terminal, else json (queueworks.logs.default_format)
    log_format: str | None = Field(default=None, pattern=r"^(json|console)$")
    ssl_ca_certs: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None

    @model_validator(mode="after")
    def _ttl_above_interval(self) -> Settings:
        if self.heartbeat_ttl <= self.heartbeat_interval:
            raise ValueError(
                f"heartbeat_ttl ({self.heartbeat_ttl}) must be greater than "
                f"heartbeat_interval ({self.heartbeat_interval})"
            )
        return self
