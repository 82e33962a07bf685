//! Prometheus histograms for observations that arrive one per row of a step batch (inter-token
//! latency, accepted drafts per step). The ingest bins a whole batch's observations under one
//! uncontended lock; metrics-exporter-prometheus instead reads a clock and pushes a timestamped
//! sample per observation and bins them at its next upkeep, which measured ~30% of a 512-row
//! batch's processing time (docs/benchmarks.md, token-processor). The series render after the
//! exporter's own text on `/metrics`, in the same exposition format; names, help and buckets are
//! declared in `metrics.rs` with every other metric.

use std::fmt::Write;
use std::sync::{Arc, Mutex, OnceLock};

/// One histogram name: its help text, bucket upper bounds, and one series per label set.
#[derive(Debug)]
struct Family {
    name: &'static str,
    help: &'static str,
    bounds: Arc<[f64]>,
    series: Mutex<Vec<Arc<Series>>>,
}

#[derive(Debug)]
struct Series {
    /// Rendered label pairs, escaped: `model="m",worker="w"`.
    labels: String,
    bins: Mutex<Bins>,
}

#[derive(Debug, Clone, PartialEq)]
struct Bins {
    /// Entry `i`: observations `<= bounds[i]` and above the previous bound; the last entry is
    /// the overflow (`+Inf` only).
    counts: Box<[u64]>,
    sum: f64,
}

/// Every binned histogram family of the process.
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
        self.families.push(Family {
            name,
            help,
            bounds: bounds.into(),
            series: Mutex::new(Vec::new()),
        });
    }

    /// The series of `name` for (`model`, `worker`), created at zero on first use. Unknown
    /// names give a handle that records nothing (as the `metrics` macros do without a recorder).
    pub fn histogram(&self, name: &str, model: &str, worker: &str) -> BinnedHistogram {
        let Some(family) = self.families.iter().find(|f| f.name == name) else {
            return BinnedHistogram(None);
        };
        let labels = format!("model=\"{}\",worker=\"{}\"", escape(model), escape(worker));
        let mut series = family.series.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(existing) = series.iter().find(|s| s.labels == labels) {
            return BinnedHistogram(Some((existing.clone(), family.bounds.clone())));
        }
        let created = Arc::new(Series {
            labels,
            bins: Mutex::new(Bins {
                counts: vec![0; family.bounds.len() + 1].into_boxed_slice(),
                sum: 0.0,
            }),
        });
        series.push(created.clone());
        BinnedHistogram(Some((created, family.bounds.clone())))
    }

    /// Appends every family with at least one series, in the Prometheus text format.
    pub fn render(&self, out: &mut String) {
        for family in &self.families {
            let series = family.series.lock().unwrap_or_else(|e| e.into_inner());
            if series.is_empty() {
                continue;
            }
            let name = family.name;
            let _ = writeln!(out, "# HELP {name} {}", family.help);
            let _ = writeln!(out, "# TYPE {name} histogram");
            for s in series.iter() {
                let bins = s.bins.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let labels = &s.labels;
                let mut cumulative = 0u64;
                for (bound, n) in family.bounds.iter().zip(bins.counts.iter()) {
                    cumulative += n;
                    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {cumulative}");
                }
                cumulative += bins.counts.last().copied().unwrap_or(0);
                let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {cumulative}");
                let _ = writeln!(out, "{name}_sum{{{labels}}} {}", bins.sum);
                let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
            }
        }
    }
}

/// A handle on one series; cheap to clone.
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

/// The process registry's series, or a no-op handle before [`install`].
pub fn histogram(name: &str, model: &str, worker: &str) -> BinnedHistogram {
    match GLOBAL.get() {
        Some(registry) => registry.histogram(name, model, worker),
        None => BinnedHistogram(None),
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
        r
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
    fn bins_match_a_naive_count_with_le_semantics() {
        let r = registry();
        let h = r.histogram("t_latency_seconds", "m", "w");
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
        r.histogram("t_per_step", "m", "a")
            .observe([(0.0, 2), (2.0, 1)]);
        r.histogram("t_per_step", "m", "a").observe([(1.0, 1)]);
        r.histogram("t_per_step", "m", "b").observe([(5.0, 1)]);
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
        r.histogram("t_per_step", "m", "we\"ird\\\nid")
            .observe([(1.0, 1)]);
        r.histogram("no_such_histogram", "m", "w")
            .observe([(1.0, 1)]);
        let mut text = String::new();
        r.render(&mut text);
        assert!(text.contains("worker=\"we\\\"ird\\\\\\nid\""), "{text}");
        assert!(!text.contains("no_such_histogram"));
        assert_eq!(text.lines().filter(|l| !l.starts_with('#')).count(), 3 + 3);
    }
}
