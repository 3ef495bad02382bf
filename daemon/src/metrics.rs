//! The daemon's metrics, in Prometheus text format.

use eventlog::Record;
use replay::Event;
use runtime::session::SessionObserver;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::broadcast;
use uuid::Uuid;

/// Upper bounds of the latency histograms, in seconds.
const BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0,
];

/// A latency histogram with fixed buckets.
#[derive(Default)]
struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    total: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    fn observe(&self, took: Duration) {
        let seconds = took.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|&b| seconds <= b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.total.fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (bound, count) in BUCKETS.iter().zip(&self.counts) {
            cumulative += count.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let total = self.total.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {total}");
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {total}");
    }
}

/// Counters and histograms of the daemon; also the observer that publishes
/// each session's durable head to live event streams.
pub struct Metrics {
    events_appended: AtomicU64,
    prompt_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    barriers: AtomicU64,
    recovered: AtomicU64,
    flush_latency: Histogram,
    model_latency: Histogram,
    first_token_latency: Histogram,
    tool_latency: Histogram,
    heads: broadcast::Sender<(Uuid, u64)>,
    /// The last seq made durable in this process, by session.
    durable_heads: std::sync::Mutex<std::collections::HashMap<Uuid, u64>>,
}

impl Metrics {
    /// Metrics that publish durable heads on `heads`.
    pub fn new(heads: broadcast::Sender<(Uuid, u64)>) -> Metrics {
        Metrics {
            events_appended: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            cached_tokens: AtomicU64::new(0),
            barriers: AtomicU64::new(0),
            recovered: AtomicU64::new(0),
            flush_latency: Histogram::default(),
            model_latency: Histogram::default(),
            first_token_latency: Histogram::default(),
            tool_latency: Histogram::default(),
            heads,
            durable_heads: Default::default(),
        }
    }

    /// The last seq of `session` a barrier in this process made durable;
    /// `None` if no turn ran here (then every record is durable: opening the
    /// log checkpointed it).
    pub fn durable_head(&self, session: Uuid) -> Option<u64> {
        self.durable_heads
            .lock()
            .expect("heads")
            .get(&session)
            .copied()
    }

    /// One more session resumed by recovery.
    pub fn recovered(&self) {
        self.recovered.fetch_add(1, Ordering::Relaxed);
    }

    /// Sessions resumed by recovery so far.
    pub fn recovered_count(&self) -> u64 {
        self.recovered.load(Ordering::Relaxed)
    }

    /// The metrics in Prometheus text format.
    pub fn render(
        &self,
        sessions: &std::collections::HashMap<String, usize>,
        running_turns: usize,
    ) -> String {
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, value: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
            );
        };
        let _ = writeln!(
            out,
            "# HELP mneme_sessions Sessions by status.\n# TYPE mneme_sessions gauge"
        );
        let mut statuses: Vec<_> = sessions.iter().collect();
        statuses.sort();
        for (status, count) in statuses {
            let _ = writeln!(out, "mneme_sessions{{status=\"{status}\"}} {count}");
        }
        let _ = writeln!(out, "# HELP mneme_turns_running Turns running now.\n# TYPE mneme_turns_running gauge\nmneme_turns_running {running_turns}");
        counter(
            &mut out,
            "mneme_events_appended_total",
            "Events appended to the log.",
            self.events_appended.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "mneme_flushes_total",
            "Durability barriers that waited for the disk.",
            self.barriers.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "mneme_sessions_recovered_total",
            "Sessions resumed by recovery on start.",
            self.recovered_count(),
        );
        let prompt = self.prompt_tokens.load(Ordering::Relaxed);
        let cached = self.cached_tokens.load(Ordering::Relaxed);
        counter(
            &mut out,
            "mneme_prompt_tokens_total",
            "Prompt tokens the model servers reported.",
            prompt,
        );
        counter(
            &mut out,
            "mneme_cached_prompt_tokens_total",
            "Prompt tokens served from the servers' prefix caches.",
            cached,
        );
        let ratio = if prompt == 0 {
            0.0
        } else {
            cached as f64 / prompt as f64
        };
        let _ = writeln!(out, "# HELP mneme_prefix_cache_hit_ratio Cached share of prompt tokens since start.\n# TYPE mneme_prefix_cache_hit_ratio gauge\nmneme_prefix_cache_hit_ratio {ratio}");
        self.flush_latency.render(
            &mut out,
            "mneme_flush_latency_seconds",
            "Time a durability barrier took.",
        );
        self.model_latency.render(
            &mut out,
            "mneme_model_latency_seconds",
            "Time from model request to reply.",
        );
        self.first_token_latency.render(
            &mut out,
            "mneme_model_first_token_seconds",
            "Time from model request to the first token of a streamed reply.",
        );
        self.tool_latency.render(
            &mut out,
            "mneme_tool_latency_seconds",
            "Time a tool call ran.",
        );
        out
    }
}

impl SessionObserver for Metrics {
    fn appended(&self, records: &[Record], events: &[Event]) {
        self.events_appended
            .fetch_add(records.len() as u64, Ordering::Relaxed);
        for event in events {
            match event {
                Event::ModelReplied(reply) => {
                    self.model_latency
                        .observe(Duration::from_millis(reply.latency_ms));
                    if reply.first_token_ms > 0 {
                        self.first_token_latency
                            .observe(Duration::from_millis(reply.first_token_ms));
                    }
                    self.prompt_tokens
                        .fetch_add(reply.usage.prompt_tokens, Ordering::Relaxed);
                    self.cached_tokens
                        .fetch_add(reply.usage.cached_tokens, Ordering::Relaxed);
                }
                Event::ToolFinished { duration_ms, .. } => self
                    .tool_latency
                    .observe(Duration::from_millis(*duration_ms)),
                _ => {}
            }
        }
    }

    fn durable(&self, session: Uuid, seq: u64, took: Duration) {
        self.durable_heads
            .lock()
            .expect("heads")
            .insert(session, seq);
        self.barriers.fetch_add(1, Ordering::Relaxed);
        self.flush_latency.observe(took);
        // Nobody listening is fine.
        let _ = self.heads.send((session, seq));
    }
}
