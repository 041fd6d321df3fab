"""The page of ``fairqueue report``: one self-contained HTML file (inline CSS and SVG, no script, no font
or stylesheet from elsewhere) rendered from the plain Python data of :mod:`.page_data`, so it needs no Spark to
test. The charts are :mod:`.charts`'; this module holds the headline figures, the findings, the tables and
the page around them.

Every figure shown also sits, unrounded, in a ``data-value`` attribute next to what it describes
(``data-kpi``: a ``summary`` name; ``data-col``: a column of the row named around it by ``data-channel``,
``data-kind``, ``data-window`` or ``data-job-id``; ``data-keyed-channel``: a channel's row of the fairness
across its fair keys, aggregated from key_fairness_windows and key_starvation; ``data-series``: a chart mark),
for tools and tests. The
headline, the findings and the tables show the report's own figures; only the charts may use longer windows.
Names (channels, kinds) are escaped everywhere: they are whatever producers chose.
"""

from __future__ import annotations

from html import escape
from typing import Any

from fairqueue.durations import readable
from fairqueue.spark.report.charts import OTHER_COLOR, Groups, fairness_chart, share_chart, wait_chart
from fairqueue.spark.report.formatting import attr, fmt_number, fmt_rate, fmt_throughput, fmt_time, iso
from fairqueue.spark.report.params import from_micros

# -- tables ---------------------------------------------------------------------------------------------


def _cell(column: str, value: Any, text: str, *, bad: bool = False) -> str:
    cls = ' class="bad"' if bad else ""
    return f'<td data-col="{column}" data-value="{attr(value)}"{cls}>{escape(text)}</td>'


def _name_cell(name: str, color: str | None) -> str:
    swatch = f'<span class="swatch" style="background:{color}"></span>' if color else ""
    return f'<td class="name" title="{escape(name, quote=True)}">{swatch}{escape(name)}</td>'


def _channels_table(page: dict[str, Any], groups: Groups) -> str:
    threshold = float(page["threshold_seconds"])
    head = (
        "<tr><th>Channel</th><th>Jobs</th><th>Share</th><th>Throughput</th><th>Wait p50</th><th>Wait p95</th>"
        "<th>Wait p99</th><th>Longest wait</th><th>Run p50</th><th>Run p95</th><th>Failure rate</th>"
        "<th>Retry rate</th><th>Starvation incidents</th></tr>"
    )
    body = []
    for r in page["channels"]:
        name = r["channel"]
        color = groups.color.get(name, OTHER_COLOR)
        cells = [
            _name_cell(name, color),
            _cell("jobs", r["jobs"], fmt_number(r["jobs"])),
            _cell("share_of_jobs", r["share_of_jobs"], fmt_rate(r["share_of_jobs"])),
            _cell("throughput_per_s", r["throughput_per_s"], fmt_throughput(r["throughput_per_s"])),
        ]
        for col in ("wait_p50_s", "wait_p95_s", "wait_p99_s", "wait_max_s"):
            value = r[col]
            cells.append(_cell(col, value, readable(value), bad=value is not None and value > threshold))
        cells += [
            _cell("run_p50_s", r["run_p50_s"], readable(r["run_p50_s"])),
            _cell("run_p95_s", r["run_p95_s"], readable(r["run_p95_s"])),
            _cell("failure_rate", r["failure_rate"], fmt_rate(r["failure_rate"]), bad=(r["failure_rate"] or 0) > 0.05),
            _cell("retry_rate", r["retry_rate"], fmt_rate(r["retry_rate"]), bad=(r["retry_rate"] or 0) > 0.1),
            _cell(
                "starvation_incidents",
                r["starvation_incidents"],
                fmt_number(r["starvation_incidents"]),
                bad=r["starvation_incidents"] > 0,
            ),
        ]
        body.append(f'<tr data-channel="{attr(name)}">{"".join(cells)}</tr>')
    return f'<table id="channels"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table>'


