"""The Spark side: session, the streaming query, and the per-batch commit."""

__all__ = [
    "analyser",
    "batch",
    "batch_clock",
    "changelog_files",
    "dead_letters",
    "enrichment",
    "follow",
    "judging",
    "jvm",
    "observed",
    "offset_log",
    "outage",
    "query",
    "run",
    "seed",
    "spark",
    "summary",
    "table_versions",
]
