//! Where a `proxy` subresource request goes, decided from the objects alone (no I/O), as
//! upstream's `ResourceLocation`s for pods, services and nodes decide it.

use std::net::IpAddr;

use serde_json::Value;

use crate::status::ApiError;

/// The kind a proxy request addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Pods,
    Services,
    Nodes,
}

impl Kind {
    pub fn plural(self) -> &'static str {
        match self {
            Kind::Pods => "pods",
            Kind::Services => "services",
            Kind::Nodes => "nodes",
        }
    }
}

/// `/api/v1/[namespaces/<ns>/]<pods|services|nodes>/<id>/proxy[/<rest>]`, read from the raw
/// (still percent-encoded) URL path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyPath {
    pub kind: Kind,
    pub namespace: Option<String>,
    /// `[scheme:]name[:port]`, percent-decoded.
    pub id: String,
    /// What follows `proxy`, as sent (`""` for `.../proxy`, `"/"` for `.../proxy/`).
    pub rest: String,
}

impl ProxyPath {
    pub fn parse(path: &str) -> Option<ProxyPath> {
        let rest = path.strip_prefix("/api/v1/")?;
        let (namespace, rest) = match rest.strip_prefix("namespaces/") {
            Some(r) => {
                let (ns, r) = r.split_once('/')?;
                (Some(crate::request::percent_decode(ns)), r)
            }
            None => (None, rest),
        };
        let (plural, rest) = rest.split_once('/')?;
        let kind = match (plural, namespace.is_some()) {
            ("pods", true) => Kind::Pods,
            ("services", true) => Kind::Services,
            ("nodes", false) => Kind::Nodes,
            _ => return None,
        };
        let (id, rest) = rest.split_once('/')?;
        let tail = rest.strip_prefix("proxy")?;
        if !(tail.is_empty() || tail.starts_with('/')) || id.is_empty() {
            return None;
        }
        Some(ProxyPath {
            kind,
            namespace,
            id: crate::request::percent_decode(id),
            rest: tail.to_string(),
        })
    }
}

/// Upstream's `SplitSchemeNamePort`: `name`, `name:port` or `scheme:name:port` with scheme
/// `http`, `https` or empty. `None` when invalid.
pub fn split_scheme_name_port(id: &str) -> Option<(&str, &str, &str)> {
    let parts: Vec<&str> = id.split(':').collect();
    let (scheme, name, port) = match parts.as_slice() {
        [n] => ("", *n, ""),
        [n, p] => ("", *n, *p),
        [s, n, p] => (*s, *n, *p),
        _ => return None,
    };
    (!name.is_empty() && matches!(scheme, "" | "http" | "https")).then_some((scheme, name, port))
}

/// Where to send the request: scheme (`http` when the id named none), host and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub scheme: String,
    pub ip: IpAddr,
    /// `None`: the scheme's default port.
    pub port: Option<u16>,
}

impl Location {
    pub fn port_or_default(&self) -> u16 {
        self.port
            .unwrap_or(if self.scheme == "https" { 443 } else { 80 })
    }

    /// `host[:port]` as Go's `net.JoinHostPort` writes it.
    pub fn host(&self) -> String {
        let ip = match self.ip {
            IpAddr::V6(v6) => format!("[{v6}]"),
            IpAddr::V4(v4) => v4.to_string(),
        };
        match self.port {
            Some(p) => format!("{ip}:{p}"),
            None => ip,
        }
    }
}

fn scheme_or_http(s: &str) -> String {
    if s.is_empty() { "http" } else { s }.to_string()
}

/// Go's `net.IP.IsGlobalUnicast`: not unspecified, loopback, multicast, link-local or the
/// IPv4 broadcast address.
pub fn is_global_unicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            !(v4.is_unspecified()
                || v4.is_loopback()
                || v4.is_multicast()
                || v4.is_link_local()
                || v4.is_broadcast())
        }
        IpAddr::V6(v6) => {
            !(v6.is_unspecified()
                || v6.is_loopback()
                || v6.is_multicast()
                || (v6.segments()[0] & 0xffc0) == 0xfe80)
        }
    }
}

