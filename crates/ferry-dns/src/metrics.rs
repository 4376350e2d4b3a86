//! Prometheus metrics. Per-request counters are resolved once at start-up so the hot path is a
//! single atomic increment; the request latency histogram is lock-free and observed once per
//! batch of requests answered together.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::wire::*;

const QTYPES: [(u16, &str); 9] = [
    (TYPE_A, "A"),
    (TYPE_AAAA, "AAAA"),
    (TYPE_SRV, "SRV"),
    (TYPE_PTR, "PTR"),
    (TYPE_TXT, "TXT"),
    (TYPE_SOA, "SOA"),
    (TYPE_NS, "NS"),
    (TYPE_CNAME, "CNAME"),
    (TYPE_ANY, "ANY"),
];
const RCODES: [(u16, &str); 7] = [
    (RCODE_NOERROR, "NOERROR"),
    (RCODE_FORMERR, "FORMERR"),
    (RCODE_SERVFAIL, "SERVFAIL"),
    (RCODE_NXDOMAIN, "NXDOMAIN"),
    (RCODE_NOTIMP, "NOTIMP"),
    (RCODE_REFUSED, "REFUSED"),
    (RCODE_BADVERS, "BADVERS"),
];

type Labels = Vec<(&'static str, &'static str)>;

/// All metrics of `ferry dns`.
pub struct Metrics {
    registry: Registry,
    /// [qtype index][rcode index], last rows/columns are "other".
    requests: Vec<Vec<Counter>>,
    latency: BatchHistogram,
    pub answer_cache_hits: Counter,
    pub answer_cache_misses: Counter,
    pub forward_cache_hits: Counter,
    pub forward_cache_misses: Counter,
    pub forward_failures: Counter,
    pub refused_recursion: Counter,
    pub dropped: Counter,
    pub programming_latency: Histogram,
    pub index_services: Gauge,
    pub index_pods: Gauge,
    pub ready: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("ferry_dns");
        let family = Family::<Labels, Counter>::default();
        let mut requests = Vec::new();
        for qt in QTYPES.iter().map(|q| q.1).chain(["other"]) {
            let row = RCODES
                .iter()
                .map(|r| r.1)
                .chain(["other"])
                .map(|rc| {
                    family
                        .get_or_create(&vec![("type", qt), ("rcode", rc)])
                        .clone()
                })
                .collect();
            requests.push(row);
        }
        registry.register(
            "requests",
            "DNS requests by query type and response code",
            family,
        );
        let latency = BatchHistogram::new(exponential_buckets(0.000_005, 2.0, 20));
        registry.register(
            "request_duration_seconds",
            "Time to answer a request",
            latency.clone(),
        );
        let c = |registry: &mut Registry, name: &str, help: &str| {
            let c = Counter::default();
            registry.register(name, help, c.clone());
            c
        };
        let answer_cache_hits = c(
            &mut registry,
            "answer_cache_hits",
            "Encoded cluster answers reused",
        );
        let answer_cache_misses = c(
            &mut registry,
            "answer_cache_misses",
            "Cluster answers computed",
        );
        let forward_cache_hits = c(
            &mut registry,
            "forward_cache_hits",
            "Forwarded names answered from the cache",
        );
        let forward_cache_misses = c(
            &mut registry,
            "forward_cache_misses",
            "Forwarded names sent upstream",
        );
        let forward_failures = c(
            &mut registry,
            "forward_failures",
            "Upstream exchanges that failed",
        );
        let refused_recursion = c(
            &mut registry,
            "refused_recursion",
            "Non-cluster queries refused (client not allowed to recurse)",
        );
        let dropped = c(
            &mut registry,
            "dropped",
            "Packets dropped without an answer",
        );
        let programming_latency = Histogram::new(exponential_buckets(0.000_01, 2.0, 22));
        registry.register(
            "programming_duration_seconds",
            "Time from receiving an object change from the API server to answers reflecting it",
            programming_latency.clone(),
        );
        let index_services = Gauge::default();
        registry.register(
            "index_services",
            "Services in the index",
            index_services.clone(),
        );
        let index_pods = Gauge::default();
        registry.register("index_pods", "Pods in the index", index_pods.clone());
        let ready = Gauge::default();
        registry.register(
            "ready",
            "1 after the first full sync of every watch",
            ready.clone(),
        );
        Metrics {
            registry,
            requests,
            latency,
            answer_cache_hits,
            answer_cache_misses,
            forward_cache_hits,
            forward_cache_misses,
            forward_failures,
            refused_recursion,
            dropped,
            programming_latency,
            index_services,
            index_pods,
            ready,
        }
    }

    /// Counts one answered request.
    pub fn observe(&self, qtype: u16, rcode: u16, elapsed: Duration) {
        self.count(qtype, rcode);
        self.latency.observe_n(elapsed, 1);
    }

    /// Counts requests answered together (one batch), each taking `elapsed`.
    pub fn observe_batch(&self, labels: &[(u16, u16)], elapsed: Duration) {
        for &(qtype, rcode) in labels {
            self.count(qtype, rcode);
        }
        self.latency.observe_n(elapsed, labels.len() as u64);
    }

    fn count(&self, qtype: u16, rcode: u16) {
        let qi = QTYPES
            .iter()
            .position(|q| q.0 == qtype)
            .unwrap_or(QTYPES.len());
        let ri = RCODES
            .iter()
            .position(|r| r.0 == rcode)
            .unwrap_or(RCODES.len());
        if let Some(c) = self.requests.get(qi).and_then(|row| row.get(ri)) {
            c.inc();
        }
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// A histogram of durations without a lock: `n` observations of one value are two atomic
/// additions (the request latency is observed per batch, from several worker threads).
#[derive(Debug, Clone)]
pub struct BatchHistogram {
    inner: Arc<BatchHistogramInner>,
}

#[derive(Debug)]
struct BatchHistogramInner {
    /// Upper bounds in seconds; the last is `f64::MAX` (+Inf).
    bounds: Vec<f64>,
    counts: Vec<AtomicU64>,
    sum_nanos: AtomicU64,
}

impl BatchHistogram {
    pub fn new(bounds: impl IntoIterator<Item = f64>) -> Self {
        let bounds: Vec<f64> = bounds.into_iter().chain([f64::MAX]).collect();
        let counts = bounds.iter().map(|_| AtomicU64::new(0)).collect();
        BatchHistogram {
            inner: Arc::new(BatchHistogramInner {
                bounds,
                counts,
                sum_nanos: AtomicU64::new(0),
            }),
        }
    }

    /// Records `n` observations of `v`.
    pub fn observe_n(&self, v: Duration, n: u64) {
        if n == 0 {
            return;
        }
        let inner = &*self.inner;
        let secs = v.as_secs_f64();
        let i = inner
            .bounds
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(inner.bounds.len() - 1);
        if let Some(c) = inner.counts.get(i) {
            c.fetch_add(n, Ordering::Relaxed);
        }
        let nanos = u64::try_from(v.as_nanos()).unwrap_or(u64::MAX);
        inner
            .sum_nanos
            .fetch_add(nanos.saturating_mul(n), Ordering::Relaxed);
    }
}

impl TypedMetric for BatchHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for BatchHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let inner = &*self.inner;
        let buckets: Vec<(f64, u64)> = inner
            .bounds
            .iter()
            .zip(&inner.counts)
            .map(|(&b, c)| (b, c.load(Ordering::Relaxed)))
            .collect();
        // The count as the buckets' total, so that a scrape during an update stays consistent.
        let count = buckets.iter().map(|b| b.1).sum();
        let sum = inner.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_counts() {
        let m = Metrics::new();
        m.observe(TYPE_A, RCODE_NOERROR, Duration::from_micros(20));
        m.observe(99, 77, Duration::from_micros(20));
        let text = m.encode();
        assert!(
            text.contains(r#"ferry_dns_requests_total{type="A",rcode="NOERROR"} 1"#),
            "{text}"
        );
        assert!(text.contains(r#"ferry_dns_requests_total{type="other",rcode="other"} 1"#));
        assert!(text.contains("ferry_dns_request_duration_seconds_count 2"));
    }

    #[test]
    fn batches_count_each_request() {
        let m = Metrics::new();
        m.observe_batch(
            &[
                (TYPE_A, RCODE_NOERROR),
                (TYPE_A, RCODE_NOERROR),
                (TYPE_SRV, RCODE_NXDOMAIN),
            ],
            Duration::from_micros(30),
        );
        m.observe_batch(&[], Duration::from_secs(1));
        m.observe(TYPE_A, RCODE_NOERROR, Duration::from_secs(100));
        let text = m.encode();
        for want in [
            r#"ferry_dns_requests_total{type="A",rcode="NOERROR"} 3"#,
            r#"ferry_dns_requests_total{type="SRV",rcode="NXDOMAIN"} 1"#,
            "ferry_dns_request_duration_seconds_count 4",
            "ferry_dns_request_duration_seconds_sum 100.00009",
            // 30 us: above the 20 us bound, within 40 us; 100 s only in +Inf.
            r#"ferry_dns_request_duration_seconds_bucket{le="0.00002"} 0"#,
            r#"ferry_dns_request_duration_seconds_bucket{le="0.00004"} 3"#,
            r#"ferry_dns_request_duration_seconds_bucket{le="2.62144"} 3"#,
            r#"ferry_dns_request_duration_seconds_bucket{le="+Inf"} 4"#,
        ] {
            assert!(text.contains(want), "{want} in\n{text}");
        }
    }
}
