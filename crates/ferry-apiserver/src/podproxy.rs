//! `pods/log`, `pods/exec`, `pods/attach` and `pods/portforward`: proxied to the agent (kubelet endpoint) of the pod's node, as
//! kube-apiserver does. The agent's address comes from the Node (`status.addresses`, InternalIP
//! first, and `status.daemonEndpoints.kubeletEndpoint.Port`), reached over HTTPS only: the API
//! server presents its kubelet client certificate and verifies the agent's serving certificate
//! against the kubelet certificate authority (see [`crate::pki::kubelet_client_config`]); it
//! never sends a bearer token to an agent. Exec, attach and port-forward are HTTP upgrades
//! (SPDY/3.1 with `X-Stream-Protocol-Version`, or WebSocket with its subprotocols, including
//! SPDY tunnelled in WebSocket): once the agent answers 101, bytes are copied both ways.

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use serde_json::Value;

use crate::api::Reply;
use crate::request::{Query, ResourcePath, Want};
use crate::server::{Body, Server, error_response};
use crate::status::ApiError;

/// The query parameters passed on to the agent.
const LOG_PARAMS: &[&str] = &[
    "follow",
    "previous",
    "timestamps",
    "sinceSeconds",
    "sinceTime",
    "tailLines",
    "limitBytes",
];
const EXEC_PARAMS: &[&str] = &["command", "stdin", "stdout", "stderr", "tty"];
const ATTACH_PARAMS: &[&str] = &["stdin", "stdout", "stderr", "tty"];
const PORTFORWARD_PARAMS: &[&str] = &["ports"];

fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Keeps the listed parameters of a raw query string, in order (repeated `command`s too).
pub fn filter_query(raw: Option<&str>, keep: &[&str]) -> String {
    raw.unwrap_or("")
        .split('&')
        .filter(|p| {
            let k = p.split_once('=').map(|(k, _)| k).unwrap_or(p);
            keep.contains(&k)
        })
        .collect::<Vec<_>>()
        .join("&")
}

async fn get_json(
    server: &Server,
    plural: &str,
    ns: Option<&str>,
    name: &str,
) -> Result<Value, ApiError> {
    let res = server
        .api
        .resource("", "v1", plural)
        .cloned()
        .ok_or_else(ApiError::not_found_path)?;
    let rp = ResourcePath {
        group: String::new(),
        version: "v1".into(),
        namespace: ns.map(str::to_string),
        resource: plural.into(),
        name: Some(name.to_string()),
        subresource: None,
    };
    match server
        .api
        .get(&res, &rp, &Query::parse(None), Want::Json)
        .await?
    {
        Reply::Json { body, .. } => serde_json::from_slice(&body)
            .map_err(|e| ApiError::new(500, "InternalError", e.to_string())),
        Reply::Stream { .. } => Err(ApiError::new(500, "InternalError", "unexpected stream")),
    }
}

/// Picks the container: the `container` parameter, else the only one, else the
/// `kubectl.kubernetes.io/default-container` annotation.
pub fn pick_container(pod: &Value, asked: Option<&str>) -> Result<String, ApiError> {
    let name = pod
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let names: Vec<&str> = ["containers", "initContainers", "ephemeralContainers"]
        .iter()
        .flat_map(|k| {
            pod.pointer(&format!("/spec/{k}"))
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
        })
        .filter_map(|c| c.get("name").and_then(Value::as_str))
        .collect();
    let regular: Vec<&str> = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("name").and_then(Value::as_str))
        .collect();
    match asked.filter(|a| !a.is_empty()) {
        Some(a) if names.contains(&a) => Ok(a.to_string()),
        Some(a) => Err(ApiError::bad_request(format!(
            "container {a} is not valid for pod {name}"
        ))),
        None if regular.len() == 1 => Ok(regular[0].to_string()),
        None => {
            if let Some(d) = pod
                .pointer("/metadata/annotations/kubectl.kubernetes.io~1default-container")
                .and_then(Value::as_str)
                .filter(|d| regular.contains(d))
            {
                return Ok(d.to_string());
            }
            Err(ApiError::bad_request(format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                regular.join(" ")
            )))
        }
    }
}

/// The agent (kubelet) path for a pod subresource, with the query parameters it takes:
/// `log` → `/containerLogs/<ns>/<pod>/<container>`, `exec`/`attach` → `/exec|attach/...`,
/// `portforward` → `/portForward/<ns>/<pod>`.
pub fn agent_uri(sub: &str, ns: &str, name: &str, container: &str, raw: Option<&str>) -> String {
    let (path, params) = match sub {
        "exec" => ("exec", EXEC_PARAMS),
        "attach" => ("attach", ATTACH_PARAMS),
        "portforward" => ("portForward", PORTFORWARD_PARAMS),
        _ => ("containerLogs", LOG_PARAMS),
    };
    let query = filter_query(raw, params);
    if sub == "portforward" {
        format!("/{path}/{}/{}?{query}", encode(ns), encode(name))
    } else {
        format!(
            "/{path}/{}/{}/{}?{query}",
            encode(ns),
            encode(name),
            encode(container)
        )
    }
}

