"""An expression's calls against Spark's registry: listed only when a call is one
the reviewed Spark's registry is not known to hold (0.7 s of a cold run's start)."""

from __future__ import annotations

import pytest

from jobs import spark_functions
from jobs.errors import ConfigError
from jobs.streaming.analyser import _check_calls


class Registry:
    """Spark's registry, as ``SHOW SYSTEM FUNCTIONS`` lists it; counts its listings."""

    def __init__(self, names: set[str]) -> None:
        self.names, self.listed = frozenset(names), 0

    def __call__(self) -> frozenset[str]:
        self.listed += 1
        return self.names


def test_calls_the_reviewed_spark_holds_need_no_listing() -> None:
    registry = Registry({"upper", "concat"})
    _check_calls("derived (x)", "upper(concat(a, b))", spark_functions.IN_REGISTRY, registry)
    assert registry.listed == 0


def test_a_call_outside_the_review_is_looked_up_and_refused_if_spark_lacks_it() -> None:
    registry = Registry({"upper"})
    with pytest.raises(ConfigError, match="calls my_udf, not a Spark built-in function"):
        _check_calls("derived (x)", "upper(my_udf(a))", spark_functions.IN_REGISTRY, registry)
    assert registry.listed == 1


def test_another_spark_lists_its_registry_for_every_call() -> None:
    registry = Registry(set())  # e.g. a Spark that dropped the function
    with pytest.raises(ConfigError, match="calls upper, not a Spark built-in function"):
        _check_calls("derived (x)", "upper(a)", None, registry)
    assert registry.listed == 1
