//! Prometheus metrics of NetworkPolicy enforcement, for one or several nodes of a process, on
//! an HTTP `/metrics` endpoint (`/healthz` too).
//!
//! - The verdict log as counters, read from the kernel on each scrape (the counted rules of
//!   Ferry's table in every node namespace, see [`crate::log`]):
//!   `ferry_netpol_denied_packets_total{node,direction,pod}` and
//!   `ferry_netpol_allowed_packets_total{node,direction,policy,rule}`. A counter restarts when
//!   the pod chain holding it is rewritten (its set of policies changed); Prometheus' `rate()`
//!   treats that as a counter reset.
//! - The sync loop: `ferry_netpol_syncs_total{node,result}`,
//!   `ferry_netpol_sync_programming_latency_seconds{node}` (from the first change a watch
//!   recorded to the kernel holding it: the "API write to enforced" delay without the watch's
//!   own delivery), `ferry_netpol_sync_apply_seconds{node}` (render + diff + `nft -f`),
//!   `ferry_netpol_pod_chains{node}`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::agent::Subscriber;
use crate::apply::Target;
use crate::log::{CounterRow, counters};

type Labels = Vec<(String, String)>;
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 1 ms .. ~16 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// One node whose table the metrics read.
#[derive(Debug, Clone)]
struct NodeEntry {
    target: Target,
    tracker: Option<Subscriber>,
}

/// The nodes registered with [`Metrics::add_node`].
#[derive(Debug, Default)]
struct Nodes(Mutex<BTreeMap<String, NodeEntry>>);

impl Nodes {
    fn snapshot(&self) -> Vec<(String, NodeEntry)> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// Reads every node's counted rules on each scrape.
#[derive(Debug)]
struct VerdictCollector {
    nodes: Arc<Nodes>,
}

/// The verdict counters of one node, as (labels, packets) per metric.
#[derive(Debug, Default, PartialEq)]
pub struct VerdictSamples {
    pub denied: Vec<(Labels, u64)>,
    pub allowed: Vec<(Labels, u64)>,
}

/// Labels of the verdict log's rows (pure).
pub fn verdict_samples(node: &str, rows: &[CounterRow]) -> VerdictSamples {
    let mut out = VerdictSamples::default();
    let l = |k: &str, v: &str| (k.to_string(), v.to_string());
    for r in rows {
        if r.verdict == "deny" {
            out.denied.push((
                vec![
                    l("node", node),
                    l("direction", &r.direction),
                    l("pod", &r.subject),
                ],
                r.packets,
            ));
        } else {
            // `NS/POLICY ingress[K]`
            let (policy, rule) = r.subject.split_once(' ').unwrap_or((&r.subject, ""));
            out.allowed.push((
                vec![
                    l("node", node),
                    l("direction", &r.direction),
                    l("policy", policy),
                    l("rule", rule),
                ],
                r.packets,
            ));
        }
    }
    out
}

/// Writes the two verdict families.
fn encode_verdicts(all: &VerdictSamples, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
    for (name, help, samples) in [
        (
            "ferry_netpol_denied_packets",
            "Connections (first packets) denied by NetworkPolicy, per isolated pod and direction.",
            &all.denied,
        ),
        (
            "ferry_netpol_allowed_packets",
            "Connections (first packets) allowed by a NetworkPolicy rule.",
            &all.allowed,
        ),
    ] {
        let mut m =
            encoder.encode_descriptor(name, help, None, ConstCounter::new(0u64).metric_type())?;
        for (labels, v) in samples {
            let fam = m.encode_family(labels)?;
            ConstCounter::new(*v).encode(fam)?;
        }
    }
    Ok(())
}

/// Fixed samples (what `ferry netpol log --prometheus` read once).
#[derive(Debug)]
struct StaticVerdicts(VerdictSamples);

impl Collector for StaticVerdicts {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        encode_verdicts(&self.0, &mut encoder)
    }
}

/// The verdict counters of one node's rows as OpenMetrics text, with the same names and
/// labels as the `/metrics` endpoint.
pub fn verdicts_text(node: &str, rows: &[CounterRow]) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(StaticVerdicts(verdict_samples(node, rows))));
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &registry) {
        tracing::warn!("encoding netpol counters: {e}");
    }
    out
}