fn parse_port(p: &str) -> Result<u16, ApiError> {
    p.parse::<u16>()
        .map_err(|_| ApiError::bad_request(format!("invalid port {}", go_quote(p))))
}

fn go_quote(s: &str) -> String {
    ferry_auth::message::go_quote(s)
}

/// The pod's first IP (`status.podIPs[0]`, else `status.podIP`).
fn pod_ip(pod: &Value) -> &str {
    pod.pointer("/status/podIPs/0/ip")
        .and_then(Value::as_str)
        .or_else(|| pod.pointer("/status/podIP").and_then(Value::as_str))
        .unwrap_or("")
}

/// A pod's location: the asked port, else the first declared container port, at the pod's IP,
/// which `allowed` must accept (upstream: global unicast only, `address not allowed`).
pub fn pod_location(
    pod: &Value,
    scheme: &str,
    port: &str,
    allowed: &dyn Fn(IpAddr) -> bool,
) -> Result<Location, ApiError> {
    let mut port = port.to_string();
    if port.is_empty() {
        port = pod
            .pointer("/spec/containers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find_map(|c| c.pointer("/ports/0/containerPort").and_then(Value::as_i64))
            .map(|p| p.to_string())
            .unwrap_or_default();
    }
    let ip = pod_ip(pod)
        .parse::<IpAddr>()
        .ok()
        .filter(|ip| allowed(*ip))
        .ok_or_else(|| ApiError::bad_request("address not allowed"))?;
    Ok(Location {
        scheme: scheme_or_http(scheme),
        ip,
        port: if port.is_empty() {
            None
        } else {
            Some(parse_port(&port)?)
        },
    })
}

/// The port name a service proxy id asks for: a number is looked up among the Service's ports
/// (`None` in the error when the Service has no such port).
pub fn service_port_name(svc: &Value, svc_name: &str, port: &str) -> Result<String, ApiError> {
    let Ok(num) = port.parse::<i64>() else {
        return Ok(port.to_string());
    };
    svc.pointer("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|p| p.get("port").and_then(Value::as_i64) == Some(num))
        .map(|p| {
            p.get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        })
        .ok_or_else(|| {
            ApiError::new(
                503,
                "ServiceUnavailable",
                format!(
                    "no service port {num} found for service {}",
                    go_quote(svc_name)
                ),
            )
        })
}

/// A Service's location from its Endpoints, as upstream: starting from a subset and an address
/// picked by `seed`, the first address of a subset with the named port whose target is a pod
/// of this namespace that still has that IP (`pod_ips` answers a pod's IPs).
#[allow(clippy::too_many_arguments)]
pub fn service_location(
    endpoints: &Value,
    namespace: &str,
    id: &str,
    scheme: &str,
    svc_name: &str,
    port_name: &str,
    seed: usize,
    pod_ips: &dyn Fn(&str) -> Option<Vec<String>>,
) -> Result<Location, ApiError> {
    let unavailable = |what: &str| {
        ApiError::new(
            503,
            "ServiceUnavailable",
            format!("no endpoints available for service {}", go_quote(what)),
        )
    };
    let subsets: Vec<&Value> = endpoints
        .get("subsets")
        .and_then(Value::as_array)
        .map(|v| v.iter().collect())
        .unwrap_or_default();
    if subsets.is_empty() {
        return Err(unavailable(svc_name));
    }
    for i in 0..subsets.len() {
        let ss = subsets[(seed + i) % subsets.len()];
        let addrs: Vec<&Value> = ss
            .get("addresses")
            .and_then(Value::as_array)
            .map(|v| v.iter().collect())
            .unwrap_or_default();
        if addrs.is_empty() {
            continue;
        }
        let ports = ss.get("ports").and_then(Value::as_array);
        for p in ports.into_iter().flatten() {
            if p.get("name").and_then(Value::as_str).unwrap_or("") != port_name {
                continue;
            }
            let Some(port) = p
                .get("port")
                .and_then(Value::as_u64)
                .and_then(|n| u16::try_from(n).ok())
            else {
                continue;
            };
            for t in 0..addrs.len() {
                let a = addrs[(seed + t) % addrs.len()];
                let ip = a.get("ip").and_then(Value::as_str).unwrap_or("");
                let target_ok = a.pointer("/targetRef/kind").and_then(Value::as_str) == Some("Pod")
                    && a.pointer("/targetRef/namespace").and_then(Value::as_str) == Some(namespace);
                let Some(pod) = a
                    .pointer("/targetRef/name")
                    .and_then(Value::as_str)
                    .filter(|_| target_ok)
                else {
                    continue;
                };
                if !pod_ips(pod).is_some_and(|ips| ips.iter().any(|x| x == ip)) {
                    continue;
                }
                if let Ok(ip) = ip.parse::<IpAddr>() {
                    return Ok(Location {
                        scheme: scheme_or_http(scheme),
                        ip,
                        port: Some(port),
                    });
                }
            }
        }
    }
    Err(unavailable(id))
}

/// The path sent on: Go's `path.Join` of the location's (empty) path and the request's rest,
/// keeping a trailing slash (upstream's `JoinPreservingTrailingSlash`), then the raw query.
pub fn upstream_path(rest: &str, query: Option<&str>) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for seg in rest.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    let mut p = format!("/{}", parts.join("/"));
    if rest.ends_with('/') && !p.ends_with('/') {
        p.push('/');
    }
    match query.filter(|q| !q.is_empty()) {
        Some(q) => format!("{p}?{q}"),
        None => p,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn proxy_paths() {
        let p = ProxyPath::parse("/api/v1/namespaces/default/services/web:80/proxy/a/b").unwrap();
        assert_eq!(
            p,
            ProxyPath {
                kind: Kind::Services,
                namespace: Some("default".into()),
                id: "web:80".into(),
                rest: "/a/b".into()
            }
        );
        let p = ProxyPath::parse("/api/v1/namespaces/d/pods/https:p:8443/proxy").unwrap();
        assert_eq!(
            (p.kind, p.id.as_str(), p.rest.as_str()),
            (Kind::Pods, "https:p:8443", "")
        );
        let p = ProxyPath::parse("/api/v1/nodes/n1/proxy/metrics").unwrap();
        assert_eq!(
            (p.kind, p.namespace, p.rest.as_str()),
            (Kind::Nodes, None, "/metrics")
        );
        let p = ProxyPath::parse("/api/v1/namespaces/d/pods/p%3A80/proxy/").unwrap();
        assert_eq!(p.id, "p:80");
        for bad in [
            "/api/v1/namespaces/d/pods/p/log",
            "/api/v1/namespaces/d/pods/p/proxyx",
            "/api/v1/nodes/n1/status",
            "/api/v1/pods/p/proxy/",
            "/api/v1/namespaces/d/nodes/n/proxy/",
            "/apis/apps/v1/namespaces/d/deployments/x/proxy",
        ] {
            assert_eq!(ProxyPath::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn scheme_name_port() {
        assert_eq!(split_scheme_name_port("web"), Some(("", "web", "")));
        assert_eq!(
            split_scheme_name_port("web:http"),
            Some(("", "web", "http"))
        );
        assert_eq!(
            split_scheme_name_port("https:web:443"),
            Some(("https", "web", "443"))
        );
        assert_eq!(split_scheme_name_port("ftp:web:21"), None);
        assert_eq!(split_scheme_name_port(":80"), None);
        assert_eq!(split_scheme_name_port("a:b:c:d"), None);
    }

    fn pod(ip: &str) -> Value {
        json!({"spec": {"containers": [{"name": "a"}, {"name": "b", "ports": [{"containerPort": 8080}]}]},
            "status": {"podIP": ip, "podIPs": [{"ip": ip}]}})
    }

    #[test]
    fn pods() {
        let any = |_: IpAddr| true;
        let l = pod_location(&pod("10.244.0.5"), "", "", &is_global_unicast).unwrap();
        assert_eq!(l.host(), "10.244.0.5:8080");
        assert_eq!(l.scheme, "http");
        let l = pod_location(&pod("fd00::5"), "https", "9443", &any).unwrap();
        assert_eq!(l.host(), "[fd00::5]:9443");
        assert_eq!(l.scheme, "https");
        let e = pod_location(&pod("127.0.0.1"), "", "80", &is_global_unicast).unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (400, "address not allowed"));
        let e = pod_location(&json!({"spec": {}}), "", "80", &any).unwrap_err();
        assert_eq!(e.message, "address not allowed");
        let none =
            json!({"spec": {"containers": [{"name": "a"}]}, "status": {"podIP": "10.0.0.1"}});
        let l = pod_location(&none, "", "", &any).unwrap();
        assert_eq!(
            (l.host(), l.port_or_default()),
            ("10.0.0.1".to_string(), 80)
        );
    }

    #[test]
    fn services() {
        let svc =
            json!({"spec": {"ports": [{"name": "http", "port": 80}, {"name": "", "port": 81}]}});
        assert_eq!(service_port_name(&svc, "web", "80").unwrap(), "http");
        assert_eq!(service_port_name(&svc, "web", "http").unwrap(), "http");
        assert_eq!(service_port_name(&svc, "web", "").unwrap(), "");
        let e = service_port_name(&svc, "web", "90").unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (503, "no service port 90 found for service \"web\"")
        );
        let eps = json!({"subsets": [
            {"notReadyAddresses": [{"ip": "10.0.0.9"}], "ports": [{"name": "http", "port": 8080}]},
            {"addresses": [
                {"ip": "10.0.0.1", "targetRef": {"kind": "Pod", "namespace": "d", "name": "a"}},
                {"ip": "10.0.0.2", "targetRef": {"kind": "Pod", "namespace": "d", "name": "gone"}},
                {"ip": "10.0.0.3", "targetRef": {"kind": "Pod", "namespace": "other", "name": "a"}},
                {"ip": "10.0.0.4"}],
             "ports": [{"name": "http", "port": 8080}]}]});
        let ips = |p: &str| (p == "a").then(|| vec!["10.0.0.1".to_string()]);
        for seed in 0..8 {
            let l = service_location(&eps, "d", "web:80", "", "web", "http", seed, &ips).unwrap();
            assert_eq!(l.host(), "10.0.0.1:8080", "seed {seed}");
        }
        let e = service_location(&eps, "d", "web:81", "", "web", "", 0, &ips).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (503, "no endpoints available for service \"web:81\"")
        );
        let e = service_location(&json!({}), "d", "web", "", "web", "", 0, &ips).unwrap_err();
        assert_eq!(e.message, "no endpoints available for service \"web\"");
        let moved = |_: &str| Some(vec!["10.0.0.7".to_string()]);
        assert!(service_location(&eps, "d", "web", "", "web", "http", 0, &moved).is_err());
    }

    #[test]
    fn paths_sent_on() {
        assert_eq!(upstream_path("", None), "/");
        assert_eq!(upstream_path("/", Some("a=1")), "/?a=1");
        assert_eq!(upstream_path("/x/../../y/", None), "/y/");
        assert_eq!(upstream_path("/a//b", Some("")), "/a/b");
    }

    #[test]
    fn global_unicast() {
        for (ip, want) in [
            ("10.1.2.3", true),
            ("127.0.0.1", false),
            ("0.0.0.0", false),
            ("169.254.1.1", false),
            ("224.0.0.1", false),
            ("255.255.255.255", false),
            ("fd00::1", true),
            ("::1", false),
            ("fe80::1", false),
        ] {
            assert_eq!(is_global_unicast(ip.parse().unwrap()), want, "{ip}");
        }
    }
}