def _kinds_table(page: dict[str, Any]) -> str:
    head = (
        "<tr><th>Kind</th><th>Jobs</th><th>Share</th><th>Wait p95</th><th>Run p50</th><th>Run p95</th>"
        "<th>Failure rate</th><th>Retry rate</th></tr>"
    )
    body = []
    for r in page["kinds"]:
        cells = [
            _name_cell(r["kind"], None),
            _cell("jobs", r["jobs"], fmt_number(r["jobs"])),
            _cell("share_of_jobs", r["share_of_jobs"], fmt_rate(r["share_of_jobs"])),
            _cell("wait_p95_s", r["wait_p95_s"], readable(r["wait_p95_s"])),
            _cell("run_p50_s", r["run_p50_s"], readable(r["run_p50_s"])),
            _cell("run_p95_s", r["run_p95_s"], readable(r["run_p95_s"])),
            _cell("failure_rate", r["failure_rate"], fmt_rate(r["failure_rate"]), bad=(r["failure_rate"] or 0) > 0.05),
            _cell("retry_rate", r["retry_rate"], fmt_rate(r["retry_rate"]), bad=(r["retry_rate"] or 0) > 0.1),
        ]
        body.append(f'<tr data-kind="{attr(r["kind"])}">{"".join(cells)}</tr>')
    return f'<table id="kinds"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table>'


def _starvation_table(page: dict[str, Any], groups: Groups) -> str:
    head = (
        '<tr><th>Waited at the head</th><th class="l">Channel</th><th>Job</th><th>Attempt</th><th class="l">Kind</th>'
        "<th>Head since</th><th>Started</th><th>Queue wait</th><th>Other channels served meanwhile</th>"
        '<th class="l">Outcome</th></tr>'
    )
    body = []
    for r in page["starvation"]:
        color = groups.color.get(r["channel"], OTHER_COLOR)
        cells = [
            _cell("wait_s", r["wait_s"], readable(r["wait_s"]), bad=True),
            _name_cell(r["channel"], color),
            _cell("job_id", r["job_id"], str(r["job_id"])),
            _cell("attempt", r["attempt"], str(r["attempt"])),
            f'<td class="l">{escape(r["kind"])}</td>',
            _cell("waiting_since", iso(r["waiting_since"]), fmt_time(from_micros(r["waiting_since"]))),
            _cell("started_at", iso(r["started_at"]), fmt_time(from_micros(r["started_at"]))),
            _cell("queue_wait_s", r["queue_wait_s"], readable(r["queue_wait_s"])),
            _cell("other_channels_served", r["other_channels_served"], str(r["other_channels_served"])),
            f'<td class="l">{escape(r["outcome"])}</td>',
        ]
        body.append(
            f'<tr data-channel="{attr(r["channel"])}" data-job-id="{r["job_id"]}" data-attempt="{r["attempt"]}">'
            f"{''.join(cells)}</tr>"
        )
    return f'<table id="starvation"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table>'


def _keyed_channels_table(page: dict[str, Any]) -> str:
    head = (
        "<tr><th>Channel</th><th>Windows with 2+ keys</th><th>Most keys in a window</th><th>Jain's index mean</th>"
        "<th>Jain's index min</th><th>Key starvation incidents</th><th>Starved keys</th></tr>"
    )
    body = []
    for r in page["keyed_channels"]:
        cells = [
            _name_cell(r["channel"], None),
            _cell("windows", r["windows"], fmt_number(r["windows"])),
            _cell("keys_max", r["keys_max"], fmt_number(r["keys_max"])),
            _cell("jain_mean", r["jain_mean"], fmt_number(r["jain_mean"], 3)),
            _cell("jain_min", r["jain_min"], fmt_number(r["jain_min"], 3), bad=(r["jain_min"] or 1.0) < 0.8),
            _cell(
                "starvation_incidents",
                r["starvation_incidents"],
                fmt_number(r["starvation_incidents"]),
                bad=r["starvation_incidents"] > 0,
            ),
            _cell("starved_keys", r["starved_keys"], fmt_number(r["starved_keys"])),
        ]
        body.append(f'<tr data-keyed-channel="{attr(r["channel"])}">{"".join(cells)}</tr>')
    return f'<table id="keyed-channels"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table>'


