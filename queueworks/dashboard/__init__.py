"""The web dashboard (``queueworks dashboard``): pages, a JSON API and ``/metrics``.

Starlette + Jinja2, server-rendered; one small script refreshes the live parts of a page
(no CDN: every asset is served from ``static/``). See ``docs/dashboard.md``.
"""

from queueworks.dashboard.app import create_app
from queueworks.dashboard.security import BindRefused, check_bind
from queueworks.dashboard.state import DashboardConfig

__all__ = ["BindRefused", "DashboardConfig", "check_bind", "create_app"]
