"""The page's three SVG charts, drawn from the data :mod:`.page_data` collected: queue wait per channel over
time (p50 and p95, log scale, with the starvation threshold), each channel's share of the jobs per window, and
Jain's fairness index per window with the windows that had starvation incidents shaded. Each mark carries its
unrounded value in ``data-value`` (and ``data-series``, ``data-channel``, ``data-window``)."""

from __future__ import annotations

import math
from html import escape
from typing import Any

from fairqueue.durations import readable
from fairqueue.spark.report.formatting import attr, fmt_rate, fmt_throughput, fmt_time, iso
from fairqueue.spark.report.params import from_micros

# Tableau 10 without its grey, which marks "other"
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")
OTHER_COLOR = "#a5a5a5"
BAD = "#c0392b"

WIDTH, HEIGHT = 960, 300
LEFT, RIGHT, TOP, BOTTOM = 72, 24, 28, 34

_TIME_STEPS = (60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 2 * 86400, 7 * 86400, 14 * 86400)
_LOG_TICKS = (
    1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0, 60.0, 600.0, 3600.0, 6 * 3600.0, 86400.0, 7 * 86400.0, 30 * 86400.0
)  # fmt: skip


class _Frame:
    """The plot area of one chart: time on x (Unix microseconds), a value on y."""

    def __init__(self, x0: int, x1: int, height: int = HEIGHT) -> None:
        self.x0, self.x1 = x0, max(x1, x0 + 1)
        self.height = height
        self.plot_w = WIDTH - LEFT - RIGHT
        self.plot_h = height - TOP - BOTTOM

    def x(self, micros: float) -> float:
        return LEFT + (micros - self.x0) / (self.x1 - self.x0) * self.plot_w

    def open(self, label: str, window_us: int) -> list[str]:
        """The chart's ``<svg>``; ``data-window-seconds`` is the length of its windows (the report's window or,
        with many windows, a multiple of it used by the charts only)."""
        return [
            f'<svg viewBox="0 0 {WIDTH} {self.height}" role="img" aria-label="{escape(label, quote=True)}" '
            f'data-window-seconds="{attr(window_us / 1e6)}" xmlns="http://www.w3.org/2000/svg">'
        ]

    def time_axis(self) -> list[str]:
        span = (self.x1 - self.x0) / 1e6
        step = next((s for s in _TIME_STEPS if span / s <= 8), None)
        if step is None:
            step = 30 * 86400 * max(1, math.ceil(span / (8 * 30 * 86400)))
        step_us = step * 1_000_000
        first = -(-self.x0 // step_us) * step_us
        base = TOP + self.plot_h
        out = [f'<line class="axis" x1="{LEFT}" y1="{base}" x2="{LEFT + self.plot_w}" y2="{base}"/>']
        for tick in range(first, self.x1 + 1, step_us):
            when = from_micros(tick)
            if step >= 86400 or (when.hour == 0 and when.minute == 0):
                label = when.strftime("%b %d")
            else:
                label = when.strftime("%H:%M")
            x = self.x(tick)
            out.append(f'<line class="tick" x1="{x:.1f}" y1="{base}" x2="{x:.1f}" y2="{base + 5}"/>')
            out.append(f'<text class="xlabel" x="{x:.1f}" y="{base + 18}">{label}</text>')
        out.append(f'<text class="unit" x="{LEFT + self.plot_w}" y="{self.height - 2}">time (UTC)</text>')
        return out

    def y_grid(self, ticks: list[tuple[float, str]], unit: str) -> list[str]:
        out = []
        for y, label in ticks:
            out.append(f'<line class="grid" x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + self.plot_w}" y2="{y:.1f}"/>')
            out.append(f'<text class="ylabel" x="{LEFT - 8}" y="{y + 4:.1f}">{escape(label)}</text>')
        out.append(f'<text class="yunit" x="{LEFT}" y="{TOP - 12}">{escape(unit)}</text>')
        return out


def _path(points: list[tuple[float, float] | None]) -> str:
    """An SVG path through the points, broken where a point is missing."""
    parts: list[str] = []
    pen_down = False
    for point in points:
        if point is None:
            pen_down = False
            continue
        parts.append(f"{'L' if pen_down else 'M'}{point[0]:.1f},{point[1]:.1f}")
        pen_down = True
    return " ".join(parts)


class Groups:
    """The channels the charts name, their colours and labels (None is "other")."""

    def __init__(self, groups: list[str | None], other_channels: int) -> None:
        self.order = groups
        self.color = {g: (PALETTE[i % len(PALETTE)] if g is not None else OTHER_COLOR) for i, g in enumerate(groups)}
        self.other_channels = other_channels

    def label(self, group: str | None) -> str:
        if group is not None:
            return group
        return f"other ({self.other_channels} channel{'' if self.other_channels == 1 else 's'})"

    def attrs(self, group: str | None) -> str:
        return 'data-other="true"' if group is None else f'data-channel="{attr(group)}"'

    def legend(self, extra: str = "") -> str:
        items = "".join(
            f'<li><span class="swatch" style="background:{self.color[g]}"></span>{escape(self.label(g))}</li>'
            for g in self.order
        )
        return f'<ul class="legend">{items}{extra}</ul>'


def wait_chart(page: dict[str, Any], groups: Groups) -> str:
    axis: list[int] = page["axis_us"]
    cw = int(page["chart_window_us"])
    frame = _Frame(axis[0], axis[-1] + cw)
    rows = {(r["chart_us"], r["grp"]): r for r in page["chart"]}
    threshold = float(page["threshold_seconds"])
    values = [float(r[k]) for r in page["chart"] for k in ("wait_p50_s", "wait_p95_s") if r[k] is not None and r[k] > 0]
    lo = min([*values, threshold])
    hi = max([*values, threshold])
    # the axis ends on labelled ticks: the nearest one at or below the least value, at or above the most
    a = math.log10(max([t for t in _LOG_TICKS if t <= lo], default=10.0 ** math.floor(math.log10(lo))))
    b = math.log10(min([t for t in _LOG_TICKS if t >= hi], default=10.0 ** math.ceil(math.log10(hi))))
    if b - a < 1:
        b = a + 1

    def y(value: float) -> float:
        v = max(float(value), 10.0**a)
        return TOP + (1 - (math.log10(v) - a) / (b - a)) * frame.plot_h

    ticks = [(y(t), readable(t)) for t in _LOG_TICKS if 10.0**a * 0.999 <= t <= 10.0**b * 1.001]
    out = frame.open("queue wait per channel over time", cw)
    out += frame.y_grid(ticks, "queue wait (log scale)")
    out += frame.time_axis()
    ty = y(threshold)
    out.append(f'<line class="threshold" x1="{LEFT}" y1="{ty:.1f}" x2="{LEFT + frame.plot_w}" y2="{ty:.1f}"/>')
    out.append(
        f'<text class="threshold-label" x="{LEFT + frame.plot_w - 4}" y="{ty - 5:.1f}">starvation threshold '
        f"{readable(threshold)}</text>"
    )
    radius = 3 if len(axis) <= 60 else 2 if len(axis) <= 120 else 1.2
    for series, dash in (("wait_p95_s", ' stroke-dasharray="6 4"'), ("wait_p50_s", "")):
        for group in reversed(groups.order):
            color = groups.color[group]
            points: list[tuple[float, float] | None] = []
            dots: list[str] = []
            for start in axis:
                row = rows.get((start, group))
                if row is None or row[series] is None:
                    points.append(None)
                    continue
                value = row[series]
                point = (frame.x(start + cw / 2), y(value))
                points.append(point)
                fill = color if series == "wait_p50_s" else "#fff"
                tip = (
                    f"{groups.label(group)} · {fmt_time(from_micros(start))}\n"
                    f"queue wait {'p50' if series == 'wait_p50_s' else 'p95'}: {readable(value)}"
                    f" ({row['started']} started)"
                )
                dots.append(
                    f'<circle cx="{point[0]:.1f}" cy="{point[1]:.1f}" r="{radius}" fill="{fill}" stroke="{color}" '
                    f'data-series="{series}" {groups.attrs(group)} data-window="{iso(start)}" '
                    f'data-value="{attr(float(value))}"><title>{escape(tip)}</title></circle>'
                )
            width = 2.2 if series == "wait_p50_s" else 1.4
            out.append(
                f'<path d="{_path(points)}" fill="none" stroke="{color}" stroke-width="{width}"{dash} '
                'stroke-linejoin="round"/>'
            )
            out += dots
    out.append("</svg>")
    keys = (
        '<li class="key"><svg width="28" height="10"><line x1="0" y1="5" x2="28" y2="5" stroke="#333" '
        'stroke-width="2.2"/></svg>p50</li>'
        '<li class="key"><svg width="28" height="10"><line x1="0" y1="5" x2="28" y2="5" stroke="#333" '
        'stroke-width="1.4" stroke-dasharray="6 4"/></svg>p95</li>'
        f'<li class="key"><svg width="28" height="10"><line x1="0" y1="5" x2="28" y2="5" stroke="{BAD}" '
        'stroke-width="1.4" stroke-dasharray="2 3"/></svg>starvation threshold</li>'
    )
    return "".join(out) + groups.legend(keys)


def share_chart(page: dict[str, Any], groups: Groups) -> str:
    axis: list[int] = page["axis_us"]
    cw = int(page["chart_window_us"])
    frame = _Frame(axis[0], axis[-1] + cw, height=260)
    rows = {(r["chart_us"], r["grp"]): r for r in page["chart"]}

    def y(share: float) -> float:
        return TOP + (1 - share) * frame.plot_h

    out = frame.open("share of throughput per channel per window", cw)
    out += frame.y_grid([(y(s / 4), f"{s * 25}%") for s in range(5)], "share of jobs finished")
    out += frame.time_axis()
    for start in axis:
        x0, x1 = frame.x(start), frame.x(start + cw)
        gap = 1.0 if x1 - x0 > 4 else 0.0
        level = 0.0
        for group in groups.order:
            row = rows.get((start, group))
            if row is None or not row["share_of_jobs"]:
                continue
            share = float(row["share_of_jobs"])
            tip = (
                f"{fmt_time(from_micros(start))}\n{groups.label(group)}: {fmt_rate(share)} of the jobs "
                f"({row['jobs']} jobs, {fmt_throughput(row['throughput_per_s'])})"
            )
            out.append(
                f'<rect x="{x0 + gap / 2:.2f}" y="{y(level + share):.2f}" width="{max(0.5, x1 - x0 - gap):.2f}" '
                f'height="{share * frame.plot_h:.2f}" fill="{groups.color[group]}" data-series="share_of_jobs" '
                f'{groups.attrs(group)} data-window="{iso(start)}" data-value="{attr(share)}" '
                f'data-jobs="{row["jobs"]}"><title>{escape(tip)}</title></rect>'
            )
            level += share
    out.append("</svg>")
    return "".join(out) + groups.legend()


def fairness_chart(page: dict[str, Any]) -> str:
    axis: list[int] = page["axis_us"]
    cw = int(page["chart_window_us"])
    frame = _Frame(axis[0], axis[-1] + cw, height=240)
    rows = {r["chart_us"]: r for r in page["fairness"]}

    def y(value: float) -> float:
        return TOP + (1 - value) * frame.plot_h

    out = frame.open("Jain's fairness index per window", cw)
    for start in axis:  # shade windows with starvation incidents first, behind everything
        row = rows.get(start)
        if row is not None and row["starvation_incidents"]:
            x0, x1 = frame.x(start), frame.x(start + cw)
            tip = f"{fmt_time(from_micros(start))}: {row['starvation_incidents']} starvation incident(s)"
            out.append(
                f'<rect class="starved" x="{x0:.2f}" y="{TOP}" width="{max(0.5, x1 - x0):.2f}" '
                f'height="{frame.plot_h}" data-window="{iso(start)}" '
                f'data-incidents="{row["starvation_incidents"]}"><title>{escape(tip)}</title></rect>'
            )
    out += frame.y_grid([(y(v / 4), f"{v / 4:.2f}") for v in range(5)], "Jain's index")
    out += frame.time_axis()
    points: list[tuple[float, float] | None] = []
    dots = []
    radius = 3 if len(axis) <= 60 else 2 if len(axis) <= 120 else 1.2
    for start in axis:
        row = rows.get(start)
        if row is None or row["jain_index"] is None:
            points.append(None)
            continue
        value = row["jain_index"]
        point = (frame.x(start + cw / 2), y(float(value)))
        points.append(point)
        top = row["top_channel"]
        tip = (
            f"{fmt_time(from_micros(start))}\nJain's index {float(value):.3f} across {row['backlogged_channels']} "
            f"backlogged channel(s) of {row['active_channels']}; busiest: {top} ({fmt_rate(row['top_share'])} of "
            "the jobs)"
        )
        dots.append(
            f'<circle cx="{point[0]:.1f}" cy="{point[1]:.1f}" r="{radius}" fill="#1f3b57" data-series="jain_index" '
            f'data-window="{iso(start)}" data-value="{attr(float(value))}" '
            f'data-active-channels="{row["active_channels"]}" data-backlogged-channels="{row["backlogged_channels"]}">'
            f"<title>{escape(tip)}</title></circle>"
        )
    out.append(f'<path d="{_path(points)}" fill="none" stroke="#1f3b57" stroke-width="2" stroke-linejoin="round"/>')
    out += dots
    out.append("</svg>")
    legend = (
        '<ul class="legend"><li><span class="swatch" style="background:#1f3b57"></span>Jain\'s index of the '
        "backlogged channels' throughput (1 = equal service; 1/n = one of n got everything)</li>"
        '<li><span class="swatch starved-swatch"></span>window with starvation incidents</li></ul>'
    )
    return "".join(out) + legend
