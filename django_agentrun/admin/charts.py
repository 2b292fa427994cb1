"""Server-rendered SVG charts for the admin overview: no script, no CDN.

Two shapes: columns over time (stacked by series) and horizontal bars per group (one bar
per series, side by side). Each is an `<svg role="img">` with a `<title>` and a `<desc>`,
scaled to its box (`viewBox`, width 100%), every bar a link with a `<title>` (its tooltip)
and `data-series`/`data-label`/`data-value` (what the browser tier reads back); the page
shows the same numbers as a table under each chart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import count

from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

#: The width of a chart's own coordinates: columns fill a wide card, bars a half one.
COLUMNS_WIDTH = 960
BARS_WIDTH = 480
PALETTE = (
    "#2f7ed8",
    "#e8590c",
    "#868e96",
    "#c92a2a",
    "#2b8a3e",
    "#7048e8",
    "#f08c00",
    "#0b7285",
    "#a61e4d",
    "#5c940d",
    "#495057",
)
_ids = count(1)


@dataclass(frozen=True)
class Bar:
    """One bar (or one stacked piece): its group label, series, value, link and tooltip."""

    label: str
    series: str
    value: float
    url: str
    text: str


def colours(series: Sequence[str], fixed: dict[str, str] | None = None) -> dict[str, str]:
    fixed = fixed or {}
    return {s: fixed.get(s, PALETTE[i % len(PALETTE)]) for i, s in enumerate(series)}


def _num(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))


def _rect(bar: Bar, x: float, y: float, w: float, h: float, fill: str) -> str:
    return format_html(
        '<a href="{}"><rect x="{}" y="{}" width="{}" height="{}" fill="{}" '
        'data-label="{}" data-series="{}" data-value="{}"><title>{}</title></rect></a>',
        bar.url,
        _num(x),
        _num(y),
        _num(max(w, 0)),
        _num(max(h, 0)),
        fill,
        bar.label,
        bar.series,
        repr(bar.value),
        bar.text,
    )


def _frame(title: str, desc: str, width: int, height: float, body: list[str]) -> SafeString:
    n = next(_ids)
    return mark_safe(  # noqa: S308 - every piece above is escaped by format_html
        f'<svg class="agentrun-chart" viewBox="0 0 {width} {_num(height)}" role="img" '
        f'aria-labelledby="agentrun-chart-{n}-t agentrun-chart-{n}-d" '
        f'preserveAspectRatio="xMinYMin meet">'
        f'<title id="agentrun-chart-{n}-t">{escape(title)}</title>'
        f'<desc id="agentrun-chart-{n}-d">{escape(desc)}</desc>' + "".join(body) + "</svg>"
    )


def _legend(palette: dict[str, str], y: float) -> list[str]:
    parts, x = [], 0.0
    for series, fill in palette.items():
        parts.append(
            format_html(
                '<rect x="{}" y="{}" width="10" height="10" fill="{}"/>'
                '<text x="{}" y="{}" class="agentrun-chart-legend">{}</text>',
                _num(x),
                _num(y),
                fill,
                _num(x + 14),
                _num(y + 9),
                series,
            )
        )
        x += 22 + 6.5 * len(series)
    return parts


def columns(
    title: str,
    desc: str,
    groups: Sequence[tuple[str, Sequence[Bar]]],
    palette: dict[str, str],
    *,
    axis: Callable[[float], str] = _num,
) -> SafeString:
    """Stacked columns, one per group (a time bucket); a group labelled "" has no tick."""
    width = COLUMNS_WIDTH
    plot_left, plot_top, plot_h = 60.0, 24.0, 200.0
    plot_w = width - plot_left - 4
    top = max((sum(b.value for b in bars) for _g, bars in groups), default=0) or 1
    slot = plot_w / max(len(groups), 1)
    gap = min(2.0, slot * 0.15)
    body = _legend(palette, 0)
    for frac in (0, 0.5, 1):
        y = plot_top + plot_h * (1 - frac)
        body.append(
            format_html(
                '<line x1="{}" x2="{}" y1="{}" y2="{}" class="agentrun-chart-grid"/>'
                '<text x="{}" y="{}" text-anchor="end" class="agentrun-chart-axis">{}</text>',
                _num(plot_left),
                width,
                _num(y),
                _num(y),
                _num(plot_left - 4),
                _num(y + 4),
                axis(top * frac),
            )
        )
    for i, (label, bars) in enumerate(groups):
        x = plot_left + i * slot + gap / 2
        y = plot_top + plot_h
        for bar in bars:
            if bar.value <= 0:
                continue
            h = plot_h * bar.value / top
            y -= h
            body.append(_rect(bar, x, y, slot - gap, h, palette[bar.series]))
        if label:
            body.append(
                format_html(
                    '<text x="{}" y="{}" class="agentrun-chart-axis">{}</text>',
                    _num(x),
                    _num(plot_top + plot_h + 14),
                    label,
                )
            )
    return _frame(title, desc, width, plot_top + plot_h + 20, body)


def bars(
    title: str,
    desc: str,
    groups: Sequence[tuple[str, Sequence[Bar]]],
    palette: dict[str, str],
    *,
    axis: Callable[[float], str] = _num,
    top: float | None = None,
) -> SafeString:
    """Horizontal bars: a row per group, a bar per series in it, the value at its end."""
    width = BARS_WIDTH
    label_w, row_gap, bar_h = 130.0, 8.0, 13.0
    plot_w = width - label_w - 60
    top = top or max((b.value for _g, bs in groups for b in bs), default=0) or 1
    body = _legend(palette, 0) if len(palette) > 1 else []
    y = 20.0 if body else 4.0
    for label, row in groups:
        shown = label if len(label) <= 20 else label[:19] + "…"
        body.append(
            format_html(
                '<text x="{}" y="{}" text-anchor="end" class="agentrun-chart-axis">'
                "<title>{}</title>{}</text>",
                _num(label_w - 6),
                _num(y + bar_h * len(row) / 2 + 4),
                label,
                shown,
            )
        )
        for bar in row:
            w = plot_w * bar.value / top
            body.append(_rect(bar, label_w, y, w, bar_h - 1, palette[bar.series]))
            body.append(
                format_html(
                    '<text x="{}" y="{}" class="agentrun-chart-value">{}</text>',
                    _num(label_w + w + 4),
                    _num(y + bar_h - 2),
                    axis(bar.value),
                )
            )
            y += bar_h
        y += row_gap
    if not groups:
        body.append(
            format_html(
                '<text x="0" y="{}" class="agentrun-chart-axis">{}</text>',
                _num(y + 10),
                "Nothing in this window.",
            )
        )
        y += 16
    return _frame(title, desc, width, y, body)
