#!/usr/bin/env python3
"""A layout preview of the chart's Grafana dashboard, drawn without Grafana.

Reads charts/eopipe/dashboards/eopipe.json and draws its grid as Grafana lays it out (24
columns, `gridPos` in grid units): each row's title, each panel's title, type, unit and PromQL
queries. It is not a screenshot: no data, no Grafana. Writes docs/dashboard.svg (text kept as
text, no timestamp: the file changes only when the dashboard does).

    .venv/bin/python hack/dashboard-preview.py [--out docs/dashboard.svg]
"""

from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "charts" / "eopipe" / "dashboards" / "eopipe.json"
OUT = ROOT / "docs" / "dashboard.svg"

# Grafana's grid: 24 columns; a grid unit is 30 px high, a column of a 1920 px screen 80 px wide.
COLUMNS, UNIT_PX, COLUMN_PX = 24, 30, 80
PX_PER_INCH = 120
QUERY_PT, TITLE_PT = 7.5, 9
CHAR_PT = QUERY_PT * 0.6  # width of a monospace character
LINE_PT = QUERY_PT * 1.3
# The dashboard's usual label filters, shortened so the queries fit.
FILTERS = {'{namespace=~"$namespace", pipeline=~"$pipeline"': "{…",
           '{namespace=~"$namespace", name=~"$pipeline"': "{…"}


def panels(dashboard: dict) -> list[dict]:
    """Every panel, those of collapsed rows included."""
    out = []
    for p in dashboard["panels"]:
        out.append(p)
        out.extend(p.get("panels") or [])
    return out


def shorten(expr: str) -> str:
    expr = " ".join(expr.split())
    for long, short in FILTERS.items():
        expr = expr.replace(long + ", ", short + ", ").replace(long + "}", short + "}")
    return expr


def draw(dashboard: dict, out: Path) -> None:
    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "eopipe-dashboard", "font.size": 8})
    text = {"parse_math": False}  # PromQL and Grafana variables are full of $
    every = panels(dashboard)
    height = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in every)
    px_w, px_h = COLUMNS * COLUMN_PX, height * UNIT_PX
    header_px = 80
    fig = plt.figure(figsize=(px_w / PX_PER_INCH, (px_h + header_px) / PX_PER_INCH))
    ax = fig.add_axes((0, 0, 1, px_h / (px_h + header_px)))
    ax.set_xlim(0, px_w)
    ax.set_ylim(px_h, 0)
    ax.axis("off")
    variables = ", ".join("$" + v["name"] for v in dashboard["templating"]["list"])
    fig.text(0.01, 1 - 22 / (px_h + header_px), f"{dashboard['title']} (Grafana dashboard, uid {dashboard['uid']})",
             fontsize=13, weight="bold", va="center", **text)
    fig.text(0.01, 1 - 55 / (px_h + header_px),
             f"Layout preview drawn from charts/eopipe/dashboards/eopipe.json by hack/dashboard-preview.py, "
             f"not a Grafana screenshot: no data.\nVariables: {variables}; {{… stands for the filters "
             f'namespace=~"$namespace" and pipeline=~"$pipeline" (name=~"$pipeline" on the operator\'s series).',
             fontsize=8, va="center", color="#444444", **text)
    pt_per_px = 72 / PX_PER_INCH
    for p in every:
        g = p["gridPos"]
        x, y, w, h = g["x"] * COLUMN_PX, g["y"] * UNIT_PX, g["w"] * COLUMN_PX, g["h"] * UNIT_PX
        if p["type"] == "row":
            ax.add_patch(Rectangle((x + 2, y + 2), w - 4, h - 4, facecolor="#dde3ea", edgecolor="none"))
            ax.text(x + 10, y + h / 2, p["title"], fontsize=10, weight="bold", va="center", **text)
            continue
        ax.add_patch(Rectangle((x + 4, y + 4), w - 8, h - 8, facecolor="#f7f8fa", edgecolor="#9aa5b1", lw=0.8))
        ax.text(x + 12, y + 18, p["title"], fontsize=TITLE_PT, weight="bold", va="center", **text)
        unit = (p.get("fieldConfig") or {}).get("defaults", {}).get("unit", "")
        ax.text(x + w - 12, y + 18, f"{p['type']}{' · ' + unit if unit else ''}", fontsize=6.5, va="center",
                ha="right", color="#666666", **text)
        chars = max(10, int((w - 24) * pt_per_px / CHAR_PT))
        room = int((h - 44) * pt_per_px / LINE_PT)
        lines: list[str] = []
        for t in p.get("targets") or ():
            lines += textwrap.wrap(shorten(t["expr"]), chars, initial_indent=f"{t['refId']}: ",
                                   subsequent_indent="   ", break_long_words=True, break_on_hyphens=False)
        if len(lines) > room:
            lines = lines[:room - 1] + ["…"]
        ax.text(x + 12, y + 34, "\n".join(lines), fontsize=QUERY_PT, family="monospace", va="top",
                linespacing=1.3, color="#1f3a5f", **text)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="svg", metadata={"Date": None})
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dashboard", type=Path, default=DASHBOARD)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    draw(json.loads(args.dashboard.read_text()), args.out)
    print(f"{args.out} ({args.out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
