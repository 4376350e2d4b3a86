//! The `healthCheckNodePort` servers (upstream `pkg/proxy/healthcheck`'s service health): for
//! each Service with `externalTrafficPolicy: Local` and a health check node port, an HTTP
//! server on that port answering every path with 200 when this node has local endpoints for
//! it and 503 otherwise, so that a load balancer sends traffic only to nodes that can serve it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::input::{SvcPort, Target};

/// What one health check port reports.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HcTarget {
    pub namespace: String,
    pub name: String,
    pub local_endpoints: usize,
}

/// The health check ports of the kernel input and their local endpoint counts. Pure.
pub fn targets(ports: &[SvcPort]) -> BTreeMap<u16, HcTarget> {
    let mut eps: BTreeMap<u16, (HcTarget, BTreeSet<IpAddr>)> = BTreeMap::new();
    for sp in ports {
        let Some(p) = sp.health_check_node_port else {
            continue;
        };
        let e = eps.entry(p).or_insert_with(|| {
            (
                HcTarget {
                    namespace: sp.name.namespace.clone(),
                    name: sp.name.name.clone(),
                    local_endpoints: 0,
                },
                BTreeSet::new(),
            )
        });
        if let Target::Pool(pool) = &sp.external {
            e.1.extend(pool.iter().map(|a| a.ip()));
        }
    }
    eps.into_iter()
        .map(|(p, (mut t, ips))| {
            t.local_endpoints = ips.len();
            (p, t)
        })
        .collect()
}

/// Status and JSON body for a target, as upstream answers.
pub fn respond(t: &HcTarget) -> (u16, String) {
    let body = serde_json::json!({
        "service": {"namespace": t.namespace, "name": t.name},
        "localEndpoints": t.local_endpoints,
        "serviceProxyHealthy": true,
    })
    .to_string();
    (if t.local_endpoints > 0 { 200 } else { 503 }, body)
}

struct Server {
    target: Arc<Mutex<HcTarget>>,
    cancel: CancellationToken,
}

/// The running servers, one per port.
#[derive(Default)]
pub struct HcServers {
    servers: BTreeMap<u16, Server>,
}

impl HcServers {
    /// Opens servers for new ports, closes those of ports gone, updates the counts. A port
    /// that cannot be bound is logged and retried at the next sync.
    pub async fn sync(&mut self, want: &BTreeMap<u16, HcTarget>) {
        let gone: Vec<u16> = self
            .servers
            .keys()
            .filter(|p| !want.contains_key(p))
            .copied()
            .collect();
        for p in gone {
            if let Some(s) = self.servers.remove(&p) {
                s.cancel.cancel();
            }
        }
        for (port, t) in want {
            if let Some(s) = self.servers.get(port) {
                *s.target.lock().unwrap_or_else(|e| e.into_inner()) = t.clone();
                continue;
            }
            // Both families on one socket where the system allows it.
            let addr = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), *port);
            let listener = match TcpListener::bind(addr).await {
                Ok(l) => l,
                Err(_) => match TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], *port))).await {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::warn!(port, "health check node port: {e}");
                        continue;
                    }
                },
            };
            let target = Arc::new(Mutex::new(t.clone()));
            let cancel = CancellationToken::new();
            tokio::spawn(serve(listener, target.clone(), cancel.clone()));
            self.servers.insert(*port, Server { target, cancel });
        }
    }

    /// Closes every server.
    pub fn shutdown(&mut self) {
        for (_, s) in std::mem::take(&mut self.servers) {
            s.cancel.cancel();
        }
    }
}

impl Drop for HcServers {
    fn drop(&mut self) {
        self.shutdown();
    }
}

async fn serve(listener: TcpListener, target: Arc<Mutex<HcTarget>>, cancel: CancellationToken) {
    loop {
        let (mut s, _) = tokio::select! {
            _ = cancel.cancelled() => return,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(_) => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let t = target.lock().unwrap_or_else(|e| e.into_inner()).clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            let mut n = 0;
            while n < buf.len() {
                match tokio::time::timeout(std::time::Duration::from_secs(5), s.read(&mut buf[n..]))
                    .await
                {
                    Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
                    Ok(Ok(k)) => {
                        n += k;
                        if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                            break;
                        }
                    }
                }
            }
            let (code, body) = respond(&t);
            let reason = if code == 200 {
                "OK"
            } else {
                "Service Unavailable"
            };
            let resp = format!(
                "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nX-Content-Type-Options: nosniff\r\nX-Load-Balancing-Endpoint-Weight: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                t.local_endpoints,
                body.len()
            );
            let _ = s.write_all(resp.as_bytes()).await;
            let _ = s.shutdown().await;
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::model::{Proto, ServicePortName};

    fn sp(port: &str, hc: Option<u16>, ext: Target, v6: bool) -> SvcPort {
        SvcPort {
            name: ServicePortName {
                namespace: "ns".into(),
                name: "lb".into(),
                port: port.into(),
                proto: Proto::Tcp,
            },
            ipv6: v6,
            port: 80,
            node_port: Some(30080),
            cluster_ips: vec![],
            externals: vec![],
            internal: Target::Reject,
            external: ext,
            affinity: None,
            internal_local: false,
            external_local: true,
            health_check_node_port: hc,
        }
    }

    #[test]
    fn counts_unique_local_endpoints_per_port() {
        let pool = |v: &[&str]| Target::Pool(v.iter().map(|s| s.parse().unwrap()).collect());
        let t = targets(&[
            sp(
                "http",
                Some(32000),
                pool(&["10.244.1.2:80", "10.244.1.3:80"]),
                false,
            ),
            sp("https", Some(32000), pool(&["10.244.1.2:443"]), false),
            sp("http", Some(32000), pool(&["[fd00::2]:80"]), true),
            sp("x", None, pool(&["10.244.1.9:80"]), false),
        ]);
        assert_eq!(t.len(), 1);
        assert_eq!(t[&32000].local_endpoints, 3);
        assert_eq!(respond(&t[&32000]).0, 200);
        let t = targets(&[sp("http", Some(32001), Target::Drop, false)]);
        let (code, body) = respond(&t[&32001]);
        assert_eq!(code, 503);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["service"]["name"], "lb");
        assert_eq!(v["localEndpoints"], 0);
    }

    #[tokio::test]
    async fn serves_and_closes() {
        let mut hc = HcServers::default();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let mut want = BTreeMap::new();
        want.insert(
            port,
            HcTarget {
                namespace: "ns".into(),
                name: "lb".into(),
                local_endpoints: 0,
            },
        );
        hc.sync(&want).await;
        let get = || async move {
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .ok()?;
            s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .ok()?;
            let mut out = String::new();
            s.read_to_string(&mut out).await.ok()?;
            Some(out)
        };
        assert!(get().await.unwrap().starts_with("HTTP/1.1 503"));
        want.get_mut(&port).unwrap().local_endpoints = 2;
        hc.sync(&want).await;
        let r = get().await.unwrap();
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        assert!(r.contains("\"localEndpoints\":2"));
        hc.sync(&BTreeMap::new()).await;
        // Closed: a connection is refused (polling: the listener task ends asynchronously).
        let mut closed = false;
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_err()
            {
                closed = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert!(closed);
    }
}
