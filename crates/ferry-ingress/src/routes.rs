//! The pure core: (Ingresses, IngressClasses, Services, EndpointSlices) → a route table per host,
//! plus the TLS bindings and the problems worth an Event. No IO.
//!
//! Matching follows the Ingress documentation (seed 004) and ingress-nginx:
//! - One *server* is chosen by the request's host: an exact host rule, else a wildcard rule
//!   (`*.foo.com` matches exactly one more label), else the rules without a host.
//! - Within it the longest matching path wins; on equal length `Exact` beats `Prefix`, which
//!   beats `ImplementationSpecific`.
//! - `Exact` compares the whole path, case-sensitively. `Prefix` compares element-wise on `/`
//!   (a trailing slash in the rule or the request is ignored; `/aaa/bb` does not match
//!   `/aaa/bbb`). `ImplementationSpecific` is a plain string prefix, as nginx's `location /path`
//!   is in ingress-nginx without regular expressions (`/foo` matches `/foobar`).
//! - Nothing matches: the `defaultBackend` of the Ingress that defined the host (for the rules
//!   without a host: of the oldest Ingress that has one), else 404.
//! - Several Ingresses may share a host; on a duplicate (host, path, type) the oldest wins.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressBackend, IngressClass};

/// The controller name Ferry answers to in `IngressClass.spec.controller`.
pub const CONTROLLER_NAME: &str = "ferry.dev/ingress-controller";
/// The annotation marking the cluster's default IngressClass.
pub const DEFAULT_CLASS_ANNOTATION: &str = "ingressclass.kubernetes.io/is-default-class";
/// The annotation used before `spec.ingressClassName` existed.
pub const LEGACY_CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";

/// `(namespace, name)`.
pub type Key = (String, String);

/// Which Ingresses this controller serves.
#[derive(Clone, Debug)]
pub struct ClassPolicy {
    /// `IngressClass.spec.controller` values that are ours.
    pub controller: String,
    /// The class name accepted in the legacy annotation (besides names of our IngressClasses).
    pub class_name: String,
    /// Serve Ingresses without any class even when no default IngressClass is ours.
    pub watch_without_class: bool,
}

impl Default for ClassPolicy {
    fn default() -> Self {
        ClassPolicy {
            controller: CONTROLLER_NAME.to_string(),
            class_name: "ferry".to_string(),
            watch_without_class: false,
        }
    }
}

fn is_default_class(c: &IngressClass) -> bool {
    c.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
        .is_some_and(|v| v == "true")
}

fn class_is_ours(c: &IngressClass, policy: &ClassPolicy) -> bool {
    c.spec.as_ref().and_then(|s| s.controller.as_deref()) == Some(policy.controller.as_str())
}

/// Whether `ing` is served by this controller: the legacy annotation first (as ingress-nginx),
/// then `spec.ingressClassName`, then — for an Ingress without a class — a default IngressClass
/// that is ours (or `watch_without_class`).
pub fn is_ours(ing: &Ingress, classes: &[IngressClass], policy: &ClassPolicy) -> bool {
    let find = |name: &str| {
        classes
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name))
    };
    if let Some(v) = ing
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(LEGACY_CLASS_ANNOTATION))
    {
        return v == &policy.class_name || find(v).is_some_and(|c| class_is_ours(c, policy));
    }
    if let Some(name) = ing
        .spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.as_deref())
    {
        return find(name).is_some_and(|c| class_is_ours(c, policy));
    }
    policy.watch_without_class
        || classes
            .iter()
            .any(|c| is_default_class(c) && class_is_ours(c, policy))
}

/// How a path rule compares with a request path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathKind {
    Exact,
    Prefix,
    ImplementationSpecific,
}

impl PathKind {
    pub fn parse(s: Option<&str>) -> Option<PathKind> {
        match s {
            Some("Exact") => Some(PathKind::Exact),
            Some("Prefix") => Some(PathKind::Prefix),
            Some("ImplementationSpecific") => Some(PathKind::ImplementationSpecific),
            _ => None,
        }
    }
}

/// Whether a rule `(kind, rule)` matches the request path `req` (without its query).
pub fn path_matches(kind: PathKind, rule: &str, req: &str) -> bool {
    match kind {
        PathKind::Exact => rule == req,
        PathKind::ImplementationSpecific => req.starts_with(rule),
        PathKind::Prefix => {
            let p = rule.trim_end_matches('/');
            if p.is_empty() {
                return true;
            }
            let r = req.trim_end_matches('/');
            r == p || (r.starts_with(p) && r.as_bytes().get(p.len()) == Some(&b'/'))
        }
    }
}

