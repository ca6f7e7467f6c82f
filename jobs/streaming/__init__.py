"""The Spark side: session, the streaming query, and the per-batch commit."""

__all__ = [
    "batch",
    "batch_watermark",
    "changelog_files",
    "dead_letters",
    "dimensions",
    "jvm",
    "observed",
    "offset_log",
    "outage",
    "query",
    "records",
    "run",
    "seed",
    "spark",
]