impl Collector for VerdictCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut all = VerdictSamples::default();
        for (node, entry) in self.nodes.snapshot() {
            match entry.target.list_json() {
                Ok(Some(json)) => {
                    let s = verdict_samples(&node, &counters(&json));
                    all.denied.extend(s.denied);
                    all.allowed.extend(s.allowed);
                }
                Ok(None) => {}
                Err(e) => tracing::debug!(%node, "netpol metrics: reading counters: {e}"),
            }
        }
        encode_verdicts(&all, &mut encoder)
    }
}

/// The metrics of the enforcement of every node of this process.
pub struct Metrics {
    registry: Registry,
    nodes: Arc<Nodes>,
    syncs: Family<Labels, Counter>,
    programming_latency: HistogramFamily,
    apply_seconds: HistogramFamily,
    pod_chains: Family<Labels, Gauge>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("nodes", &self.nodes)
            .finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let nodes = Arc::new(Nodes::default());
        let syncs = Family::<Labels, Counter>::default();
        registry.register(
            "ferry_netpol_syncs",
            "Sync loop runs, by result (ok, error).",
            syncs.clone(),
        );
        let programming_latency: HistogramFamily =
            Family::new_with_constructor(latency_histogram as fn() -> Histogram);
        registry.register(
            "ferry_netpol_sync_programming_latency_seconds",
            "From the first change a watch recorded to the kernel enforcing it.",
            programming_latency.clone(),
        );
        let apply_seconds: HistogramFamily =
            Family::new_with_constructor(latency_histogram as fn() -> Histogram);
        registry.register(
            "ferry_netpol_sync_apply_seconds",
            "Render, diff and nft transaction of one sync.",
            apply_seconds.clone(),
        );
        let pod_chains = Family::<Labels, Gauge>::default();
        registry.register(
            "ferry_netpol_pod_chains",
            "Per-pod chains (isolated pods and directions) of the node's table.",
            pod_chains.clone(),
        );
        registry.register_collector(Box::new(VerdictCollector {
            nodes: nodes.clone(),
        }));
        Metrics {
            registry,
            nodes,
            syncs,
            programming_latency,
            apply_seconds,
            pod_chains,
        }
    }

    /// Makes a node's table (and, for `/healthz`, its change tracker) part of the metrics.
    pub fn add_node(&self, node: &str, target: Target, tracker: Option<Subscriber>) {
        self.nodes
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(node.to_string(), NodeEntry { target, tracker });
    }

    fn node(node: &str) -> Labels {
        vec![("node".to_string(), node.to_string())]
    }

    /// Records one sync of `node`: its result, how long the oldest change it applied had
    /// waited (`pending`), how long render + apply took, and the pod chains.
    pub fn record_sync(
        &self,
        node: &str,
        ok: bool,
        pending: Option<Duration>,
        apply: Duration,
        chains: Option<usize>,
    ) {
        let mut l = Self::node(node);
        l.push((
            "result".to_string(),
            if ok { "ok" } else { "error" }.to_string(),
        ));
        self.syncs.get_or_create(&l).inc();
        let l = Self::node(node);
        if ok && let Some(p) = pending {
            self.programming_latency
                .get_or_create(&l)
                .observe(p.as_secs_f64());
        }
        self.apply_seconds
            .get_or_create(&l)
            .observe(apply.as_secs_f64());
        if let Some(c) = chains {
            self.pod_chains
                .get_or_create(&l)
                .set(i64::try_from(c).unwrap_or(i64::MAX));
        }
    }

    /// The OpenMetrics text (reads the kernel counters: call off the async runtime).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!("encoding netpol metrics: {e}");
        }
        out
    }

    /// Nodes whose oldest unapplied change has waited longer than `max` (kube-proxy's health
    /// rule: unhealthy only when an update has waited too long).
    pub fn stale_nodes(&self, max: Duration) -> Vec<String> {
        self.nodes
            .snapshot()
            .into_iter()
            .filter(|(_, e)| {
                e.tracker
                    .as_ref()
                    .and_then(|t| t.pending_for())
                    .is_some_and(|p| p > max)
            })
            .map(|(n, _)| n)
            .collect()
    }
}

/// How long a change may wait before `/healthz` says so.
pub const HEALTH_MAX_PENDING: Duration = Duration::from_secs(30);