/// The length used to rank matches ("the longest matching path wins").
fn rank_len(kind: PathKind, rule: &str) -> usize {
    match kind {
        PathKind::Prefix => rule.trim_end_matches('/').len(),
        _ => rule.len(),
    }
}

/// Where a matched request goes.
#[derive(Debug)]
pub enum Target {
    /// Ready endpoints of a Service port, balanced round-robin.
    Service(Upstream),
    /// The backend cannot be served (missing Service, unknown port, no ready endpoints):
    /// 503, as ingress-nginx answers.
    Unavailable(String),
    /// A `resource` backend: Ferry serves no custom resources, so (as ingress-nginx) the
    /// request goes to the default backend's answer, 404.
    Unsupported(String),
}

/// A Service port's endpoints.
#[derive(Debug)]
pub struct Upstream {
    /// `namespace/name:port` for logs.
    pub name: String,
    pub endpoints: Vec<SocketAddr>,
    next: AtomicUsize,
}

impl Upstream {
    pub fn new(name: String, endpoints: Vec<SocketAddr>) -> Upstream {
        Upstream {
            name,
            endpoints,
            next: AtomicUsize::new(0),
        }
    }

    /// Endpoints in the order to try them: round-robin start, then the others (retries).
    pub fn order(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        let n = self.endpoints.len();
        let start = if n == 0 {
            0
        } else {
            self.next.fetch_add(1, Ordering::Relaxed) % n
        };
        (0..n).map(move |i| self.endpoints[(start + i) % n])
    }
}

impl PartialEq for Upstream {
    fn eq(&self, o: &Self) -> bool {
        self.name == o.name && self.endpoints == o.endpoints
    }
}

impl PartialEq for Target {
    fn eq(&self, o: &Self) -> bool {
        match (self, o) {
            (Target::Service(a), Target::Service(b)) => a == b,
            (Target::Unavailable(a), Target::Unavailable(b)) => a == b,
            (Target::Unsupported(a), Target::Unsupported(b)) => a == b,
            _ => false,
        }
    }
}

#[derive(Debug)]
pub struct Route {
    pub path: String,
    pub kind: PathKind,
    pub target: Arc<Target>,
    /// The Ingress the rule came from.
    pub ingress: Key,
}

/// The routes of one host (or of the rules without a host).
#[derive(Debug, Default)]
pub struct Server {
    /// Sorted by priority: longest first, then Exact, Prefix, ImplementationSpecific.
    pub routes: Vec<Route>,
    pub default: Option<Arc<Target>>,
}

impl Server {
    pub fn lookup(&self, path: &str) -> Option<&Arc<Target>> {
        self.routes
            .iter()
            .find(|r| path_matches(r.kind, &r.path, path))
            .map(|r| &r.target)
            .or(self.default.as_ref())
    }
}

/// The whole routing decision, swapped atomically by the proxy.
#[derive(Debug, Default)]
pub struct RouteTable {
    pub exact: HashMap<String, Server>,
    /// Keyed by the suffix after `*.` (`foo.com` for `*.foo.com`).
    pub wildcard: HashMap<String, Server>,
    pub catch_all: Server,
}

/// A request's host: lower case, without port or trailing dot.
pub fn normalize_host(host: &str) -> String {
    let h = if let Some(rest) = host.strip_prefix('[') {
        // IPv6 literal.
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':')
            .filter(|(_, p)| p.bytes().all(|b| b.is_ascii_digit()))
            .map_or(host, |(h, _)| h)
    };
    h.trim_end_matches('.').to_ascii_lowercase()
}

impl RouteTable {
    /// The server for a (normalized) host.
    pub fn server(&self, host: &str) -> &Server {
        if let Some(s) = self.exact.get(host) {
            return s;
        }
        if let Some((_, suffix)) = host.split_once('.')
            && let Some(s) = self.wildcard.get(suffix)
        {
            return s;
        }
        &self.catch_all
    }

    /// Routes a request: `None` is the 404 default backend.
    pub fn route(&self, host: &str, path: &str) -> Option<&Arc<Target>> {
        let path = path.split('?').next().unwrap_or(path);
        self.server(host).lookup(path)
    }
}

/// A `spec.tls` entry: the certificate in `secret` serves `host` (`None`: requests whose name
/// no other entry covers, as ingress-nginx's default server).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct TlsBinding {
    pub host: Option<String>,
    pub secret: Key,
    pub ingress: Key,
}

/// Something wrong with an Ingress, reported as a Warning Event on it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Problem {
    pub ingress: Key,
    pub reason: &'static str,
    pub message: String,
}

