//! Series the token-processor renders itself, after the exporter's text on `/metrics`, in the
//! same exposition format:
//! - Histograms whose observations arrive one per row of a step batch (inter-token latency,
//!   accepted drafts per step). The ingest bins a whole batch's observations under one
//!   uncontended lock; metrics-exporter-prometheus instead reads a clock and pushes a timestamped
//!   sample per observation and bins them at its next upkeep, which measured ~30% of a 512-row
//!   batch's processing time (docs/history/benchmarks-notebook.md, token-processor).
//! - The spec's counters (`specula_spec_decode_*_total`). They carry the worker's proposer, and a
//!   worker that comes back with another one must not leave its old series beside the new ones
//!   ([`Registry::retire`]); the exporter removes a series only once it has been idle for a while.
//!
//! Names, help and buckets are declared in `metrics.rs` with every other metric.

use std::fmt::Write;
use std::sync::{Arc, Mutex, OnceLock};

/// One metric name: its help text, kind, bucket upper bounds, and one series per label set.
#[derive(Debug)]
struct Family {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    /// Empty for a counter: its one bin is the overflow bin and holds every increment.
    bounds: Arc<[f64]>,
    /// A counter's unit: what one increment is worth when rendered (1 for whole counts).
    scale: f64,
    series: Mutex<Vec<Arc<Series>>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Histogram,
    Counter,
}

#[derive(Debug)]
struct Series {
    labels: Labels,
    /// Label pairs beyond `labels`, rendered with their leading comma: `,position="0"`.
    extra: String,
    bins: Mutex<Bins>,
}

#[derive(Debug, Clone, PartialEq)]
struct Bins {
    /// Entry `i`: observations `<= bounds[i]` and above the previous bound; the last entry is
    /// the overflow (`+Inf` only).
    counts: Box<[u64]>,
    sum: f64,
}

/// The labels a worker's series share, rendered and escaped once: `model="m",worker="w"` and
/// any pairs after them; and the worker they belong to, which [`Registry::retire`] goes by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Labels {
    worker: String,
    rendered: String,
}

impl Labels {
    /// `model`, `worker`, then `more` in order.
    pub fn new(model: &str, worker: &str, more: &[(&str, &str)]) -> Self {
        let mut rendered = format!("model=\"{}\",worker=\"{}\"", escape(model), escape(worker));
        rendered.push_str(&render_pairs(more));
        Self {
            worker: worker.to_owned(),
            rendered,
        }
    }
}

/// `,name="value"` for each pair, escaped.
fn render_pairs(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(name, value)| format!(",{name}=\"{}\"", escape(value)))
        .collect()
}

/// Every family of the process, histograms and counters.
#[derive(Debug, Default)]
pub struct Registry {
    families: Vec<Family>,
}

impl Registry {
    /// Declares a histogram name. Bounds must increase strictly (checked: panics at startup on
    /// a programming error in `metrics.rs`, never on input).
    pub fn declare(&mut self, name: &'static str, help: &'static str, bounds: &[f64]) {
        assert!(
            bounds.windows(2).all(|w| w[0] < w[1]),
            "buckets of {name} must increase"
        );
        self.push(name, help, Kind::Histogram, bounds);
    }

    /// Declares a counter name.
    pub fn declare_counter(&mut self, name: &'static str, help: &'static str) {
        self.push(name, help, Kind::Counter, &[]);
    }

    /// Declares a counter of a fractional quantity, incremented in whole units of `scale`
    /// (1e-3: thousandths) and rendered as their float total, so a sum of fractions is exact.
    pub fn declare_scaled_counter(&mut self, name: &'static str, help: &'static str, scale: f64) {
        self.push(name, help, Kind::Counter, &[]);
        self.families.last_mut().expect("just pushed").scale = scale;
    }

    fn push(&mut self, name: &'static str, help: &'static str, kind: Kind, bounds: &[f64]) {
        self.families.push(Family {
            name,
            help,
            kind,
            bounds: bounds.into(),
            scale: 1.0,
            series: Mutex::new(Vec::new()),
        });
    }

    /// The histogram `name` for `labels`, created at zero on first use. Unknown names give a
    /// handle that records nothing (as the `metrics` macros do without a recorder).
    pub fn histogram(&self, name: &str, labels: &Labels) -> BinnedHistogram {
        self.series(name, labels, &[])
    }

    /// The counter `name` for `labels` and `more` pairs after them, created at zero on first
    /// use; unknown names record nothing.
    pub fn counter(&self, name: &str, labels: &Labels, more: &[(&str, &str)]) -> OwnCounter {
        OwnCounter(self.series(name, labels, more))
    }

