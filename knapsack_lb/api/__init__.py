"""The admin API: FastAPI app factory (:func:`create_app`), metrics and the dashboard."""

from knapsack_lb.api.app import create_app

__all__ = ["create_app"]