/// `host:port` of the agent of `node`.
pub fn agent_address(node: &Value) -> Option<String> {
    // An agent whose node lives in a network namespace the API server cannot reach (ferry up's
    // netns pod network) names where its endpoint really listens.
    if let Some(ep) = node
        .pointer("/metadata/annotations/ferry.dev~1agent-endpoint")
        .and_then(Value::as_str)
        .filter(|e| e.parse::<std::net::SocketAddr>().is_ok())
    {
        return Some(ep.to_string());
    }
    let port = node
        .pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
        .and_then(Value::as_u64)?;
    let addrs = node
        .pointer("/status/addresses")
        .and_then(Value::as_array)?;
    let host = ["InternalIP", "ExternalIP", "Hostname"]
        .iter()
        .find_map(|t| {
            addrs
                .iter()
                .find(|a| a.get("type").and_then(Value::as_str) == Some(t))
                .and_then(|a| a.get("address").and_then(Value::as_str))
        })?;
    Some(if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    })
}

/// The TLS server name of an agent address (`host:port`, `[v6]:port`).
pub fn server_name(addr: &str) -> Option<rustls_pki_types::ServerName<'static>> {
    let host = addr.rsplit_once(':').map(|(h, _)| h)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    rustls_pki_types::ServerName::try_from(host.to_string()).ok()
}

