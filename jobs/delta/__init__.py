"""Delta Lake tables of an application, written and read with delta-rs."""

__all__ = [
    "cdf",
    "files",
    "layout",
    "log",
    "writer",
]
