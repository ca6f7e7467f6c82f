"""The backfill preview as a picture: the top changed keys before -> after, and
how the differences are spread (a histogram of after - before per aggregation).

A reviewer sees at a glance whether a fix moves a few keys a lot or every key a
little. Drawn with matplotlib's Agg backend (no display needed on a worker).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from jobs.operations.plan import Plan

MAX_HISTOGRAMS = 3
MAX_LABEL = 28


def _label(sample: dict[str, Any]) -> str:
    text = ", ".join(str(v) for k, v in sample.items() if k not in ("before", "after"))
    return text if len(text) <= MAX_LABEL else text[: MAX_LABEL - 1] + "…"


def _value(values: dict[str, Any], name: str) -> float:
    found = values.get(name)
    return float(found) if isinstance(found, int | float) and not isinstance(found, bool) else 0.0


def write_plot(plan: Plan, report: dict[str, Any], path: Path) -> Path:
    """Write the preview's PNG to ``path`` (whole or absent) and return it."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    histograms = list(report.get("differences", {}).items())[:MAX_HISTOGRAMS]
    samples = report.get("samples", [])
    first = next(iter(report.get("totals", {})), "value")
    panels = 1 + max(1, len(histograms))
    figure, axes = pyplot.subplots(1, panels, figsize=(4.6 * panels, 4.2), squeeze=False)
    figure.suptitle(
        f"backfill of {plan.application_id}: {report['keys_changed']} changed, "
        f"{report['keys_added']} added, {report['keys_removed']} removed "
        f"({report['rows_before']} -> {report['rows_after']} rows)",
        fontsize=11,
    )
    top = axes[0][0]
    if samples:
        labels = [_label(s) for s in samples][::-1]
        rows = range(len(labels))
        before = [_value(s["before"], first) for s in samples][::-1]
        after = [_value(s["after"], first) for s in samples][::-1]
        top.barh([r + 0.2 for r in rows], before, height=0.4, label="before", color="#9aa5b1")
        top.barh([r - 0.2 for r in rows], after, height=0.4, label="after", color="#1f77b4")
        top.set_yticks(list(rows), labels, fontsize=8)
        top.legend(fontsize=8)
    else:
        top.text(0.5, 0.5, "no key changes", ha="center", va="center")
    top.set_title(f"top changed keys: {first}", fontsize=10)
    for axis, (name, hist) in zip(axes[0][1:], histograms, strict=False):
        edges, counts = hist["edges"], hist["counts"]
        widths = [b - a for a, b in itertools.pairwise(edges)]
        axis.bar(edges[:-1], counts, width=widths, align="edge", color="#ff7f0e")
        axis.set_title(f"{name}: after - before, per changed key", fontsize=10)
        axis.set_ylabel("keys", fontsize=8)
    if not histograms:
        axes[0][1].text(0.5, 0.5, "no differences", ha="center", va="center")
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=90)  # a landing: it reaches the warehouse whole
    pyplot.close(figure)
    return path