/// Handles `GET .../pods/<name>/log` and `GET|POST .../pods/<name>/exec`.
pub async fn handle(
    server: Arc<Server>,
    req: Request<Incoming>,
    rp: &ResourcePath,
) -> Response<Body> {
    match proxy(server, req, rp).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

async fn proxy(
    server: Arc<Server>,
    req: Request<Incoming>,
    rp: &ResourcePath,
) -> Result<Response<Body>, ApiError> {
    let ns = rp.namespace.as_deref().unwrap_or("default");
    let name = rp.name.as_deref().ok_or_else(ApiError::not_found_path)?;
    let sub = rp.subresource.as_deref().unwrap_or("");
    // exec, attach and portforward are upgrades (kubectl sends POST, other clients GET).
    let is_exec = matches!(sub, "exec" | "attach" | "portforward");
    if !is_exec && req.method() != http::Method::GET {
        return Err(ApiError::method_not_allowed());
    }
    let raw = req.uri().query().map(str::to_string);
    let q = Query::parse(raw.as_deref());
    let pod = get_json(&server, "pods", Some(ns), name).await?;
    let container = if sub == "portforward" {
        String::new()
    } else {
        pick_container(&pod, q.get("container"))?
    };
    if is_exec {
        let phase = pod
            .pointer("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or("");
        if phase == "Succeeded" || phase == "Failed" {
            let what = match sub {
                "attach" => "attach a container in",
                "portforward" => "port forward to",
                _ => "exec into a container in",
            };
            return Err(ApiError::bad_request(format!(
                "cannot {what} a completed pod; current phase is {phase}"
            )));
        }
    }
    let node_name = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            ApiError::bad_request(format!("pod {name} does not have a host assigned"))
        })?;
    let node = get_json(&server, "nodes", None, node_name).await?;
    let addr = agent_address(&node).ok_or_else(|| {
        ApiError::new(
            503,
            "ServiceUnavailable",
            format!("node {node_name} does not report an agent endpoint"),
        )
    })?;
    let uri = agent_uri(sub, ns, name, &container, raw.as_deref());
    let stream = tokio::net::TcpStream::connect(&addr).await.map_err(|e| {
        ApiError::new(
            502,
            "InternalError",
            format!("error dialing backend: dial tcp {addr}: {e}"),
        )
    })?;
    // HTTPS only, with the API server's client certificate; the agent's serving certificate
    // must chain to the kubelet certificate authority and name the address dialled. No bearer
    // token ever goes to an agent.
    let server_name = server_name(&addr).ok_or_else(|| {
        ApiError::new(
            502,
            "InternalError",
            format!("error dialing backend: invalid agent address {addr}"),
        )
    })?;
    let tls = tokio_rustls::TlsConnector::from(server.kubelet_tls.clone())
        .connect(server_name, stream)
        .await
        .map_err(|e| {
            ApiError::new(
                502,
                "InternalError",
                format!("error dialing backend: tls: agent {addr}: {e}"),
            )
        })?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| ApiError::new(502, "InternalError", format!("agent {addr}: {e}")))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let mut out = Request::builder().method(req.method().clone()).uri(&uri);
    out = out.header(header::HOST, &addr);
    for h in [
        header::CONNECTION,
        header::UPGRADE,
        header::SEC_WEBSOCKET_KEY,
        header::SEC_WEBSOCKET_VERSION,
        header::SEC_WEBSOCKET_PROTOCOL,
        header::HeaderName::from_static("x-stream-protocol-version"),
    ] {
        for v in req.headers().get_all(&h) {
            out = out.header(h.clone(), v.clone());
        }
    }
    let out = out
        .body(Empty::<Bytes>::new())
        .map_err(|e| ApiError::new(500, "InternalError", e.to_string()))?;
    let mut resp = sender
        .send_request(out)
        .await
        .map_err(|e| ApiError::new(502, "InternalError", format!("agent {addr}: {e}")))?;
    let status = resp.status();
    if status == StatusCode::SWITCHING_PROTOCOLS {
        let agent_up = hyper::upgrade::on(&mut resp);
        let mut builder = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
        for (k, v) in resp.headers() {
            builder = builder.header(k, v);
        }
        tokio::spawn(async move {
            let (client, agent) = match tokio::join!(hyper::upgrade::on(req), agent_up) {
                (Ok(c), Ok(a)) => (c, a),
                _ => return,
            };
            let mut c = hyper_util::rt::TokioIo::new(client);
            let mut a = hyper_util::rt::TokioIo::new(agent);
            let _ = tokio::io::copy_bidirectional(&mut c, &mut a).await;
        });
        return builder
            .body(Full::new(Bytes::new()).boxed())
            .map_err(|e| ApiError::new(500, "InternalError", e.to_string()));
    }
    if !status.is_success() {
        let body = resp
            .into_body()
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        let msg = String::from_utf8_lossy(&body).trim().to_string();
        let code = status.as_u16();
        return Err(ApiError::new(
            if code == 401 { 500 } else { code },
            if code == 404 {
                "NotFound"
            } else {
                "BadRequest"
            },
            msg,
        ));
    }
    let ctype = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .cloned()
        .unwrap_or(header::HeaderValue::from_static("text/plain"));
    let body = {
        use futures::StreamExt;
        let s = http_body_util::BodyStream::new(resp.into_body())
            .take_while(|r| futures::future::ready(r.is_ok()))
            .filter_map(|r| futures::future::ready(r.ok()))
            .map(Ok::<_, std::convert::Infallible>);
        BodyExt::boxed(http_body_util::StreamBody::new(s))
    };
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, ctype)
        .body(body)
        .map_err(|e| ApiError::new(500, "InternalError", e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn containers() {
        let one = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]}});
        assert_eq!(pick_container(&one, None).expect("one"), "a");
        let two = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}, {"name": "b"}],
            "initContainers": [{"name": "i"}]}});
        let e = pick_container(&two, None).expect_err("two");
        assert_eq!(
            e.message,
            "a container name must be specified for pod p, choose one of: [a b]"
        );
        assert_eq!(pick_container(&two, Some("i")).expect("init"), "i");
        let e = pick_container(&two, Some("z")).expect_err("bad");
        assert_eq!(e.message, "container z is not valid for pod p");
        let mut ann = two.clone();
        ann["metadata"]["annotations"] = json!({"kubectl.kubernetes.io/default-container": "b"});
        assert_eq!(pick_container(&ann, None).expect("default"), "b");
    }

    #[test]
    fn addresses_and_queries() {
        let node = json!({"status": {"addresses": [{"type": "Hostname", "address": "vm"},
            {"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}}});
        assert_eq!(agent_address(&node).as_deref(), Some("127.0.0.1:10250"));
        assert_eq!(agent_address(&json!({})), None);
        assert_eq!(
            filter_query(
                Some("command=cat&command=%2Fetc&container=c&stdout=true&x=1"),
                EXEC_PARAMS
            ),
            "command=cat&command=%2Fetc&stdout=true"
        );
        assert_eq!(encode("a b/c"), "a%20b%2Fc");
        for (sub, container, raw, want) in [
            (
                "exec",
                "c",
                "command=ls&container=c&stdin=true&tty=false",
                "/exec/ns/p/c?command=ls&stdin=true&tty=false",
            ),
            (
                "attach",
                "c",
                "command=ls&stdout=true&container=c",
                "/attach/ns/p/c?stdout=true",
            ),
            (
                "portforward",
                "",
                "ports=80&ports=443&x=1",
                "/portForward/ns/p?ports=80&ports=443",
            ),
            (
                "log",
                "c",
                "timestamps=true&sinceTime=2026-01-01T00%3A00%3A00Z&pretty=1",
                "/containerLogs/ns/p/c?timestamps=true&sinceTime=2026-01-01T00%3A00%3A00Z",
            ),
        ] {
            assert_eq!(agent_uri(sub, "ns", "p", container, Some(raw)), want);
        }
        for (addr, want) in [
            ("127.0.0.1:10250", Some("127.0.0.1")),
            ("[fd00::1]:10250", Some("fd00::1")),
            ("node-a:10250", Some("node-a")),
            ("10250", None),
        ] {
            let got = server_name(addr).map(|n| n.to_str().into_owned());
            assert_eq!(got.as_deref(), want, "{addr}");
        }
    }
}