    fn series(&self, name: &str, labels: &Labels, more: &[(&str, &str)]) -> BinnedHistogram {
        let Some(family) = self.families.iter().find(|f| f.name == name) else {
            return BinnedHistogram(None);
        };
        let extra = render_pairs(more);
        let mut series = family.series.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(existing) = series
            .iter()
            .find(|s| &s.labels == labels && s.extra == extra)
        {
            return BinnedHistogram(Some((existing.clone(), family.bounds.clone())));
        }
        let created = Arc::new(Series {
            labels: labels.clone(),
            extra,
            bins: Mutex::new(Bins {
                counts: vec![0; family.bounds.len() + 1].into_boxed_slice(),
                sum: 0.0,
            }),
        });
        series.push(created.clone());
        BinnedHistogram(Some((created, family.bounds.clone())))
    }

    /// Removes, from the families `names`, the series of `keep`'s worker under any other
    /// labels (an earlier proposer or model of the same worker id), so that each worker shows
    /// one set. What they counted since the last scrape is lost with them.
    /// `keep` holds label sets of one worker (one per request class).
    pub fn retire(&self, names: &[&str], keep: &[Labels]) {
        let Some(worker) = keep.first().map(|l| &l.worker) else {
            return;
        };
        for family in self.families.iter().filter(|f| names.contains(&f.name)) {
            let mut series = family.series.lock().unwrap_or_else(|e| e.into_inner());
            series.retain(|s| s.labels.worker != *worker || keep.contains(&s.labels));
        }
    }

    /// Removes every series of `worker`, from every family (it left; see
    /// [`crate::metrics::install`] for when).
    pub fn forget_worker(&self, worker: &str) {
        for family in &self.families {
            let mut series = family.series.lock().unwrap_or_else(|e| e.into_inner());
            series.retain(|s| s.labels.worker != worker);
        }
    }

    /// Appends every family with at least one series, in the Prometheus text format.
    pub fn render(&self, out: &mut String) {
        for family in &self.families {
            let series = family.series.lock().unwrap_or_else(|e| e.into_inner());
            if series.is_empty() {
                continue;
            }
            let name = family.name;
            let kind = match family.kind {
                Kind::Histogram => "histogram",
                Kind::Counter => "counter",
            };
            let _ = writeln!(out, "# HELP {name} {}", family.help);
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for s in series.iter() {
                let bins = s.bins.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let labels = format!("{}{}", s.labels.rendered, s.extra);
                match family.kind {
                    Kind::Histogram => render_histogram(out, name, &family.bounds, &labels, &bins),
                    Kind::Counter if family.scale == 1.0 => {
                        let _ = writeln!(out, "{name}{{{labels}}} {}", bins.counts[0]);
                    }
                    Kind::Counter => {
                        let value = bins.counts[0] as f64 * family.scale;
                        let _ = writeln!(out, "{name}{{{labels}}} {value}");
                    }
                }
            }
        }
    }
}

/// One histogram series' bucket, sum and count lines.
fn render_histogram(out: &mut String, name: &str, bounds: &[f64], labels: &str, bins: &Bins) {
    let mut cumulative = 0u64;
    for (bound, n) in bounds.iter().zip(bins.counts.iter()) {
        cumulative += n;
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {cumulative}");
    }
    cumulative += bins.counts.last().copied().unwrap_or(0);
    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {cumulative}");
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", bins.sum);
    let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
}

/// A handle on one histogram series; cheap to clone.
#[derive(Debug, Clone)]
pub struct BinnedHistogram(Option<(Arc<Series>, Arc<[f64]>)>);

impl BinnedHistogram {
    /// Adds `count` observations of each `(value, count)`, under one lock.
    pub fn observe(&self, observations: impl IntoIterator<Item = (f64, u64)>) {
        let Some((series, bounds)) = &self.0 else {
            return;
        };
        let mut bins = series.bins.lock().unwrap_or_else(|e| e.into_inner());
        for (value, count) in observations {
            if count == 0 {
                continue;
            }
            // First bound >= value (`le` semantics); NaN lands in the overflow bin.
            let i = bounds.partition_point(|&b| b < value);
            bins.counts[i] += count;
            bins.sum += value * count as f64;
        }
    }
}

/// A handle on one counter series; cheap to clone. (A counter is a histogram without bounds:
/// every increment lands in its one bin.)
#[derive(Debug, Clone)]
pub struct OwnCounter(BinnedHistogram);

impl OwnCounter {
    pub fn increment(&self, n: u64) {
        self.0.observe([(0.0, n)]);
    }
}

/// Label value escaping of the Prometheus text format (worker ids are the workers' own words).
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