def _keys_section(page: dict[str, Any]) -> list[str]:
    """ "Fairness within channels, across fair keys": only when some channel had two keys or more in a window."""
    s = page["summary"]
    if not page.get("keyed_channels"):
        return []
    shown = len(page["keyed_channels"])
    total = int(s.get("keyed_channels") or shown)
    return [
        '<section id="fair-keys"><h2>Fairness within channels, across fair keys</h2><p class="note">'
        "Within a channel, jobs take turns across their fair keys (a job without one has the key “”). "
        "Per window, Jain's index across the keys of a channel backlogged in it, for the channels with at least "
        "two keys in the window (tables key_fairness_windows and key_starvation); a key starvation incident is a "
        f"job that waited over {readable(float(page['threshold_seconds']))} at the head of its key while another "
        "key of its channel had an attempt start. Mean Jain's index across keys "
        + _summary_number("key_jain_mean", s.get("key_jain_mean"), fmt_number(s.get("key_jain_mean"), 3))
        + ", min "
        + _summary_number("key_jain_min", s.get("key_jain_min"), fmt_number(s.get("key_jain_min"), 3))
        + "; "
        + _summary_number(
            "key_starvation_incidents", s.get("key_starvation_incidents"), fmt_number(s.get("key_starvation_incidents"))
        )
        + " key starvation incident(s). "
        + (f"The {shown} least fair of {total} channels." if shown < total else "Least fair first.")
        + f'</p><div class="scroll">{_keyed_channels_table(page)}</div></section>'
    ]


# -- the page -------------------------------------------------------------------------------------------


def _kpi(key: str, value: Any, text: str, caption: str, *, bad: bool = False) -> str:
    """A headline figure; ``caption`` is HTML (its numbers are :func:`_summary_number`'s)."""
    cls = "kpi bad" if bad else "kpi"
    return (
        f'<div class="{cls}" data-kpi="{key}" data-value="{attr(value)}"><div class="value">{escape(text)}</div>'
        f'<div class="caption">{caption}</div></div>'
    )


def _summary_number(key: str, value: Any, text: str, tag: str = "span") -> str:
    """A number of ``summary`` shown in a sentence, with its name and unrounded value."""
    return f'<{tag} data-kpi="{key}" data-value="{attr(value)}">{escape(text)}</{tag}>'


def _row_number(column: str, value: Any, text: str) -> str:
    """A number of a table's row (the one its finding names) shown in a sentence, with its column and value."""
    return f'<b data-col="{column}" data-value="{attr(value)}">{escape(text)}</b>'


def _finding(name: str, row: str, body: str) -> str:
    """One finding: ``data-finding`` names it, ``row`` (attributes) says which table row its numbers are of."""
    return f'<li data-finding="{name}"{" " + row if row else ""}>{body}</li>'


def _findings(page: dict[str, Any]) -> list[str]:
    """The findings, read from the report's own figures (``summary``, the ``channels``, ``fairness_windows`` and
    ``starvation`` tables), never from the charts' windows."""
    s = page["summary"]
    found = []
    slow = [r for r in page["channels"] if r["wait_p95_s"] is not None]
    if slow and len(page["channels"]) > 1:
        worst = slow[0]
        found.append(
            _finding(
                "slowest_channel",
                f'data-channel="{attr(worst["channel"])}"',
                f"Slowest channel: <b>{escape(worst['channel'])}</b>, p95 queue wait "
                f"{_row_number('wait_p95_s', worst['wait_p95_s'], readable(worst['wait_p95_s']))} (all channels: "
                f"{_summary_number('wait_p95_s', s['wait_p95_s'], readable(s['wait_p95_s']))}).",
            )
        )
    least = page.get("least_fair")
    if least is not None and least["backlogged_channels"] > 1:
        found.append(
            _finding(
                "least_fair_window",
                f'data-window="{iso(least["window_us"])}"',
                f"Least fair window: {fmt_time(from_micros(least['window_us']))} ({readable(page['window_seconds'])}), "
                "Jain's index "
                f"{_row_number('jain_index', least['jain_index'], fmt_number(least['jain_index'], 3))} across "
                f"{_row_number('backlogged_channels', least['backlogged_channels'], str(least['backlogged_channels']))}"
                f" backlogged channels; <b>{escape(str(least['top_channel']))}</b> finished "
                f"{_row_number('top_share', least['top_share'], fmt_rate(least['top_share']))} of the jobs.",
            )
        )
    elif least is not None:  # every window scored 1 (one backlogged channel at most, or equal service)
        found.append(
            _finding(
                "least_fair_window",
                f'data-window="{iso(least["window_us"])}"',
                "Fair throughout: Jain's index "
                f"{_row_number('jain_index', least['jain_index'], fmt_number(least['jain_index'], 3))} in every "
                "window (the channels kept waiting, if any, were served equally).",
            )
        )
    worst_failing = page.get("most_failures")
    if worst_failing is not None:
        found.append(
            _finding(
                "most_failures",
                f'data-channel="{attr(worst_failing["channel"])}"',
                f"Most failures: <b>{escape(worst_failing['channel'])}</b>, "
                f"{_row_number('failure_rate', worst_failing['failure_rate'], fmt_rate(worst_failing['failure_rate']))}"
                " of its jobs failed and "
                f"{_row_number('retry_rate', worst_failing['retry_rate'], fmt_rate(worst_failing['retry_rate']))} "
                "needed more than one attempt.",
            )
        )
    if page["starvation"]:
        top = page["starvation"][0]
        incidents, starved, others = s["starvation_incidents"], s["starved_channels"], top["other_channels_served"]
        found.append(
            _finding(
                "starvation",
                f'data-job-id="{top["job_id"]}" data-attempt="{top["attempt"]}"',
                f"Starvation: {_summary_number('starvation_incidents', incidents, f'{incidents:,}')} incident(s) in "
                f"{_summary_number('starved_channels', starved, str(starved))} channel(s); the worst, job "
                f"{_row_number('job_id', top['job_id'], str(top['job_id']))} of <b>{escape(top['channel'])}</b>, "
                f"waited {_row_number('wait_s', top['wait_s'], readable(top['wait_s']))} while "
                f"{_row_number('other_channels_served', others, str(others))} other channel(s) were served.",
            )
        )
    else:
        found.append(
            _finding(
                "starvation",
                "",
                f"No starvation: no channel's head job waited over {readable(page['threshold_seconds'])} while "
                "other channels were served.",
            )
        )
    return found


