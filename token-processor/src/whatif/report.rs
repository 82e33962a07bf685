//! `DIR/report.json` and `DIR/report.html`: the same figures, the page self-contained (inline
//! SVG, no network), with three plots: acceptance by draft position, the accepted-length
//! distribution, and predicted tokens per second against K'.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use super::model::{Prediction, Recorded, WhatIf};
use crate::error::TpError;

/// Everything the report says.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub trace: String,
    pub proposer: Option<String>,
    pub model: Option<String>,
    pub recorded: Recorded,
    pub what_if: Vec<Prediction>,
    /// How the figures were computed, in a sentence each.
    pub method: Vec<&'static str>,
}

pub const METHOD: [&str; 3] = [
    "Re-scored from each verify step's whole offer against the emitted tokens; a shorter K' drafts the last recorded offer shifted past the tokens emitted since.",
    "Verify time scales with the worker's calibrated cost curve at the run's mean batch; the rest of the run's time is held fixed.",
    "goodput is modelled as the draft length with the best expected tokens per second at that batch, from the trace's per-position acceptance.",
];

/// Writes `dir/report.json` and `dir/report.html` (creating `dir`).
pub fn write_report(dir: &Path, report: &Report) -> Result<(), TpError> {
    let io = |source: std::io::Error| TpError::TraceIo {
        path: dir.display().to_string(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let json = serde_json::to_string_pretty(report).map_err(|e| io(std::io::Error::other(e)))?;
    std::fs::write(dir.join("report.json"), json).map_err(io)?;
    std::fs::write(dir.join("report.html"), html(report)).map_err(io)?;
    Ok(())
}

/// Plot geometry: width, height, margin.
const W: f64 = 520.0;
const H: f64 = 260.0;
const M: f64 = 40.0;

fn html(r: &Report) -> String {
    let mut page = String::new();
    let _ = write!(
        page,
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>specula what-if: {}</title>\
         <style>body{{font-family:sans-serif;margin:2em;max-width:1100px}}\
         svg{{border:1px solid #ccc;margin:0.5em}}table{{border-collapse:collapse}}\
         td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}</style></head><body>",
        escape(&r.trace)
    );
    let rec = &r.recorded;
    let _ = write!(
        page,
        "<h1>What-if replay</h1><p>Trace <code>{}</code>, proposer {}, model {}: {} requests, \
         {} tokens in {:.2} s ({:.1} tokens/s), K = {}, mean batch {:.2} verify rows, \
         {:.3} drafted and {:.3} accepted per step.</p>",
        escape(&r.trace),
        escape(r.proposer.as_deref().unwrap_or("?")),
        escape(r.model.as_deref().unwrap_or("?")),
        rec.requests,
        rec.tokens,
        rec.seconds,
        rec.tokens_per_s,
        rec.num_spec_tokens,
        rec.mean_batch_rows,
        rec.drafted_per_step,
        rec.accepted_per_step,
    );
    page.push_str(&bars(
        "acceptance-by-position",
        "Acceptance by draft position",
        &rec.offer_acceptance_by_position,
        "offered token i matched, given tokens before it did",
    ));
    let hist = &rec.accepted_length_histogram;
    let total = hist.iter().sum::<u64>().max(1) as f64;
    let shares: Vec<f64> = hist.iter().map(|&n| n as f64 / total).collect();
    page.push_str(&bars(
        "accepted-length",
        "Accepted-length distribution (recorded)",
        &shares,
        "share of verify steps accepting j drafts",
    ));
    page.push_str(&throughput_plot(r));
    page.push_str(&table(r));
    page.push_str("<h2>Method</h2><ul>");
    for line in &r.method {
        let _ = write!(page, "<li>{}</li>", escape(line));
    }
    // Marks the page as drawn (a headless browser's test reads it): every plot has its marks.
    page.push_str(
        "</ul><script>document.body.dataset.plots = String([...document.querySelectorAll('svg.plot')]\
         .filter(s => s.querySelectorAll('.mark').length > 0).length);</script></body></html>",
    );
    page
}

/// A bar chart of `values` (0..=1 each), one bar per index.
fn bars(id: &str, title: &str, values: &[f64], y_label: &str) -> String {
    let mut svg = open_svg(id, title, y_label);
    let n = values.len().max(1) as f64;
    let slot = (W - 2.0 * M) / n;
    for (i, v) in values.iter().enumerate() {
        let h = v.clamp(0.0, 1.0) * (H - 2.0 * M);
        let x = M + i as f64 * slot + slot * 0.15;
        let _ = write!(
            svg,
            "<rect class=\"mark\" x=\"{x:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"#4a7bd0\"><title>{i}: {v:.3}</title></rect>\
             <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"middle\">{i}</text>",
            H - M - h,
            slot * 0.7,
            x + slot * 0.35,
            H - M + 14.0,
        );
    }
    svg.push_str("</svg>");
    svg
}

fn open_svg(id: &str, title: &str, y_label: &str) -> String {
    format!(
        "<svg class=\"plot\" id=\"{id}\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\">\
         <text x=\"{M}\" y=\"18\" font-size=\"14\">{}</text>\
         <text x=\"{M}\" y=\"32\" font-size=\"10\" fill=\"#555\">{}</text>\
         <line x1=\"{M}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"#000\"/>\
         <line x1=\"{M}\" y1=\"{M}\" x2=\"{M}\" y2=\"{b}\" stroke=\"#000\"/>",
        escape(title),
        escape(y_label),
        b = H - M,
        r = W - M,
    )
}

/// Predicted tokens/s against K', a line per policy, the recorded run as a point.
fn throughput_plot(r: &Report) -> String {
    let k = r.recorded.num_spec_tokens.max(1) as f64;
    let rates: Vec<f64> = (r.what_if.iter())
        .map(|p| p.predicted_tokens_per_s)
        .chain([r.recorded.tokens_per_s])
        .collect();
    // The axis spans the figures (not from 0), so that differences of a few percent show.
    let hi = rates.iter().copied().fold(1.0, f64::max) * 1.02;
    let lo = rates.iter().copied().fold(hi, f64::min) * 0.95;
    let x = |k2: f64| M + k2 / k * (W - 2.0 * M);
    let y = |v: f64| H - M - (v - lo) / (hi - lo).max(1e-9) * (H - 2.0 * M);
    let mut svg = open_svg(
        "throughput",
        "Predicted tokens/s against K'",
        &format!("{lo:.0} to {hi:.0} tokens/s; blue fixed, orange goodput, black the recorded run"),
    );
    for (policy, colour) in [(WhatIf::Fixed, "#4a7bd0"), (WhatIf::Goodput, "#e08a2c")] {
        let points: Vec<String> = r
            .what_if
            .iter()
            .filter(|p| p.policy == policy)
            .map(|p| {
                format!(
                    "{:.1},{:.1}",
                    x(f64::from(p.num_spec_tokens)),
                    y(p.predicted_tokens_per_s)
                )
            })
            .collect();
        let _ = write!(
            svg,
            "<polyline class=\"mark\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{}\"/>",
            points.join(" ")
        );
    }
    let _ = write!(
        svg,
        "<circle class=\"mark\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\"><title>recorded {:.1} tokens/s</title></circle>",
        x(f64::from(r.recorded.num_spec_tokens)),
        y(r.recorded.tokens_per_s),
        r.recorded.tokens_per_s
    );
    for k2 in 0..=r.recorded.num_spec_tokens {
        let _ = write!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"middle\">{k2}</text>",
            x(f64::from(k2)),
            H - M + 14.0
        );
    }
    svg.push_str("</svg>");
    svg
}

fn table(r: &Report) -> String {
    let mut t = String::from(
        "<h2>Every setting</h2><table><tr><th>policy</th><th>K'</th><th>steps</th>\
         <th>drafted/step</th><th>accepted/step</th><th>tokens/step</th>\
         <th>predicted s</th><th>predicted tokens/s</th></tr>",
    );
    for p in &r.what_if {
        let _ = write!(
            t,
            "<tr><td>{:?}</td><td>{}</td><td>{}</td><td>{:.3}</td><td>{:.3}</td><td>{:.3}</td><td>{:.2}</td><td>{:.1}</td></tr>",
            p.policy,
            p.num_spec_tokens,
            p.steps,
            p.drafted_per_step,
            p.accepted_per_step,
            p.tokens_per_step,
            p.predicted_seconds,
            p.predicted_tokens_per_s
        );
    }
    t.push_str("</table>");
    t
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
