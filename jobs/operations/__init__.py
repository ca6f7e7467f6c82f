"""Maintenance operations: every one restarts the application from a consistent cut
(``jobs/cut.py``) in a new epoch that fences the old one, and is audited in the ledger."""

__all__ = [
    "apply",
    "backfill",
    "maintain",
    "plan",
    "preview_plot",
    "publish",
    "restart",
    "runner",
    "saved_plans",
    "shadow",
    "targets",
    "verify",
]
