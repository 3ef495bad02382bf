//! The daemon's metrics, in the Prometheus text format (0.0.4), kept and
//! rendered by `prometheus-client`.

use eventlog::Record;
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use replay::Event;
use runtime::SessionObserver;
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::Duration;
use uuid::Uuid;

/// The `Content-Type` of `/metrics`.
pub(crate) const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Upper bounds of the latency histograms, in seconds.
const BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0,
];

/// Counters and histograms of the daemon, told what sessions append and
/// make durable. (Counters are registered without their `_total`, which
/// the encoder adds; help texts without their final period, likewise.)
pub struct Metrics {
    registry: Registry,
    events_appended: Counter,
    prompt_tokens: Counter,
    cached_tokens: Counter,
    flushes: Counter,
    recovered: Counter,
    flush_latency: Histogram,
    model_latency: Histogram,
    first_token_latency: Histogram,
    tool_latency: Histogram,
    cache_misses: Family<[(&'static str, String); 1], Counter>,
    /// Per session, what decides whether its next reply missed the prefix
    /// cache (at most [`MAX_WATCHED`] sessions; see [`Metrics::watch`]).
    watches: Mutex<HashMap<Uuid, replay::cache::MissWatch>>,
}

/// Sessions whose cache misses are watched at once. Past it the watches
/// start again empty, so at worst the next reply of a session forgotten
/// is not counted (`mneme replay --cache` still finds it).
const MAX_WATCHED: usize = 4096;

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl Metrics {
    /// Every metric at zero.
    pub fn new() -> Metrics {
        let histogram = || Histogram::new(BUCKETS);
        let metrics = Metrics {
            registry: Registry::default(),
            events_appended: Counter::default(),
            prompt_tokens: Counter::default(),
            cached_tokens: Counter::default(),
            flushes: Counter::default(),
            recovered: Counter::default(),
            flush_latency: histogram(),
            model_latency: histogram(),
            first_token_latency: histogram(),
            tool_latency: histogram(),
            cache_misses: Family::default(),
            watches: Mutex::default(),
        };
        let mut registry = Registry::default();
        for (name, help, counter) in [
            (
                "mneme_events_appended",
                "Events appended to the log",
                &metrics.events_appended,
            ),
            (
                "mneme_flushes",
                "Durability barriers that waited for the disk",
                &metrics.flushes,
            ),
            (
                "mneme_sessions_recovered",
                "Sessions resumed by recovery on start",
                &metrics.recovered,
            ),
            (
                "mneme_prompt_tokens",
                "Prompt tokens the model servers reported",
                &metrics.prompt_tokens,
            ),
            (
                "mneme_cached_prompt_tokens",
                "Prompt tokens served from the servers' prefix caches",
                &metrics.cached_tokens,
            ),
        ] {
            registry.register(name, help, counter.clone());
        }
        for (name, help, histogram) in [
            (
                "mneme_flush_latency_seconds",
                "Time a durability barrier took",
                &metrics.flush_latency,
            ),
            (
                "mneme_model_latency_seconds",
                "Time from model request to reply",
                &metrics.model_latency,
            ),
            (
                "mneme_model_first_token_seconds",
                "Time from model request to the first token of a streamed reply",
                &metrics.first_token_latency,
            ),
            (
                "mneme_tool_latency_seconds",
                "Time a tool call ran",
                &metrics.tool_latency,
            ),
        ] {
            registry.register(name, help, histogram.clone());
        }
        registry.register(
            "mneme_cache_misses",
            "Replies that read less from the server's prefix cache than the request before made cacheable, by the recorded cause",
            metrics.cache_misses.clone(),
        );
        Metrics {
            registry,
            ..metrics
        }
    }

    /// One more session resumed by recovery.
    pub fn recovered(&self) {
        self.recovered.inc();
    }

    /// Notes `event`, appended to `session`, in that session's watch: a
    /// reply that missed the prefix cache is counted by its cause.
    fn watch(&self, session: Uuid, event: &Event) {
        let mut watches = self.watches.lock().unwrap_or_else(|e| e.into_inner());
        if watches.len() >= MAX_WATCHED && !watches.contains_key(&session) {
            watches.clear();
        }
        if let Some(short) = watches.entry(session).or_default().note(event) {
            self.cache_misses
                .get_or_create(&[("cause", short.recorded_cause())])
                .inc();
        }
    }

    /// Sessions resumed by recovery so far.
    pub fn recovered_count(&self) -> u64 {
        self.recovered.get()
    }

    /// The metrics in the Prometheus text format: the gauges of this moment
    /// (sessions by status, turns running, the prefix cache's hit ratio),
    /// then the counters and histograms.
    pub fn render(
        &self,
        sessions: &HashMap<String, usize>,
        running_turns: usize,
        queued_turns: usize,
    ) -> String {
        let mut now = Registry::default();
        let by_status = Family::<[(&'static str, String); 1], Gauge>::default();
        for (status, count) in sessions {
            by_status
                .get_or_create(&[("status", status.clone())])
                .set(*count as i64);
        }
        now.register("mneme_sessions", "Sessions by status", by_status);
        let running = Gauge::<i64>::default();
        running.set(running_turns as i64);
        now.register("mneme_turns_running", "Turns running now", running);
        let queued = Gauge::<i64>::default();
        queued.set(queued_turns as i64);
        now.register(
            "mneme_turns_queued",
            "Turns waiting for their place (--max-running-turns, a tenant's max_running_turns)",
            queued,
        );
        let (prompt, cached) = (self.prompt_tokens.get(), self.cached_tokens.get());
        let ratio = Gauge::<f64, AtomicU64>::default();
        ratio.set(if prompt == 0 {
            0.0
        } else {
            cached as f64 / prompt as f64
        });
        now.register(
            "mneme_prefix_cache_hit_ratio",
            "Cached share of prompt tokens since start",
            ratio,
        );
        let mut out = String::new();
        prometheus_text::encode(&mut out, &now).expect("a String takes any text");
        prometheus_text::encode(&mut out, &self.registry).expect("a String takes any text");
        out
    }
}

/// Sessions by status, alone: what a tenant's `/metrics` shows of its
/// sessions.
pub(crate) fn render_sessions(sessions: &HashMap<String, usize>) -> String {
    let mut now = Registry::default();
    let by_status = Family::<[(&'static str, String); 1], Gauge>::default();
    for (status, count) in sessions {
        by_status
            .get_or_create(&[("status", status.clone())])
            .set(*count as i64);
    }
    now.register("mneme_sessions", "Sessions by status", by_status);
    let mut out = String::new();
    prometheus_text::encode(&mut out, &now).expect("a String takes any text");
    out
}

/// What sessions spent, by tenant (`tenant=""`: the operator's own),
/// summed from their logs: `mneme_spend_cost` (in their agents' prices),
/// `mneme_spend_model_calls`, `mneme_spend_prompt_tokens`,
/// `mneme_spend_completion_tokens`, `mneme_spend_cached_tokens`. Gauges:
/// each is a sum read from the log at the scrape.
pub(crate) fn render_spend(report: &api::SpendReport) -> String {
    type ByTenant<G> = Family<[(&'static str, String); 1], G>;
    let cost = ByTenant::<Gauge<f64, AtomicU64>>::default();
    let counts: [(&str, &str, ByTenant<Gauge>); 4] = [
        (
            "mneme_spend_model_calls",
            "Model requests answered, by tenant",
            Family::default(),
        ),
        (
            "mneme_spend_prompt_tokens",
            "Prompt tokens, by tenant",
            Family::default(),
        ),
        (
            "mneme_spend_completion_tokens",
            "Completion tokens, by tenant",
            Family::default(),
        ),
        (
            "mneme_spend_cached_tokens",
            "Prompt tokens served from the cache, by tenant",
            Family::default(),
        ),
    ];
    for row in &report.rows {
        let label = [("tenant", row.tenant.clone().unwrap_or_default())];
        cost.get_or_create(&label).set(row.cost);
        let values = [
            row.model_calls,
            row.prompt_tokens,
            row.completion_tokens,
            row.cached_tokens,
        ];
        for ((_, _, family), value) in counts.iter().zip(values) {
            family
                .get_or_create(&label)
                .set(value.min(i64::MAX as u64) as i64);
        }
    }
    let mut now = Registry::default();
    now.register(
        "mneme_spend_cost",
        "Cost of model requests in their agents' prices, by tenant",
        cost,
    );
    for (name, help, family) in counts {
        now.register(name, help, family);
    }
    let mut out = String::new();
    prometheus_text::encode(&mut out, &now).expect("a String takes any text");
    out
}

impl SessionObserver for Metrics {
    fn appended(&self, records: &[Record], events: &[Event]) {
        self.events_appended.inc_by(records.len() as u64);
        for (record, event) in records.iter().zip(events) {
            self.watch(record.envelope.session, event);
            match event {
                Event::ModelReplied(reply) => {
                    self.model_latency
                        .observe(Duration::from_millis(reply.latency_ms).as_secs_f64());
                    if reply.first_token_ms > 0 {
                        self.first_token_latency
                            .observe(Duration::from_millis(reply.first_token_ms).as_secs_f64());
                    }
                    self.prompt_tokens.inc_by(reply.usage.prompt_tokens);
                    self.cached_tokens.inc_by(reply.usage.cached_tokens);
                }
                Event::ToolFinished { duration_ms, .. } => self
                    .tool_latency
                    .observe(Duration::from_millis(*duration_ms).as_secs_f64()),
                _ => {}
            }
        }
    }

    fn durable(&self, _session: Uuid, _seq: u64, took: Duration) {
        self.flushes.inc();
        self.flush_latency.observe(took.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names, types and values the tests and dashboards read.
    #[test]
    fn renders_the_names_it_always_had() {
        let metrics = Metrics::new();
        metrics.recovered();
        metrics.durable(Uuid::nil(), 3, Duration::from_millis(2));
        let sessions = HashMap::from([("idle".to_string(), 2)]);
        let text = metrics.render(&sessions, 1, 0);
        for line in [
            "# TYPE mneme_sessions gauge",
            "mneme_sessions{status=\"idle\"} 2",
            "mneme_turns_running 1",
            "# HELP mneme_events_appended_total Events appended to the log.",
            "# TYPE mneme_events_appended_total counter",
            "mneme_events_appended_total 0",
            "mneme_flushes_total 1",
            "mneme_sessions_recovered_total 1",
            "mneme_prompt_tokens_total 0",
            "mneme_cached_prompt_tokens_total 0",
            "mneme_prefix_cache_hit_ratio 0.0",
            "# TYPE mneme_flush_latency_seconds histogram",
            "mneme_flush_latency_seconds_bucket{le=\"+Inf\"} 1",
            "mneme_flush_latency_seconds_count 1",
            "# TYPE mneme_tool_latency_seconds histogram",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        assert!(!text.contains("# EOF"), "{text}");
    }

    /// A reply that read less than the one before made cacheable is
    /// counted by the event that changed the request, or as evicted.
    #[test]
    fn counts_cache_misses_by_their_recorded_cause() {
        let metrics = Metrics::new();
        let session = Uuid::now_v7();
        let reply = |prompt: u64, cached: u64| {
            let mut reply = replay::ModelReply::default();
            reply.usage.prompt_tokens = prompt;
            reply.usage.cached_tokens = cached;
            Event::ModelReplied(reply)
        };
        let compacted = Event::ContextCompacted {
            entries: 2,
            covers: (2, 5),
            summary: "s".into(),
        };
        for event in [
            reply(2000, 0),
            reply(2100, 1990),
            reply(2200, 0),
            compacted,
            reply(900, 0),
        ] {
            metrics.watch(session, &event);
        }
        // Another session's first reply has nothing before it to miss.
        metrics.watch(Uuid::now_v7(), &reply(5000, 0));
        let text = metrics.render(&HashMap::new(), 0, 0);
        for line in [
            "# TYPE mneme_cache_misses_total counter",
            "mneme_cache_misses_total{cause=\"evicted\"} 1",
            "mneme_cache_misses_total{cause=\"compaction\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
    }
}
