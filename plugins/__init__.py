"""Airflow plugins of mop_airflow (installed as mop_airflow.plugins): the results page.

Registered through the ``airflow.plugins`` entry point. Every Airflow process loads plugins, so
this module stays light: the FastAPI app (and Airflow's API-server modules it needs) is built only
when the API server asks for ``fastapi_apps``.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/mop"
RUN_VIEW_ROUTE = "mop-results"  # the run's tab: /dags/<dag_id>/runs/<run_id>/plugin/mop-results


class MopResultsPlugin(AirflowPlugin):
    """A results tab on every DAG run (leaderboard, learning curves, hop timeline, plan, downloads)
    and a "MOP runs" page in the Browse menu, served by a FastAPI app under ``/mop``."""

    name = "mop_airflow"
    # hrefs are relative: the Airflow UI resolves them against its base URL (a <base> element)
    external_views = [
        {"name": "MOP results", "href": "mop/runs/{DAG_ID}/{RUN_ID}", "destination": "dag_run",
         "url_route": RUN_VIEW_ROUTE},
        {"name": "MOP runs", "href": "mop/", "destination": "nav", "category": "browse", "url_route": "mop-runs"},
    ]

    @cached_property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]
        from mop_airflow.plugins.results_app import create_app  # noqa: PLC0415 - API server only

        return [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "mop_airflow results"}]
