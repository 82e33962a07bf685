#!/usr/bin/env python3
"""Acceptance report from scrapes of the token-processor's /metrics, one row (and one line of
the plot) per run: how often drafts were accepted, overall and per draft position. For comparing
proposers and draft models (n-gram, suffix, a draft at q4_0, a deliberately bad draft, ...) run
by run. Python 3 standard library only.

Usage:
  acceptance-report.py LABEL=PATH [LABEL=PATH ...] [--svg OUT.svg] [--title TEXT]

  PATH          a Prometheus text-format scrape, e.g. `curl -s http://127.0.0.1:9400/metrics > f`
  BEFORE,AFTER  two scrapes of one token-processor: the run is AFTER minus BEFORE, series by
                series (the counters count since the token-processor started)
  {k="v",...}   after the path(s): only the series with these label values, e.g.
                'ngram=/tmp/all.prom{proposer="ngram"}' (quote it for the shell)

From the counters (shared/spec/acceptance-metrics.md, token-processor/src/metrics.rs), summed
over every label but `position` (model, worker, proposer, ...):
  drafts                specula_spec_decode_num_drafts_total: verification steps with d > 0
  draft tokens          specula_spec_decode_num_draft_tokens_total: sum of d
  acceptance rate       num_accepted_tokens_total / num_draft_tokens_total: sum(a) / sum(d)
  mean accepted length  1 + num_accepted_tokens_total / num_drafts_total: tokens per drafting
                        step, bonus token included (vLLM's mean acceptance length)
  pos i                 num_accepted_tokens_per_pos_total{position="i"} / num_drafts_total: the
                        share of drafting steps whose draft i (0-based) was accepted (vLLM's
                        per-position acceptance rate; not conditional on reaching position i,
                        unlike speculate_metrics.accept_ratio_per_head)
A figure with a zero denominator prints as "-" (and is left out of the plot).

Output: a Markdown table on stdout, one row per run in the order given, one "pos i" column for
every position in any run ("-" where a run has no such position). With --svg, a self-contained
SVG line plot of the per-position rates (x: draft position, y: acceptance rate 0..1).
Test data: scripts/bench/testdata/ holds synthetic scrapes and the table they give:
  cd scripts/bench && ./acceptance-report.py ngram=testdata/ngram.prom \
      draft-L10-q4_0=testdata/draft-q4_0-before.prom,testdata/draft-q4_0-after.prom \
      'draft-L10-bad=testdata/mixed.prom{proposer="draft:L10-bad"}' \
      'suffix=testdata/mixed.prom{proposer="suffix"}' 'idle=testdata/mixed.prom{proposer="idle"}' \
      mixed-all=testdata/mixed.prom | diff - testdata/acceptance-report.expected.md

Exit status 1 for a missing/unreadable file, a scrape without those counters, or a counter that
went down between BEFORE and AFTER; 2 for usage errors.
"""

import argparse
import re
import sys
from xml.sax.saxutils import escape

DRAFTS = "specula_spec_decode_num_drafts_total"
DRAFT_TOKENS = "specula_spec_decode_num_draft_tokens_total"
ACCEPTED = "specula_spec_decode_num_accepted_tokens_total"
PER_POS = "specula_spec_decode_num_accepted_tokens_per_pos_total"
WANTED = (DRAFTS, DRAFT_TOKENS, ACCEPTED, PER_POS)


class ReportError(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# Prometheus text format

NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,?)')
UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def unescape(value):
    return re.sub(r'\\[\\"n]', lambda m: UNESCAPE[m.group(0)], value)


def parse_labels(text, pos, where):
    """Labels from text[pos] == '{' to the matching '}'; returns (dict, position after '}')."""
    labels = {}
    pos += 1
    while True:
        while pos < len(text) and text[pos] in " \t":
            pos += 1
        if pos < len(text) and text[pos] == "}":
            return labels, pos + 1
        m = LABEL_RE.match(text, pos)
        if not m:
            raise ReportError(f"{where}: cannot parse the labels in {text.strip()!r}")
        labels[m.group(1)] = unescape(m.group(2))
        pos = m.end()
        if not m.group(3):
            while pos < len(text) and text[pos] in " \t":
                pos += 1
            if pos >= len(text) or text[pos] != "}":
                raise ReportError(f"{where}: cannot parse the labels in {text.strip()!r}")
            return labels, pos + 1


def parse_scrape(text, path):
    """{(metric name, frozenset of labels): value} for the counters this report reads."""
    series = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = NAME_RE.match(line)
        if not m:
            raise ReportError(f"{path}:{n}: not a sample line: {line!r}")
        name = m.group(0)
        if name not in WANTED:
            continue
        pos = m.end()
        labels = {}
        if pos < len(line) and line[pos] == "{":
            labels, pos = parse_labels(line, pos, f"{path}:{n}")
        fields = line[pos:].split()
        if not fields:
            raise ReportError(f"{path}:{n}: no value: {line!r}")
        try:
            value = float(fields[0])
        except ValueError:
            raise ReportError(f"{path}:{n}: value {fields[0]!r} is not a number") from None
        key = (name, frozenset(labels.items()))
        series[key] = series.get(key, 0.0) + value
    return series