async fn respond(metrics: Arc<Metrics>, path: String) -> Response<Full<Bytes>> {
    let (status, ctype, body) = match path.as_str() {
        "/metrics" => {
            let m = metrics.clone();
            match tokio::task::spawn_blocking(move || m.encode()).await {
                Ok(text) => (
                    StatusCode::OK,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    text,
                ),
                Err(e) => (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain",
                    e.to_string(),
                ),
            }
        }
        "/healthz" | "/livez" => {
            let stale = metrics.stale_nodes(HEALTH_MAX_PENDING);
            if stale.is_empty() {
                (StatusCode::OK, "text/plain", "ok".to_string())
            } else {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    format!(
                        "NetworkPolicy changes waiting more than {}s on node(s) {}",
                        HEALTH_MAX_PENDING.as_secs(),
                        stale.join(", ")
                    ),
                )
            }
        }
        _ => (StatusCode::NOT_FOUND, "text/plain", "not found".to_string()),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    if let Ok(v) = http::HeaderValue::from_str(ctype) {
        resp.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    resp
}

/// Serves `/metrics` and `/healthz` on `listener` until `cancel`.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, cancel: CancellationToken) {
    loop {
        let (stream, _) = tokio::select! {
            _ = cancel.cancelled() => return,
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!("netpol metrics accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let metrics = metrics.clone();
        let stop = cancel.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                let m = metrics.clone();
                let path = req.uri().path().to_string();
                async move { Ok::<_, Infallible>(respond(m, path).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), svc);
            tokio::select! {
                _ = conn => {}
                _ = stop.cancelled() => {}
            }
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn row(verdict: &str, direction: &str, subject: &str, packets: u64) -> CounterRow {
        CounterRow {
            verdict: verdict.into(),
            subject: subject.into(),
            direction: direction.into(),
            packets,
            bytes: packets * 60,
        }
    }

    #[test]
    fn verdict_rows_become_labelled_samples() {
        let s = verdict_samples(
            "n1",
            &[
                row("deny", "ingress", "x/a", 3),
                row("allow", "egress", "x/allow-dns egress[0]", 7),
            ],
        );
        let l = |v: &[(&str, &str)]| -> Labels {
            v.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        assert_eq!(
            s.denied,
            vec![(
                l(&[("node", "n1"), ("direction", "ingress"), ("pod", "x/a")]),
                3
            )]
        );
        assert_eq!(
            s.allowed,
            vec![(
                l(&[
                    ("node", "n1"),
                    ("direction", "egress"),
                    ("policy", "x/allow-dns"),
                    ("rule", "egress[0]")
                ]),
                7
            )]
        );
    }

    #[test]
    fn sync_metrics_and_health() {
        let m = Metrics::new();
        m.record_sync(
            "n1",
            true,
            Some(Duration::from_millis(150)),
            Duration::from_millis(20),
            Some(4),
        );
        m.record_sync("n1", false, None, Duration::from_millis(5), None);
        let text = m.encode();
        assert!(
            text.contains("ferry_netpol_syncs_total{node=\"n1\",result=\"ok\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("ferry_netpol_syncs_total{node=\"n1\",result=\"error\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("ferry_netpol_sync_programming_latency_seconds_count{node=\"n1\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "ferry_netpol_sync_programming_latency_seconds_bucket{le=\"0.256\",node=\"n1\"} 1"
            ) || text.contains(
                "ferry_netpol_sync_programming_latency_seconds_bucket{node=\"n1\",le=\"0.256\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("ferry_netpol_pod_chains{node=\"n1\"} 4"),
            "{text}"
        );
        // The verdict families are described even with no node.
        assert!(
            text.contains("# TYPE ferry_netpol_denied_packets counter"),
            "{text}"
        );

        // Health: a change waiting too long makes the node stale.
        let t = Arc::new(crate::agent::Tracker::default());
        m.add_node("n1", Target::default(), Some(t.subscribe()));
        assert!(m.stale_nodes(Duration::from_secs(30)).is_empty());
        t.update(|model| {
            model.namespaces.insert("x".into(), Default::default());
            true
        });
        assert!(m.stale_nodes(Duration::from_secs(30)).is_empty());
        assert_eq!(m.stale_nodes(Duration::ZERO), vec!["n1".to_string()]);
    }
}
