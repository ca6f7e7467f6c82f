"""Pipeline definitions: the model, the YAML parser and the checks."""

__all__ = [
    "checks",
    "model",
    "parser",
]
