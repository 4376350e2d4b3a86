//! `/metrics` of the API server, with upstream's metric names and labels: request counts
//! (`apiserver_request_total`), request latency (`apiserver_request_duration_seconds`, without
//! WATCH and CONNECT, as upstream), requests in flight by kind, and long-running requests.
//!
//! Labels are derived from the request path as upstream's request-info resolver does: the verb
//! (`LIST` and `WATCH` for collection reads, `DELETECOLLECTION`, `APPLY` for apply patches), the
//! scope (`resource`, `namespace`, `cluster`), and only resources the server knows (others are
//! counted under an empty resource, so a client cannot grow the label set without bound).

use std::sync::Mutex;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::request::ResourcePath;

/// Upstream's buckets of `apiserver_request_duration_seconds`.
const BUCKETS: [f64; 23] = [
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0,
    10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub verb: String,
    pub dry_run: String,
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    pub scope: String,
    pub component: String,
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LatencyLabels {
    verb: String,
    dry_run: String,
    group: String,
    version: String,
    resource: String,
    subresource: String,
    scope: String,
    component: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InflightLabels {
    request_kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LongRunningLabels {
    verb: String,
    group: String,
    version: String,
    resource: String,
    subresource: String,
    scope: String,
    component: String,
}

/// What a request is, for its labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestInfo {
    pub verb: &'static str,
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    pub scope: &'static str,
    pub dry_run: bool,
}

impl RequestInfo {
    /// Mutating requests count against `mutating` in flight, as upstream's max-in-flight filter.
    pub fn mutating(&self) -> bool {
        !matches!(self.verb, "GET" | "LIST" | "WATCH")
    }
    fn long_running(&self) -> bool {
        self.verb == "WATCH" || self.verb == "CONNECT"
    }
}

/// Upstream's verb and scope of a request. `known` says whether a resource exists (unknown ones
/// are reported with empty resource labels).
pub fn classify(
    method: &str,
    path: &str,
    query: Option<&str>,
    content_type: &str,
    known: impl Fn(&ResourcePath) -> bool,
) -> RequestInfo {
    let q = query.unwrap_or("");
    let flag = |name: &str| {
        q.split('&').any(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            k == name && (v == "true" || v == "1" || (name == "dryRun" && v == "All"))
        })
    };
    let Some(rp) = crate::request::parse_resource_path(path) else {
        let verb = match method {
            "GET" | "HEAD" => "GET",
            "POST" => "POST",
            "PUT" => "PUT",
            "PATCH" => "PATCH",
            "DELETE" => "DELETE",
            _ => "OTHER",
        };
        return RequestInfo {
            verb,
            group: String::new(),
            version: String::new(),
            resource: String::new(),
            subresource: String::new(),
            scope: "",
            dry_run: false,
        };
    };
    let streaming_sub = matches!(
        rp.subresource.as_deref(),
        Some("exec" | "attach" | "portforward" | "proxy")
    );
    let item = rp.name.is_some();
    let verb = match method {
        _ if streaming_sub => "CONNECT",
        "GET" | "HEAD" if flag("watch") => "WATCH",
        "GET" | "HEAD" if item => "GET",
        "GET" | "HEAD" => "LIST",
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" if content_type.starts_with("application/apply-patch") => "APPLY",
        "PATCH" => "PATCH",
        "DELETE" if item => "DELETE",
        "DELETE" => "DELETECOLLECTION",
        _ => "OTHER",
    };
    let scope = if item {
        "resource"
    } else if rp.namespace.is_some() {
        "namespace"
    } else {
        "cluster"
    };
    let ok = known(&rp);
    RequestInfo {
        verb,
        group: rp.group.clone(),
        version: rp.version.clone(),
        resource: if ok {
            rp.resource.clone()
        } else {
            String::new()
        },
        subresource: if ok {
            rp.subresource.clone().unwrap_or_default()
        } else {
            String::new()
        },
        scope,
        dry_run: flag("dryRun"),
    }
}

/// The API server's metrics.
pub struct Metrics {
    registry: Mutex<Registry>,
    requests: Family<RequestLabels, Counter>,
    latency: Family<LatencyLabels, Histogram>,
    inflight: Family<InflightLabels, Gauge>,
    long_running: Family<LongRunningLabels, Gauge<i64, AtomicI64>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<LatencyLabels, Histogram>::new_with_constructor(
            (|| Histogram::new(BUCKETS)) as fn() -> Histogram,
        );
        let inflight = Family::<InflightLabels, Gauge>::default();
        let long_running = Family::<LongRunningLabels, Gauge<i64, AtomicI64>>::default();
        registry.register(
            "apiserver_request",
            "API requests served, by verb, dry run, group, version, resource, subresource, scope, component and HTTP status code",
            requests.clone(),
        );
        registry.register(
            "apiserver_request_duration_seconds",
            "Seconds from a request's arrival to its response, by verb, dry run, group, version, resource, subresource, scope and component (not for watches and connections)",
            latency.clone(),
        );
        registry.register(
            "apiserver_current_inflight_requests",
            "Requests being served now, read-only and mutating",
            inflight.clone(),
        );
        registry.register(
            "apiserver_longrunning_requests",
            "Open long-running requests (watches, exec, attach, port-forward), by verb, group, version, resource, subresource, scope and component",
            long_running.clone(),
        );
        Self {
            registry: Mutex::new(registry),
            requests,
            latency,
            inflight,
            long_running,
        }
    }

    /// Marks a request as started; the guard ends it.
    pub fn start(&self, info: &RequestInfo) -> InflightGuard<'_> {
        let kind = if info.mutating() {
            "mutating"
        } else {
            "readOnly"
        };
        let gauge = self
            .inflight
            .get_or_create(&InflightLabels {
                request_kind: kind.into(),
            })
            .clone();
        gauge.inc();
        InflightGuard { gauge, _m: self }
    }

    /// Records a finished request (for long-running ones: the response has started).
    pub fn observe(&self, info: &RequestInfo, code: u16, elapsed: Duration) {
        let dry_run = if info.dry_run { "All" } else { "" };
        self.requests
            .get_or_create(&RequestLabels {
                verb: info.verb.into(),
                dry_run: dry_run.into(),
                group: info.group.clone(),
                version: info.version.clone(),
                resource: info.resource.clone(),
                subresource: info.subresource.clone(),
                scope: info.scope.into(),
                component: "apiserver".into(),
                code: code.to_string(),
            })
            .inc();
        if !info.long_running() {
            self.latency
                .get_or_create(&LatencyLabels {
                    verb: info.verb.into(),
                    dry_run: dry_run.into(),
                    group: info.group.clone(),
                    version: info.version.clone(),
                    resource: info.resource.clone(),
                    subresource: info.subresource.clone(),
                    scope: info.scope.into(),
                    component: "apiserver".into(),
                })
                .observe(elapsed.as_secs_f64());
        }
    }

    /// A long-running request (watch, exec, ...) whose response streams: counted while the guard
    /// lives.
    pub fn long_running(&self, info: &RequestInfo) -> Option<LongRunningGuard> {
        if !info.long_running() {
            return None;
        }
        let gauge = self
            .long_running
            .get_or_create(&LongRunningLabels {
                verb: info.verb.into(),
                group: info.group.clone(),
                version: info.version.clone(),
                resource: info.resource.clone(),
                subresource: info.subresource.clone(),
                scope: info.scope.into(),
                component: "apiserver".into(),
            })
            .clone();
        gauge.inc();
        Some(LongRunningGuard { gauge })
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let registry = self
            .registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
            out.clear();
        }
        out
    }
}