_CSS = """
:root{--ink:#1d2733;--muted:#5f6b7a;--line:#e3e7ec;--bad:#c0392b;--bg:#f6f8fa}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;
 color:var(--ink);background:var(--bg)}
main{max-width:1180px;margin:0 auto;padding:24px 20px 48px}
h1{font-size:24px;margin:0 0 4px}
h2{font-size:18px;margin:0 0 2px}
.sub,.note{color:var(--muted);margin:0 0 12px}
.note{font-size:13px}
section{background:#fff;border:1px solid var(--line);border-radius:8px;padding:16px 18px;margin:16px 0}
.kpis{display:grid;grid-template-columns:repeat(auto-fill,minmax(180px,1fr));gap:10px;margin:16px 0}
.kpi{background:#fff;border:1px solid var(--line);border-radius:8px;padding:10px 12px}
.kpi .value{font-size:22px;font-weight:600;font-variant-numeric:tabular-nums}
.kpi .caption{color:var(--muted);font-size:12px}
.kpi.bad .value{color:var(--bad)}
ul.findings{margin:6px 0 0;padding-left:20px}
ul.findings li{margin:3px 0}
svg{width:100%;height:auto;display:block;font-size:11px}
svg text{fill:var(--muted)}
.axis{stroke:#9aa4b1}.tick{stroke:#9aa4b1}.grid{stroke:var(--line)}
.xlabel{text-anchor:middle}.ylabel{text-anchor:end}.unit{text-anchor:end;font-style:italic}
.yunit{text-anchor:start;font-style:italic}
.threshold{stroke:var(--bad);stroke-width:1.4;stroke-dasharray:2 3}
.threshold-label{fill:var(--bad);text-anchor:end}
rect.starved{fill:#fbe3e0;shape-rendering:crispEdges}
ul.legend{list-style:none;padding:0;margin:8px 0 0;display:flex;flex-wrap:wrap;gap:6px 16px;font-size:13px}
ul.legend li{display:flex;align-items:center;gap:6px;white-space:nowrap}
.swatch{display:inline-block;width:12px;height:12px;border-radius:2px;margin-right:6px;vertical-align:-1px;
 flex:none}
ul.legend .swatch{margin-right:0}
.starved-swatch{background:#fbe3e0;border:1px solid #f0b8b0}
table{border-collapse:collapse;width:100%;font-size:13px;font-variant-numeric:tabular-nums}
th,td{padding:5px 7px;border-bottom:1px solid var(--line);text-align:right;white-space:nowrap}
th{color:var(--muted);font-weight:600;background:#fafbfc;white-space:normal;vertical-align:bottom}
th:first-child,td.name,th.l,td.l{text-align:left}
td.name{max-width:260px;overflow:hidden;text-overflow:ellipsis}
td.bad{color:var(--bad);font-weight:600}
.scroll{overflow-x:auto}
dl{margin:0}dt{font-weight:600;margin-top:8px}dd{margin:0 0 0 0;color:var(--muted)}
footer{color:var(--muted);font-size:12px;text-align:center}
"""