static GLOBAL: OnceLock<Registry> = OnceLock::new();

/// Installs the process's registry (once; later calls are ignored, like a second recorder).
pub fn install(registry: Registry) {
    let _ = GLOBAL.set(registry);
}

/// The process registry's histogram, or a no-op handle before [`install`].
pub fn histogram(name: &str, labels: &Labels) -> BinnedHistogram {
    match GLOBAL.get() {
        Some(registry) => registry.histogram(name, labels),
        None => BinnedHistogram(None),
    }
}

/// The process registry's counter, or a no-op handle before [`install`].
pub fn counter(name: &str, labels: &Labels, more: &[(&str, &str)]) -> OwnCounter {
    match GLOBAL.get() {
        Some(registry) => registry.counter(name, labels, more),
        None => OwnCounter(BinnedHistogram(None)),
    }
}

/// [`Registry::retire`] on the process registry (nothing before [`install`]).
pub fn retire(names: &[&str], keep: &[Labels]) {
    if let Some(registry) = GLOBAL.get() {
        registry.retire(names, keep);
    }
}

/// [`Registry::forget_worker`] on the process registry (nothing before [`install`]).
pub fn forget_worker(worker: &str) {
    if let Some(registry) = GLOBAL.get() {
        registry.forget_worker(worker);
    }
}

