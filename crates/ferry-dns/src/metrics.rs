//! Prometheus metrics. Per-request counters are resolved once at start-up so the hot path is a
//! single atomic increment.

use std::time::Duration;

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
    latency: Histogram,
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
        let latency = Histogram::new(exponential_buckets(0.000_005, 2.0, 20));
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
        self.latency.observe(elapsed.as_secs_f64());
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
}