def render_html(page: dict[str, Any]) -> str:
    """The report page for the data :func:`fairqueue.spark.report.build_report` collected."""
    s = page["summary"]
    groups = Groups(page["groups"], page["other_channels"])
    threshold = float(page["threshold_seconds"])
    window = readable(page["window_seconds"])
    chart_window = readable(page["chart_window_seconds"])
    read = [escape(page["source"])] if page.get("source") else []
    if page.get("live_database"):
        read.append(f"live table of {escape(page['live_database'])}")
    sources = " + ".join(read)
    kpis = [
        _kpi(
            "jobs",
            s["jobs"],
            fmt_number(s["jobs"]),
            f"jobs finished · {_summary_number('attempts', s['attempts'], fmt_number(s['attempts']))} attempts",
        ),
        _kpi("throughput_per_s", s["throughput_per_s"], fmt_throughput(s["throughput_per_s"]), "average throughput"),
        _kpi("wait_p50_s", s["wait_p50_s"], readable(s["wait_p50_s"]), "queue wait p50"),
        _kpi(
            "wait_p95_s",
            s["wait_p95_s"],
            readable(s["wait_p95_s"]),
            "queue wait p95",
            bad=(s["wait_p95_s"] or 0) > threshold,
        ),
        _kpi(
            "wait_p99_s",
            s["wait_p99_s"],
            readable(s["wait_p99_s"]),
            "queue wait p99",
            bad=(s["wait_p99_s"] or 0) > threshold,
        ),
        _kpi(
            "run_p95_s",
            s["run_p95_s"],
            readable(s["run_p95_s"]),
            f"run time p95 · p50 {_summary_number('run_p50_s', s['run_p50_s'], readable(s['run_p50_s']))}",
        ),
        _kpi(
            "failure_rate",
            s["failure_rate"],
            fmt_rate(s["failure_rate"]),
            "of the jobs failed",
            bad=(s["failure_rate"] or 0) > 0.05,
        ),
        _kpi("retry_rate", s["retry_rate"], fmt_rate(s["retry_rate"]), "of the jobs needed a retry"),
        _kpi(
            "jain_mean",
            s["jain_mean"],
            fmt_number(s["jain_mean"], 3),
            "fairness (Jain), mean per window · min "
            + _summary_number("jain_min", s["jain_min"], fmt_number(s["jain_min"], 3)),
        ),
        _kpi(
            "starvation_incidents",
            s["starvation_incidents"],
            fmt_number(s["starvation_incidents"]),
            "starvation incidents in "
            + _summary_number("starved_channels", s["starved_channels"], str(s["starved_channels"]))
            + " channel(s)",
            bad=s["starvation_incidents"] > 0,
        ),
    ]
    coarse = page["chart_window_seconds"] != page["window_seconds"]
    # chart-only: with more than MAX_CHART_WINDOWS windows the charts use a multiple of the window; the headline,
    # the findings and the tables never do
    coarser = (
        f" The charts use {chart_window} windows (the tables use {window}) to stay readable: their points are "
        f"figures of those {chart_window} windows, computed for the charts only."
        if coarse
        else ""
    )
    coarser_fairness = (
        f" Drawn over {chart_window} windows to stay readable: each point is Jain's index of such a window, "
        f"computed for this chart only, not the {window} windows of the headline, the findings and the tables."
        if coarse
        else ""
    )
    many = (
        f" Channels beyond the {len([g for g in groups.order if g is not None])} busiest and slowest are drawn "
        "together as &quot;other&quot;."
        if page["other_channels"]
        else ""
    )
    period = f"{fmt_time(s['period_start'])} \u2013 {fmt_time(s['period_end'])}"
    shown_channels = len(page["channels"])
    shown_incidents = len(page["starvation"])
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>fairqueue report {escape(period)}</title>",
        f"<style>{_CSS}</style></head><body><main>",
        "<h1>fairqueue: fairness and SLA report</h1>",
        f'<p class="sub">{escape(period)} · '
        f"{_summary_number('channels', s['channels'], str(s['channels']))} channels · "
        f"{_summary_number('kinds', s['kinds'], str(s['kinds']))} kinds · {window} windows · from {sources}</p>",
        *(f'<p class="note">{escape(note)}.</p>' for note in page.get("notes", ())),
        f'<div class="kpis">{"".join(kpis)}</div>',
        '<section><h2>Findings</h2><ul class="findings">' + "".join(_findings(page)) + "</ul></section>",
        '<section id="wait-chart"><h2>Queue wait per channel</h2>'
        f'<p class="note">Time from ready to started, p50 and p95 of the attempts that started in each window; '
        f"log scale.{coarser}{many}</p>" + wait_chart(page, groups) + "</section>",
        '<section id="share-chart"><h2>Share of throughput per channel</h2>'
        '<p class="note">Jobs finished (final attempts) per channel as a share of each window&#39;s total.'
        + (f" Each bar is a {chart_window} window." if coarse else "")
        + "</p>"
        + share_chart(page, groups)
        + "</section>",
        '<section id="fairness-chart"><h2>Fairness over time</h2>'
        '<p class="note">Jain\'s index of the throughput of the channels that were backlogged in the window '
        "(had a job waiting over "
        + readable(page.get("backlog_tolerance_seconds", 1.0))
        + "): 1 when they were served equally, whatever the channels that were not kept waiting got. A window where "
        "no channel was kept waiting scores 1. The index over every active channel's share of the jobs is in the "
        f"fairness_windows table (share_jain_index).{coarser_fairness}</p>" + fairness_chart(page) + "</section>",
        '<section><h2>Channels, slowest first</h2><p class="note">'
        + (
            f"The {shown_channels} channels with the longest p95 queue wait of {s['channels']}."
            if shown_channels < s["channels"]
            else "Every channel, by p95 queue wait."
        )
        + f" Red: waits over the starvation threshold ({readable(threshold)}), failure rate over 5%, "
        "retry rate over 10%.</p>"
        f'<div class="scroll">{_channels_table(page, groups)}</div></section>',
        f'<section><h2>Starvation incidents</h2><p class="note">Jobs that waited over {readable(threshold)} '
        "at the head of their channel (from when they were ready or the channel's previous job started, whichever "
        "is later) while at least one other channel had an attempt start. A job deep in a backlog that is being "
        "served is not starved. "
        + (
            f"The {shown_incidents} longest of {s['starvation_incidents']:,}."
            if shown_incidents < s["starvation_incidents"]
            else f"All {s['starvation_incidents']:,}."
        )
        + "</p>"
        + (f'<div class="scroll">{_starvation_table(page, groups)}</div>' if page["starvation"] else "<p>None.</p>")
        + "</section>",
        *_keys_section(page),
        '<section><h2>Kinds</h2><p class="note">'
        + (
            f"The {len(page['kinds'])} busiest of {page['kinds_total']} kinds."
            if len(page["kinds"]) < page["kinds_total"]
            else "Every kind, busiest first."
        )
        + f'</p><div class="scroll">{_kinds_table(page)}</div></section>',
        "<section><h2>How these numbers are computed</h2><dl>"
        "<dt>Window</dt><dd>Each attempt counts in the window of its start (of its finish if it never started). "
        "Windows are aligned to the Unix epoch, in UTC.</dd>"
        "<dt>Jobs, throughput</dt><dd>Jobs are final attempts; throughput is jobs per second of the window.</dd>"
        "<dt>Queue wait, run time</dt><dd>started \u2212 ready (enqueue time if not recorded), and "
        "finished \u2212 started, "
        "over attempts that started; approximate percentiles: the value at a rank within n/10,000 of the exact "
        "one (not interpolated).</dd>"
        "<dt>Failure rate, retry rate</dt><dd>Final attempts not succeeded, and final attempts numbered above 1, "
        "per job.</dd>"
        "<dt>Jain's index</dt><dd>(Σx)² / (n·Σx²) over the throughput x of the n channels backlogged in a window "
        "(1 if none was).</dd>"
        "<dt>Starvation incident</dt><dd>A job that waited longer than the threshold at the head of its channel "
        "while another channel had an attempt start.</dd></dl></section>",
        f"<footer>Generated {escape(fmt_time(page['generated_at']))} by fairqueue report · tables in parquet/ "
        "and csv/ next to this file</footer>",
        "</main></body></html>",
    ]
    return "\n".join(parts) + "\n"