/// Appends the process registry's families (nothing before [`install`]).
pub fn render(out: &mut String) {
    if let Some(registry) = GLOBAL.get() {
        registry.render(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> Registry {
        let mut r = Registry::default();
        r.declare("t_latency_seconds", "A latency.", &[0.001, 0.01, 0.1]);
        r.declare("t_per_step", "Per step.", &[0.0, 1.0, 2.0]);
        r.declare_counter("t_steps_total", "Steps.");
        r
    }

    fn mw(worker: &str) -> Labels {
        Labels::new("m", worker, &[])
    }

    /// Every line for `series` (bucket, sum, count) and its value.
    fn lines<'a>(text: &'a str, prefix: &str) -> Vec<(&'a str, f64)> {
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .map(|l| {
                let (k, v) = l.rsplit_once(' ').unwrap();
                (k, v.parse().unwrap())
            })
            .collect()
    }

    #[test]
    fn a_scaled_counter_renders_its_exact_fractional_total() {
        let mut r = registry();
        r.declare_scaled_counter("t_predicted_total", "Predicted.", 1e-3);
        let c = r.counter("t_predicted_total", &mw("w1"), &[]);
        c.increment(1_250);
        c.increment(500);
        let mut text = String::new();
        r.render(&mut text);
        assert!(
            text.contains("t_predicted_total{model=\"m\",worker=\"w1\"} 1.75\n"),
            "{text}"
        );
    }

    #[test]
    fn bins_match_a_naive_count_with_le_semantics() {
        let r = registry();
        let h = r.histogram("t_latency_seconds", &mw("w"));
        let samples = [0.0005, 0.001, 0.0011, 0.01, 0.05, 0.1, 0.2, 7.0];
        h.observe(samples.iter().map(|&s| (s, 1)));
        h.observe([(0.001, 3)]);
        let mut text = String::new();
        r.render(&mut text);
        let got = lines(&text, "t_latency_seconds");
        let le = |b: f64| samples.iter().filter(|&&s| s <= b).count() as f64;
        let expected = [
            (
                "t_latency_seconds_bucket{model=\"m\",worker=\"w\",le=\"0.001\"}",
                le(0.001) + 3.0,
            ),
            (
                "t_latency_seconds_bucket{model=\"m\",worker=\"w\",le=\"0.01\"}",
                le(0.01) + 3.0,
            ),
            (
                "t_latency_seconds_bucket{model=\"m\",worker=\"w\",le=\"0.1\"}",
                le(0.1) + 3.0,
            ),
            (
                "t_latency_seconds_bucket{model=\"m\",worker=\"w\",le=\"+Inf\"}",
                11.0,
            ),
            (
                "t_latency_seconds_sum{model=\"m\",worker=\"w\"}",
                samples.iter().sum::<f64>() + 0.003,
            ),
            ("t_latency_seconds_count{model=\"m\",worker=\"w\"}", 11.0),
        ];
        assert_eq!(got.len(), expected.len(), "{text}");
        for ((k, v), (ek, ev)) in got.iter().zip(expected) {
            assert_eq!(*k, ek);
            assert!((v - ev).abs() < 1e-12, "{k}: {v} vs {ev}");
        }
        assert!(text.starts_with(
            "# HELP t_latency_seconds A latency.\n# TYPE t_latency_seconds histogram\n"
        ));
    }

    #[test]
    fn one_series_per_label_set_and_integer_bounds_render_plainly() {
        let r = registry();
        r.histogram("t_per_step", &mw("a"))
            .observe([(0.0, 2), (2.0, 1)]);
        r.histogram("t_per_step", &mw("a")).observe([(1.0, 1)]);
        r.histogram("t_per_step", &mw("b")).observe([(5.0, 1)]);
        let mut text = String::new();
        r.render(&mut text);
        assert_eq!(text.matches("# TYPE t_per_step histogram").count(), 1);
        assert!(text.contains("t_per_step_bucket{model=\"m\",worker=\"a\",le=\"0\"} 2\n"));
        assert!(text.contains("t_per_step_bucket{model=\"m\",worker=\"a\",le=\"2\"} 4\n"));
        assert!(text.contains("t_per_step_count{model=\"m\",worker=\"a\"} 4\n"));
        assert!(text.contains("t_per_step_bucket{model=\"m\",worker=\"b\",le=\"2\"} 0\n"));
        assert!(text.contains("t_per_step_bucket{model=\"m\",worker=\"b\",le=\"+Inf\"} 1\n"));
        // A family with no series yet renders nothing.
        assert!(!text.contains("t_latency_seconds"));
    }

    #[test]
    fn label_values_are_escaped_and_unknown_names_record_nothing() {
        let r = registry();
        r.histogram("t_per_step", &mw("we\"ird\\\nid"))
            .observe([(1.0, 1)]);
        r.histogram("no_such_histogram", &mw("w"))
            .observe([(1.0, 1)]);
        let mut text = String::new();
        r.render(&mut text);
        assert!(text.contains("worker=\"we\\\"ird\\\\\\nid\""), "{text}");
        assert!(!text.contains("no_such_histogram"));
        assert_eq!(text.lines().filter(|l| !l.starts_with('#')).count(), 3 + 3);
    }

    #[test]
    fn counters_render_their_sum_with_extra_pairs_after_the_shared_labels() {
        let r = registry();
        let labels = Labels::new("m", "w", &[("proposer", "draft:tiny \"q4\"")]);
        r.counter("t_steps_total", &labels, &[]).increment(3);
        r.counter("t_steps_total", &labels, &[]).increment(0);
        r.counter("t_steps_total", &labels, &[("position", "1")])
            .increment(2);
        let mut text = String::new();
        r.render(&mut text);
        assert!(text.contains("# HELP t_steps_total Steps.\n# TYPE t_steps_total counter\n"));
        let shared = r#"model="m",worker="w",proposer="draft:tiny \"q4\"""#;
        assert!(
            text.contains(&format!("t_steps_total{{{shared}}} 3\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!("t_steps_total{{{shared},position=\"1\"}} 2\n")),
            "{text}"
        );
    }

    #[test]
    fn retire_drops_only_that_workers_series_under_other_labels() {
        let r = registry();
        let old = Labels::new("m", "a", &[("proposer", "ngram")]);
        let new = Labels::new("m", "a", &[("proposer", "suffix")]);
        let other = Labels::new("m", "b", &[("proposer", "ngram")]);
        for labels in [&old, &new, &other] {
            r.counter("t_steps_total", labels, &[("position", "0")])
                .increment(1);
            r.histogram("t_per_step", labels).observe([(1.0, 1)]);
            r.histogram("t_latency_seconds", labels)
                .observe([(0.01, 1)]);
        }
        r.retire(&["t_steps_total", "t_per_step"], std::slice::from_ref(&new));
        let mut text = String::new();
        r.render(&mut text);
        let a_ngram = r#"worker="a",proposer="ngram""#;
        assert!(
            !text
                .lines()
                .any(|l| l.contains(a_ngram) && !l.starts_with("t_latency")),
            "{text}"
        );
        assert!(
            text.contains(r#"t_latency_seconds_count{model="m",worker="a",proposer="ngram"} 1"#)
        );
        for kept in [
            r#"worker="a",proposer="suffix""#,
            r#"worker="b",proposer="ngram""#,
        ] {
            assert!(
                text.contains(&format!(
                    "t_steps_total{{model=\"m\",{kept},position=\"0\"}} 1"
                )),
                "{text}"
            );
            assert!(
                text.contains(&format!("t_per_step_count{{model=\"m\",{kept}}} 1")),
                "{text}"
            );
        }
        // A retired label set comes back at zero when asked for again.
        r.counter("t_steps_total", &old, &[]).increment(0);
        let mut text = String::new();
        r.render(&mut text);
        assert!(text.contains(&format!("t_steps_total{{model=\"m\",{a_ngram}}} 0")));
    }
}
