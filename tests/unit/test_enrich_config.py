"""``enrich:`` in a pipeline file, checked without Spark: names, the table's path
and the form of ``on``; each refusal one line naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobs.errors import ConfigError
from jobs.pipeline.model import Enrichment
from jobs.pipeline.parser import parse_pipeline

BASE: dict[str, Any] = {
    "application_id": "merchant_sales",
    "source": {"topics": ["orders"]},
    "schema": {"merchant_id": "string", "cents": "bigint", "shop": "struct<id: string>"},
    "derived": [{"name": "category", "expr": "m.category"}],
    "keys": ["category"],
    "event_time": {"field": "kafka.timestamp"},
    "aggregations": [{"name": "orders", "function": "count"}],
}
MERCHANTS = {"name": "m", "table": "${warehouse}/dims/merchants", "on": "merchant_id = m.id"}


def pipeline(*enrich: dict[str, Any], **changes: Any):  # type: ignore[no-untyped-def]
    return parse_pipeline({**BASE, "enrich": list(enrich), **changes}, "sales.yaml")


def test_an_enrichment_reads_its_table_and_key() -> None:
    found = pipeline(
        MERCHANTS, {**MERCHANTS, "name": "s", "on": "s.id = shop.id", "missing": "keep"}
    )
    assert found.enrich == (
        Enrichment("m", "${warehouse}/dims/merchants", "merchant_id", "id", "dead_letter"),
        Enrichment("s", "${warehouse}/dims/merchants", "shop.id", "id", "keep"),
    )
    assert found.enrich[0].path(Path("/w")) == "/w/dims/merchants"
    assert "enrich" in found.definition
    plain = parse_pipeline({**BASE, "derived": [], "keys": ["merchant_id"]}, "sales.yaml")
    assert "enrich" not in plain.definition  # earlier recorded definitions stay equal


def test_another_table_or_key_is_another_definition() -> None:
    one = pipeline(MERCHANTS).definition["enrich"]
    assert pipeline({**MERCHANTS, "table": "/dims/other"}).definition["enrich"] != one
    assert pipeline({**MERCHANTS, "missing": "keep"}).definition["enrich"] != one


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"name": "merchant_id"}, "enrich[0].name: 'merchant_id' must be a new identifier"),
        ({"name": "kafka"}, "enrich[0].name: 'kafka' must be a new identifier"),
        ({"name": "_m"}, "enrich[0].name: '_m' must be a new identifier"),
        ({"table": "dims/merchants"}, "enrich[0].table: must be an absolute path"),
        ({"table": "${home}/dims"}, "enrich[0].table: must be an absolute path"),
        ({"table": "${warehouse}/${x}"}, "enrich[0].table: must be an absolute path"),
        ({"table": "${warehouse}/../etc"}, "enrich[0].table: must be an absolute path"),
        ({"table": "/d/${warehouse}/x"}, "enrich[0].table: must be an absolute path"),
        ({"on": "merchant_id == m.id"}, "enrich[0].on: must be '<record field> = m.<column>'"),
        ({"on": "merchant_id = id"}, "enrich[0].on: must be '<record field> = m.<column>'"),
        ({"on": "upper(merchant_id) = m.id"}, "enrich[0].on: must be"),
        ({"on": "m.id = m.id"}, "enrich[0].on: must be"),
        ({"on": "merchant_id = m.a.b"}, "the key must be a column of the table"),
        ({"on": "category = m.id"}, "'category' is not a field of the record"),
        ({"missing": "drop"}, "enrich[0].missing: must be one of dead_letter, keep"),
        ({"extra": 1}, "enrich[0]"),
    ],
)
def test_bad_enrichments_name_the_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        pipeline({**MERCHANTS, **change})
    text = str(error.value)
    assert text.startswith("sales.yaml: ") and "\n" not in text
    assert message in text, text


def test_a_derived_column_may_not_take_an_enrichments_name() -> None:
    with pytest.raises(ConfigError, match=r"derived\[0\].name: 'm' must be a new identifier"):
        pipeline(MERCHANTS, derived=[{"name": "m", "expr": "1"}])
    with pytest.raises(ConfigError, match=r"enrich\[1\].name: 'm' must be a new identifier"):
        pipeline(MERCHANTS, MERCHANTS)


def test_on_written_by_hand_is_the_join_not_a_yaml_boolean(tmp_path: Path) -> None:
    # YAML 1.1 (PyYAML) reads a bare `on` key as True: the form the docs show.
    import yaml

    from jobs.pipeline.parser import load_pipeline

    text = """
application_id: shop_sales
source: {topics: [orders]}
schema: {merchant_id: string}
enrich:
  - {name: m, table: "${warehouse}/dims/merchants", on: "merchant_id = m.id"}
keys: [merchant_id]
event_time: {field: kafka.timestamp}
aggregations: [{name: orders, function: count}]
"""
    assert True in yaml.safe_load(text)["enrich"][0]
    path = tmp_path / "shop_sales.yaml"
    path.write_text(text)
    (enrichment,) = load_pipeline(str(path), tmp_path).enrich
    assert (enrichment.record_key, enrichment.table_key) == ("merchant_id", "id")
