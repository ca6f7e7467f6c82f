"""A picture of the Grafana dashboard without a Grafana server (none installs here):
the dashboard JSON's own panels, grid and queries, run against a real Prometheus
and drawn as SVG, then photographed by headless Chromium.

    .venv/bin/python -m include.dashboard_preview --prometheus http://127.0.0.1:9090 \\
        --minutes 10 --out docs/images/grafana-dashboard.png

It reads ``include/monitoring/grafana/dashboards/platform.json``: panel titles,
``gridPos`` (24 columns), targets' ``expr`` and ``legendFormat``, and the unit.
Grafana's variables are given the values Grafana would use: ``$application`` all
applications, ``$__rate_interval`` four scrape intervals. It is a preview of what
the queries return, not Grafana's rendering.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.settings import REPO_ROOT

DASHBOARD = REPO_ROOT / "include" / "monitoring" / "grafana" / "dashboards" / "platform.json"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
COLUMN_PX, ROW_PX = 60, 34  # one grid column, one grid row
COLORS = ["#73bf69", "#f2cc0c", "#5794f2", "#ff780a", "#b877d9", "#f2495c", "#8ab8ff"]
UNITS = {"reqps": "/s", "s": " s", "short": ""}


@dataclass
class Series:
    label: str
    points: list[tuple[float, float]]  # (unix seconds, value)


@dataclass
class Panel:
    title: str
    grid: dict[str, int]
    unit: str
    series: list[Series]


def variables(expr: str, rate_interval: str) -> str:
    return expr.replace("$application", ".*").replace("$__rate_interval", rate_interval)


def legend(template: str, labels: dict[str, str]) -> str:
    if not template:
        return ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "value"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template).strip()


def query_range(prometheus: str, expr: str, start: float, end: float, step: float) -> Any:
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{prometheus}/api/v1/query_range?{params}", timeout=30) as reply:
        data = json.loads(reply.read())
    if data.get("status") != "success":
        raise RuntimeError(f"Prometheus refused {expr!r}: {data}")
    return data["data"]["result"]


def panels(
    prometheus: str,
    start: float,
    end: float,
    step: float = 2.0,
    rate_interval: str = "15s",
    dashboard: Path = DASHBOARD,
) -> list[Panel]:
    """Every panel of the dashboard with the series its queries return."""
    found = []
    for spec in json.loads(dashboard.read_text())["panels"]:
        series = []
        for target in spec.get("targets", []):
            expr = variables(target["expr"], rate_interval)
            for result in query_range(prometheus, expr, start, end, step):
                points = [
                    (float(t), float(v))
                    for t, v in result["values"]
                    if v not in ("NaN", "+Inf", "-Inf")
                ]
                if points:
                    series.append(
                        Series(legend(target.get("legendFormat", ""), result["metric"]), points)
                    )
        unit = spec.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        found.append(Panel(spec["title"], spec["gridPos"], unit, series))
    return found


def _number(value: float, unit: str) -> str:
    text = f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return text + UNITS.get(unit, "")


def _chart(panel: Panel, width: int, height: int, start: float, end: float) -> str:
    left, right, top, bottom = 56, 10, 8, 22
    plot_w, plot_h = width - left - right, height - top - bottom
    values = [v for s in panel.series for _t, v in s.points]
    low, high = (min(values + [0.0]), max(values + [0.0])) if values else (0.0, 1.0)
    if high == low:
        high = low + 1.0
    span = max(end - start, 1.0)

    def xy(t: float, v: float) -> str:
        x = left + (t - start) / span * plot_w
        y = top + (1 - (v - low) / (high - low)) * plot_h
        return f"{x:.1f},{y:.1f}"

    parts = [f'<svg width="{width}" height="{height}">']
    for i in range(5):
        y = top + i * plot_h / 4
        value = high - i * (high - low) / 4
        parts.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" class="grid"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" class="axis" text-anchor="end">'
            f"{html.escape(_number(value, panel.unit))}</text>"
        )
    for when, anchor, x in (
        (start, "start", left),
        ((start + end) / 2, "middle", left + plot_w / 2),
        (end, "end", width - right),
    ):
        label = time.strftime("%H:%M:%S", time.gmtime(when))
        parts.append(
            f'<text x="{x:.1f}" y="{height - 6}" class="axis" text-anchor="{anchor}">{label}</text>'
        )
    for i, series in enumerate(panel.series):
        color = COLORS[i % len(COLORS)]
        path = " ".join(xy(t, v) for t, v in series.points)
        parts.append(f'<polyline points="{path}" stroke="{color}" class="line"/>')
        if len(series.points) < 3:  # a line of one point is invisible
            for when, value in series.points:
                cx, cy = xy(when, value).split(",")
                parts.append(f'<circle cx="{cx}" cy="{cy}" r="2.5" fill="{color}"/>')
    if not panel.series:
        parts.append(
            f'<text x="{width / 2}" y="{height / 2}" class="empty" '
            'text-anchor="middle">No data</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def page(found: list[Panel], start: float, end: float, title: str) -> str:
    boxes = []
    for panel in found:
        g = panel.grid
        width, height = g["w"] * COLUMN_PX - 8, g["h"] * ROW_PX - 8
        legend_items = "".join(
            f'<span><i style="background:{COLORS[i % len(COLORS)]}"></i>'
            f"{html.escape(s.label)}</span>"
            for i, s in enumerate(panel.series)
        )
        chart = _chart(panel, width - 16, height - 62, start, end)
        boxes.append(
            f'<div class="panel" style="left:{g["x"] * COLUMN_PX}px;top:{g["y"] * ROW_PX}px;'
            f'width:{width}px;height:{height}px"><h2>{html.escape(panel.title)}</h2>'
            f'{chart}<div class="legend">{legend_items}</div></div>'
        )
    rows = max(p.grid["y"] + p.grid["h"] for p in found)
    span = (
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(start))} to "
        f"{time.strftime('%H:%M:%S', time.gmtime(end))} UTC"
    )
    return f"""<!doctype html><html><head><meta charset="utf-8"><style>