/// What the table was built from.
#[derive(Default, Clone)]
pub struct Inputs {
    pub ingresses: Vec<Ingress>,
    pub classes: Vec<IngressClass>,
    pub services: BTreeMap<Key, Service>,
    /// By Service: `(namespace, kubernetes.io/service-name)`.
    pub slices: BTreeMap<Key, Vec<EndpointSlice>>,
}

/// The result of [`build`].
#[derive(Debug, Default)]
pub struct Built {
    pub table: RouteTable,
    pub tls: Vec<TlsBinding>,
    /// The Ingresses served (their status gets our address).
    pub ours: BTreeSet<Key>,
    pub problems: Vec<Problem>,
}

fn key_of(ing: &Ingress) -> Key {
    (
        ing.metadata.namespace.clone().unwrap_or_default(),
        ing.metadata.name.clone().unwrap_or_default(),
    )
}

/// Resolves a backend to its target, caching per (namespace, backend).
struct Resolver<'a> {
    inputs: &'a Inputs,
    cache: HashMap<(String, String), Arc<Target>>,
    problems: Vec<Problem>,
}

impl Resolver<'_> {
    fn resolve(&mut self, ing: &Key, b: &IngressBackend) -> Arc<Target> {
        let ns = &ing.0;
        let cache_key = (ns.clone(), serde_json::to_string(b).unwrap_or_default());
        let (target, problem) = match self.cache.get(&cache_key) {
            Some(t) => (t.clone(), problem_of(t)),
            None => {
                let t = Arc::new(self.compute(ns, b));
                self.cache.insert(cache_key, t.clone());
                (t.clone(), problem_of(&t))
            }
        };
        if let Some((reason, message)) = problem {
            let p = Problem {
                ingress: ing.clone(),
                reason,
                message,
            };
            if !self.problems.contains(&p) {
                self.problems.push(p);
            }
        }
        target
    }

    fn compute(&self, ns: &str, b: &IngressBackend) -> Target {
        if let Some(r) = &b.resource {
            return Target::Unsupported(format!(
                "resource backend {}/{} {} is not supported by {CONTROLLER_NAME}; answering 404 as the default backend",
                r.api_group.as_deref().unwrap_or(""),
                r.kind,
                r.name
            ));
        }
        let Some(sb) = &b.service else {
            return Target::Unavailable("backend without a service".into());
        };
        let key = (ns.to_string(), sb.name.clone());
        let port_desc = sb
            .port
            .as_ref()
            .map(|p| match (&p.name, p.number) {
                (Some(n), _) if !n.is_empty() => n.clone(),
                (_, Some(n)) => n.to_string(),
                _ => String::new(),
            })
            .unwrap_or_default();
        let name = format!("{ns}/{}:{port_desc}", sb.name);
        let Some(svc) = self.inputs.services.get(&key) else {
            return Target::Unavailable(format!("service {ns}/{} not found", sb.name));
        };
        let spec = svc.spec.clone().unwrap_or_default();
        if spec.type_.as_deref() == Some("ExternalName") {
            return Target::Unavailable(format!(
                "service {ns}/{} is of type ExternalName, which {CONTROLLER_NAME} does not proxy",
                sb.name
            ));
        }
        let want = sb.port.as_ref();
        let sp = spec.ports.iter().flatten().find(|p| match want {
            Some(w) => match (&w.name, w.number) {
                (Some(n), _) if !n.is_empty() => p.name.as_deref() == Some(n.as_str()),
                (_, Some(num)) => p.port == num,
                _ => false,
            },
            None => false,
        });
        let Some(sp) = sp else {
            return Target::Unavailable(format!(
                "service {ns}/{} has no port {port_desc}",
                sb.name
            ));
        };
        if sp.protocol.as_deref().is_some_and(|p| p != "TCP") {
            return Target::Unavailable(format!(
                "port {port_desc} of service {ns}/{} is not TCP",
                sb.name
            ));
        }
        let port_name = sp.name.clone().unwrap_or_default();
        let mut eps: Vec<SocketAddr> = Vec::new();
        for slice in self.inputs.slices.get(&key).into_iter().flatten() {
            let Some(port) = slice.ports.iter().flatten().find(|p| {
                p.name.clone().unwrap_or_default() == port_name
                    && p.protocol.as_deref().unwrap_or("TCP") == "TCP"
            }) else {
                continue;
            };
            let Some(port) = port.port.and_then(|p| u16::try_from(p).ok()) else {
                continue;
            };
            for ep in slice.endpoints.iter().flatten() {
                let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
                if !ready {
                    continue;
                }
                for a in &ep.addresses {
                    if let Ok(ip) = a.parse::<IpAddr>() {
                        eps.push(SocketAddr::new(ip, port));
                    }
                }
            }
        }
        eps.sort();
        eps.dedup();
        if eps.is_empty() {
            // Not an Event: endpoints come and go during rollouts; 503 as ingress-nginx.
            return Target::Unavailable(format!("service {name} has no ready endpoints"));
        }
        Target::Service(Upstream::new(name, eps))
    }
}