/// The upstream resource label of a store prefix: `/registry/pods/` -> `pods`,
/// `/registry/apps/deployments/` -> `deployments.apps`.
fn resource_label(prefix: &str) -> String {
    let parts: Vec<&str> = prefix
        .trim_start_matches("/registry/")
        .trim_end_matches('/')
        .split('/')
        .collect();
    match parts.as_slice() {
        [group, plural] => format!("{plural}.{group}"),
        _ => parts.join("/"),
    }
}

/// The watch cache's gauges in the text exposition: upstream's `apiserver_storage_objects`
/// (objects per resource) and, for the memory bound (see `cache.rs`), the objects' JSON bytes
/// and the watch history's events and bytes per resource.
pub fn render_cache(cache: &crate::cache::Cache) -> String {
    let mut rows: Vec<(String, crate::cache::CacheStats)> = cache
        .resources()
        .into_iter()
        .map(|(prefix, rc)| (resource_label(&prefix), rc.stats()))
        .collect();
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = String::new();
    type Family = (
        &'static str,
        &'static str,
        fn(&crate::cache::CacheStats) -> usize,
    );
    let families: [Family; 4] = [
        (
            "apiserver_storage_objects",
            "Number of stored objects at the time of last check split by kind.",
            |s| s.objects,
        ),
        (
            "ferry_apiserver_watch_cache_object_bytes",
            "JSON bytes of the objects held in the watch cache.",
            |s| s.object_bytes,
        ),
        (
            "ferry_apiserver_watch_cache_history_events",
            "Events held in the watch cache's history.",
            |s| s.history_events,
        ),
        (
            "ferry_apiserver_watch_cache_history_bytes",
            "Bytes charged to the watch cache's history.",
            |s| s.history_bytes,
        ),
    ];
    for (name, help, value) in families {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n"));
        for (resource, stats) in &rows {
            out.push_str(&format!(
                "{name}{{resource=\"{resource}\"}} {}\n",
                value(stats)
            ));
        }
    }
    out
}