body {{ margin: 0; background: #111217; color: #ccccdc; font: 12px sans-serif; }}
header {{ padding: 10px 14px; font-size: 16px; border-bottom: 1px solid #2c2d33; }}
header small {{ color: #8e8e99; font-size: 12px; margin-left: 12px; }}
main {{ position: relative; margin: 10px; height: {rows * ROW_PX}px; }}
.panel {{ position: absolute; background: #181b1f; border: 1px solid #2c2d33;
  border-radius: 3px; padding: 6px 8px; box-sizing: border-box; }}
h2 {{ margin: 0 0 4px; font-size: 13px; font-weight: 500; color: #d8d9da; }}
.grid {{ stroke: #2c2d33; }} .axis {{ fill: #8e8e99; font-size: 10px; }}
.line {{ fill: none; stroke-width: 1.6; }} .empty {{ fill: #8e8e99; font-size: 13px; }}
.legend span {{ margin-right: 12px; white-space: nowrap; }}
.legend i {{ display: inline-block; width: 12px; height: 3px; margin: 0 4px 3px 0; }}
</style></head><body><header>{html.escape(title)}<small>{span}; application: All;
preview of the dashboard's queries (include/dashboard_preview.py)</small></header>
<main>{"".join(boxes)}</main></body></html>"""


def screenshot(document: str, out: Path, width: int = 24 * COLUMN_PX + 20) -> None:
    from playwright.sync_api import sync_playwright

    out.parent.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            view = browser.new_page(viewport={"width": width, "height": 800})
            view.set_content(document)
            view.screenshot(path=str(out), full_page=True)
        finally:
            browser.close()


def preview(prometheus: str, start: float, end: float, out: Path) -> list[Panel]:
    found = panels(prometheus, start, end, step=max(1.0, (end - start) / 300))
    # From the first sample on: the range before it (a process starting) is empty.
    first = [s.points[0][0] for p in found for s in p.series]
    if first:
        start = max(start, min(first) - 2.0)
    title = json.loads(DASHBOARD.read_text())["title"]
    screenshot(page(found, start, end, title), out)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prometheus", default="http://127.0.0.1:9090")
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "dashboard.png")
    args = parser.parse_args()
    end = time.time()
    found = preview(args.prometheus, end - args.minutes * 60, end, args.out)
    empty = [p.title for p in found if not p.series]
    print(f"{args.out}: {len(found)} panels" + (f"; no data: {empty}" if empty else ""))


if __name__ == "__main__":
    main()