fn problem_of(t: &Target) -> Option<(&'static str, String)> {
    match t {
        Target::Unsupported(m) => Some(("UnsupportedBackend", m.clone())),
        Target::Unavailable(m) if !m.ends_with("has no ready endpoints") => {
            Some(("BadBackend", m.clone()))
        }
        _ => None,
    }
}

fn sort_routes(routes: &mut [Route]) {
    routes.sort_by(|a, b| {
        rank_len(b.kind, &b.path)
            .cmp(&rank_len(a.kind, &a.path))
            .then(a.kind.cmp(&b.kind))
    });
}

/// Builds the route table and TLS bindings from the cluster's objects.
pub fn build(inputs: &Inputs, policy: &ClassPolicy) -> Built {
    let mut ings: Vec<&Ingress> = inputs
        .ingresses
        .iter()
        .filter(|i| i.metadata.deletion_timestamp.is_none())
        .filter(|i| is_ours(i, &inputs.classes, policy))
        .collect();
    // Oldest first: on conflicts the oldest Ingress wins (ingress-nginx).
    ings.sort_by(|a, b| {
        a.metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0)
            .cmp(&b.metadata.creation_timestamp.as_ref().map(|t| t.0))
            .then_with(|| key_of(a).cmp(&key_of(b)))
    });
    let mut r = Resolver {
        inputs,
        cache: HashMap::new(),
        problems: Vec::new(),
    };
    let mut out = Built::default();
    let mut seen: BTreeSet<(Option<String>, String, PathKind)> = BTreeSet::new();
    let mut servers: BTreeMap<Option<String>, Server> = BTreeMap::new();
    let mut catch_all_default: Option<Arc<Target>> = None;
    for ing in &ings {
        let key = key_of(ing);
        out.ours.insert(key.clone());
        let Some(spec) = ing.spec.as_ref() else {
            continue;
        };
        let ing_default = spec.default_backend.as_ref().map(|b| r.resolve(&key, b));
        if catch_all_default.is_none() {
            catch_all_default = ing_default.clone();
        }
        for rule in spec.rules.iter().flatten() {
            let host = rule
                .host
                .as_deref()
                .filter(|h| !h.is_empty())
                .map(|h| h.to_ascii_lowercase());
            let server = servers.entry(host.clone()).or_default();
            if host.is_some() && server.default.is_none() {
                server.default = ing_default.clone();
            }
            for p in rule.http.iter().flat_map(|h| h.paths.iter()) {
                let Some(kind) = PathKind::parse(Some(p.path_type.as_str())) else {
                    continue;
                };
                let path = p.path.clone().unwrap_or_else(|| "/".to_string());
                if !seen.insert((host.clone(), path.clone(), kind)) {
                    continue;
                }
                let target = r.resolve(&key, &p.backend);
                server.routes.push(Route {
                    path,
                    kind,
                    target,
                    ingress: key.clone(),
                });
            }
        }
        for tls in spec.tls.iter().flatten() {
            let Some(secret) = tls.secret_name.as_ref().filter(|s| !s.is_empty()) else {
                // No secret: the host is served with the default certificate.
                continue;
            };
            let secret = (key.0.clone(), secret.clone());
            let hosts: Vec<Option<String>> = match tls.hosts.as_ref() {
                Some(h) if !h.is_empty() => {
                    h.iter().map(|h| Some(h.to_ascii_lowercase())).collect()
                }
                _ => vec![None],
            };
            for host in hosts {
                out.tls.push(TlsBinding {
                    host,
                    secret: secret.clone(),
                    ingress: key.clone(),
                });
            }
        }
    }
    for (host, mut server) in servers {
        sort_routes(&mut server.routes);
        match host {
            None => out.table.catch_all = server,
            Some(h) => match h.strip_prefix("*.") {
                Some(suffix) => {
                    out.table.wildcard.insert(suffix.to_string(), server);
                }
                None => {
                    out.table.exact.insert(h, server);
                }
            },
        }
    }
    out.table.catch_all.default = catch_all_default;
    out.problems = r.problems;
    out
}

#[cfg(test)]
mod tests;