/// `render` with `extra` families added (before the exposition's end marker, if any).
pub fn with_families(mut text: String, extra: &str) -> String {
    match text.rfind("# EOF") {
        Some(i) => {
            let tail = text.split_off(i);
            text.push_str(extra);
            text.push_str(&tail);
        }
        None => text.push_str(extra),
    }
    text
}

pub struct InflightGuard<'a> {
    gauge: Gauge,
    _m: &'a Metrics,
}

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

pub struct LongRunningGuard {
    gauge: Gauge<i64, AtomicI64>,
}

impl Drop for LongRunningGuard {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// The process's API server metrics (upstream keeps them in one global registry too).
pub fn global() -> &'static Metrics {
    static METRICS: std::sync::LazyLock<Metrics> = std::sync::LazyLock::new(Metrics::new);
    &METRICS
}

/// A response body that keeps a long-running request counted until the body ends.
pub struct Guarded<B> {
    inner: B,
    _guard: LongRunningGuard,
}

impl<B> Guarded<B> {
    pub fn new(inner: B, guard: LongRunningGuard) -> Self {
        Self {
            inner,
            _guard: guard,
        }
    }
}

impl<B: http_body::Body + Unpin> http_body::Body for Guarded<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(method: &str, path: &str, query: Option<&str>, ct: &str) -> RequestInfo {
        classify(method, path, query, ct, |rp| rp.resource != "bogus")
    }

    #[test]
    fn cache_families() {
        assert_eq!(resource_label("/registry/pods/"), "pods");
        assert_eq!(
            resource_label("/registry/apps/deployments/"),
            "deployments.apps"
        );
        assert_eq!(
            resource_label("/registry/example.com/widgets/"),
            "widgets.example.com"
        );
        assert_eq!(
            with_families("a 1\n# EOF\n".into(), "b 2\n"),
            "a 1\nb 2\n# EOF\n"
        );
        assert_eq!(with_families("a 1\n".into(), "b 2\n"), "a 1\nb 2\n");
    }

    #[test]
    fn verbs_and_scopes_as_upstream() {
        let cases = [
            ("GET", "/api/v1/pods", None, "", "LIST", "cluster"),
            (
                "GET",
                "/api/v1/namespaces/a/pods",
                None,
                "",
                "LIST",
                "namespace",
            ),
            (
                "GET",
                "/api/v1/namespaces/a/pods",
                Some("watch=true"),
                "",
                "WATCH",
                "namespace",
            ),
            (
                "GET",
                "/api/v1/namespaces/a/pods/p",
                None,
                "",
                "GET",
                "resource",
            ),
            (
                "POST",
                "/api/v1/namespaces/a/pods",
                None,
                "",
                "POST",
                "namespace",
            ),
            (
                "PUT",
                "/api/v1/namespaces/a/pods/p",
                None,
                "",
                "PUT",
                "resource",
            ),
            (
                "PATCH",
                "/apis/apps/v1/namespaces/a/deployments/d",
                None,
                "application/apply-patch+yaml",
                "APPLY",
                "resource",
            ),
            (
                "PATCH",
                "/api/v1/nodes/n",
                None,
                "application/merge-patch+json",
                "PATCH",
                "resource",
            ),
            (
                "DELETE",
                "/api/v1/namespaces/a/pods",
                None,
                "",
                "DELETECOLLECTION",
                "namespace",
            ),
            (
                "DELETE",
                "/api/v1/namespaces/a/pods/p",
                None,
                "",
                "DELETE",
                "resource",
            ),
            (
                "POST",
                "/api/v1/namespaces/a/pods/p/exec",
                None,
                "",
                "CONNECT",
                "resource",
            ),
            (
                "GET",
                "/api/v1/namespaces/a/pods/p/log",
                None,
                "",
                "GET",
                "resource",
            ),
        ];
        for (m, p, q, ct, verb, scope) in cases {
            let i = info(m, p, q, ct);
            assert_eq!((i.verb, i.scope), (verb, scope), "{m} {p} {q:?}");
        }
        let i = info("GET", "/api/v1/namespaces/a/pods/p/log", None, "");
        assert_eq!(
            (i.resource.as_str(), i.subresource.as_str()),
            ("pods", "log")
        );
        assert!(info("POST", "/api/v1/namespaces/a/pods", Some("dryRun=All"), "").dry_run);
        assert!(!info("GET", "/api/v1/pods", None, "").mutating());
        assert!(info("DELETE", "/api/v1/pods/x", None, "").mutating());
    }

    #[test]
    fn unknown_resources_and_paths_do_not_grow_labels() {
        let i = info("GET", "/api/v1/bogus", None, "");
        assert_eq!(i.resource, "");
        let i = info("GET", "/metrics", None, "");
        assert_eq!((i.verb, i.resource.as_str(), i.scope), ("GET", "", ""));
    }

    #[test]
    fn exposition_has_upstream_names() {
        let m = Metrics::new();
        let i = info("GET", "/api/v1/namespaces/a/pods", None, "");
        {
            let _g = m.start(&i);
            m.observe(&i, 200, Duration::from_millis(3));
        }
        let w = info("GET", "/api/v1/pods", Some("watch=1"), "");
        let guard = m.long_running(&w);
        m.observe(&w, 200, Duration::from_millis(1));
        let text = m.render();
        assert!(
            text.contains(
                "apiserver_request_total{verb=\"LIST\",dry_run=\"\",group=\"\",version=\"v1\",resource=\"pods\",subresource=\"\",scope=\"namespace\",component=\"apiserver\",code=\"200\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("apiserver_request_duration_seconds_bucket{"),
            "{text}"
        );
        assert!(!text.contains("verb=\"WATCH\",dry_run=\"\",group=\"\",version=\"v1\",resource=\"pods\",subresource=\"\",scope=\"cluster\",component=\"apiserver\",le="), "{text}");
        assert!(
            text.contains("apiserver_longrunning_requests{verb=\"WATCH\""),
            "{text}"
        );
        assert!(
            text.contains("apiserver_current_inflight_requests{request_kind=\"readOnly\"} 0"),
            "{text}"
        );
        drop(guard);
    }
}