def read_scrape(path):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ReportError(f"{path}: {e.strerror}") from None
    series = parse_scrape(text, path)
    if not any(name == DRAFTS for name, _ in series):
        raise ReportError(
            f"{path}: no {DRAFTS} sample; is it a scrape of the token-processor's /metrics "
            "with speculation on?"
        )
    return series


# ---------------------------------------------------------------------------------------------
# Runs


def parse_run_spec(spec):
    """LABEL=PATH[,PATH][{k="v",...}] -> (label, [paths], {k: v})."""
    if "=" not in spec:
        raise ReportError(f"{spec!r}: expected LABEL=PATH")
    label, rest = spec.split("=", 1)
    if not label or not rest:
        raise ReportError(f"{spec!r}: expected LABEL=PATH")
    selector = {}
    if rest.endswith("}") and "{" in rest:
        brace = rest.rindex("{")
        sel = rest[brace:]
        rest = rest[:brace]
        # Accept k="v" and k=v.
        sel = re.sub(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*([^",}\s][^,}]*)', r'\1="\2"', sel)
        selector, end = parse_labels(sel, 0, spec)
        if end != len(sel):
            raise ReportError(f"{spec!r}: cannot parse the selector")
    paths = rest.split(",")
    if len(paths) > 2 or not all(paths):
        raise ReportError(f"{spec!r}: expected one scrape or BEFORE,AFTER")
    return label, paths, selector


def run_figures(series, selector):
    """Sums over all labels but position, for the series matching selector."""
    drafts = draft_tokens = accepted = 0.0
    per_pos = {}
    for (name, labels), value in series.items():
        d = dict(labels)
        if any(d.get(k) != v for k, v in selector.items()):
            continue
        if name == DRAFTS:
            drafts += value
        elif name == DRAFT_TOKENS:
            draft_tokens += value
        elif name == ACCEPTED:
            accepted += value
        elif name == PER_POS:
            if "position" not in d or not d["position"].isdigit():
                raise ReportError(f"{PER_POS} with position {d.get('position')!r}")
            i = int(d["position"])
            per_pos[i] = per_pos.get(i, 0.0) + value
    k = max(per_pos) + 1 if per_pos else 0
    ratio = lambda a, b: a / b if b > 0 else None  # noqa: E731
    return {
        "drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted": accepted,
        "rate": ratio(accepted, draft_tokens),
        "mean_len": 1 + accepted / drafts if drafts > 0 else None,
        "pos": [ratio(per_pos.get(i, 0.0), drafts) for i in range(k)],
    }


def load_run(spec):
    label, paths, selector = parse_run_spec(spec)
    if len(paths) == 1:
        series = read_scrape(paths[0])
    else:
        before, after = read_scrape(paths[0]), read_scrape(paths[1])
        series = {}
        for key, value in after.items():
            delta = value - before.get(key, 0.0)
            if delta < 0:
                name, labels = key
                raise ReportError(
                    f"{label}: {name}{{{', '.join(f'{k}={v!r}' for k, v in sorted(labels))}}} went "
                    f"down from {paths[0]} to {paths[1]} (token-processor restarted, or the files swapped?)"
                )
            series[key] = delta
    if selector and not any(
        name == DRAFTS and all(dict(lb).get(k) == v for k, v in selector.items()) for name, lb in series
    ):
        raise ReportError(f"{label}: no {DRAFTS} series has the labels {selector}")
    figures = run_figures(series, selector)
    figures["label"] = label
    return figures


# ---------------------------------------------------------------------------------------------
# Output


def fmt_count(x):
    return str(int(x)) if x == int(x) else f"{x:g}"


def fmt(x, digits):
    return "-" if x is None else f"{x:.{digits}f}"


def markdown(runs):
    k = max((len(r["pos"]) for r in runs), default=0)
    head = ["run", "drafts", "draft tokens", "acceptance rate", "mean accepted length"]
    head += [f"pos {i}" for i in range(k)]
    rows = []
    for r in runs:
        pos = [fmt(r["pos"][i], 3) if i < len(r["pos"]) else "-" for i in range(k)]
        rows.append([r["label"].replace("|", "\\|"), fmt_count(r["drafts"]), fmt_count(r["draft_tokens"]),
                     fmt(r["rate"], 3), fmt(r["mean_len"], 2)] + pos)
    out = ["| " + " | ".join(head) + " |",
           "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(out) + "\n"


# Okabe-Ito, distinguishable with the common colour-vision deficiencies.
COLORS = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]
MARKERS = ["circle", "square", "diamond", "triangle"]


def marker(kind, x, y, color):
    if kind == "circle":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{color}"/>'
    if kind == "square":
        return f'<rect x="{x - 3.6:.1f}" y="{y - 3.6:.1f}" width="7.2" height="7.2" fill="{color}"/>'
    if kind == "diamond":
        pts = [(x, y - 5), (x + 5, y), (x, y + 5), (x - 5, y)]
    else:
        pts = [(x, y - 5), (x + 5, y + 4), (x - 5, y + 4)]
    return f'<polygon points="{" ".join(f"{a:.1f},{b:.1f}" for a, b in pts)}" fill="{color}"/>'


def svg(runs, title):
    k = max((len(r["pos"]) for r in runs), default=0)
    k = max(k, 1)
    width, left, right, top, bottom = 760, 70, 190, 50 if title else 24, 60
    height = max(420, top + 8 + 22 * len(runs) + bottom)
    pw, ph = width - left - right, height - top - bottom
    xs = lambda i: left + (pw * (i + 0.5) / k if k == 1 else pw * (0.04 + 0.92 * i / (k - 1)))  # noqa: E731
    ys = lambda v: top + ph * (1 - v)  # noqa: E731
    font = 'font-family="DejaVu Sans, Helvetica, Arial, sans-serif"'
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
         f'viewBox="0 0 {width} {height}" {font} font-size="12">',
         f'<rect width="{width}" height="{height}" fill="white"/>']
    if title:
        o.append(f'<text x="{left + pw / 2:.1f}" y="28" text-anchor="middle" font-size="15" '
                 f'font-weight="bold">{escape(title)}</text>')
    # Gridlines and y ticks every 0.1.
    for j in range(11):
        v = j / 10
        y = ys(v)
        stroke = "#bbbbbb" if j % 5 == 0 else "#e3e3e3"
        o.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="{stroke}" stroke-width="1"/>')
        o.append(f'<text x="{left - 8}" y="{y + 4:.1f}" text-anchor="end">{v:.1f}</text>')
    for i in range(k):
        x = xs(i)
        o.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + ph}" stroke="#e3e3e3" stroke-width="1"/>')
        o.append(f'<text x="{x:.1f}" y="{top + ph + 18}" text-anchor="middle">{i}</text>')
    # Axes.
    o.append(f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="black" stroke-width="1.2"/>')
    o.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="black" stroke-width="1.2"/>')
    o.append(f'<text x="{left + pw / 2:.1f}" y="{height - 16}" text-anchor="middle" font-size="13">draft position</text>')
    o.append(f'<text transform="translate(20 {top + ph / 2:.1f}) rotate(-90)" text-anchor="middle" '
             f'font-size="13">acceptance rate</text>')
    # One polyline and markers per run; a gap where a rate is undefined.
    for n, r in enumerate(runs):
        color, kind = COLORS[n % len(COLORS)], MARKERS[n % len(MARKERS)]
        dash = '' if n < len(COLORS) else ' stroke-dasharray="6 3"'
        o.append(f'<g><title>{escape(r["label"])}</title>')
        segment = []
        points = [(i, v) for i, v in enumerate(r["pos"])] + [(None, None)]
        for i, v in points:
            if v is None:
                if len(segment) > 1:
                    o.append(f'<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="'
                             + " ".join(f"{x:.1f},{y:.1f}" for x, y in segment) + '"/>')
                segment = []
                continue
            segment.append((xs(i), ys(min(max(v, 0.0), 1.0))))
        for i, v in enumerate(r["pos"]):
            if v is not None:
                o.append(marker(kind, xs(i), ys(min(max(v, 0.0), 1.0)), color))
        o.append("</g>")
    # Legend, right of the plot.
    lx, ly = left + pw + 18, top + 8
    for n, r in enumerate(runs):
        color, kind = COLORS[n % len(COLORS)], MARKERS[n % len(MARKERS)]
        y = ly + 22 * n
        dash = '' if n < len(COLORS) else ' stroke-dasharray="6 3"'
        o.append(f'<line x1="{lx}" y1="{y}" x2="{lx + 26}" y2="{y}" stroke="{color}" stroke-width="2"{dash}/>')
        o.append(marker(kind, lx + 13, y, color))
        label = r["label"] if len(r["label"]) <= 22 else r["label"][:21] + "…"
        if all(v is None for v in r["pos"]):
            label += " (no drafts)"
        o.append(f'<text x="{lx + 34}" y="{y + 4}">{escape(label)}</text>')
    o.append("</svg>")
    return "\n".join(o) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="acceptance-report.py",
        description="Acceptance report (Markdown table, optional SVG plot) from token-processor "
        "/metrics scrapes.",
        epilog=__doc__[__doc__.index("Usage:"):],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("runs", nargs="+", metavar="LABEL=PATH", help="a run: its label and scrape(s)")
    ap.add_argument("--svg", metavar="OUT.svg", help="also write a line plot of the per-position rates")
    ap.add_argument("--title", help="title of the plot")
    args = ap.parse_args(argv)
    try:
        runs = [load_run(spec) for spec in args.runs]
    except ReportError as e:
        print(f"acceptance-report: {e}", file=sys.stderr)
        return 1
    labels = [r["label"] for r in runs]
    if len(set(labels)) != len(labels):
        ap.error("each run needs its own label")
    sys.stdout.write(markdown(runs))
    if args.svg:
        try:
            with open(args.svg, "w", encoding="utf-8") as f:
                f.write(svg(runs, args.title))
        except OSError as e:
            print(f"acceptance-report: {args.svg}: {e.strerror}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
