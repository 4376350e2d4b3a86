//! Benchmark helper for `bench/dns/run.sh`.
//!
//! `dns_bench gen DIR` writes `DIR/cluster.local.zone` (the same records as a zone file, for a C
//! authoritative server) and `DIR/queries.txt` (dnsperf input).
//! `dns_bench serve ADDR:PORT [WORKERS]` serves the generated index (10k Services, 150k Pods)
//! in-process until killed.
#![allow(clippy::unwrap_used)]

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};

use ferry_dns::forward::ForwardConfig;
use ferry_dns::index::*;
use ferry_dns::{ServerConfig, start_with_index};

const NAMESPACES: usize = 100;
const SERVICES: usize = 10_000;
const HEADLESS_EVERY: usize = 10; // every 10th Service is headless
const ENDPOINTS_PER_HEADLESS: usize = 5;
const PODS: usize = 150_000;
const ZONE: &str = "cluster.local";

fn pod_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 128 + (i >> 16) as u8, (i >> 8) as u8, i as u8)
}
fn svc_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 96 + (i >> 16) as u8, (i >> 8) as u8, i as u8)
}
fn ns_of(i: usize) -> String {
    format!("ns-{}", i % NAMESPACES)
}

struct Model {
    services: Vec<ServiceInfo>,
    slices: Vec<SliceInfo>,
    pods: Vec<PodInfo>,
}

fn model() -> Model {
    let mut services = Vec::new();
    let mut slices = Vec::new();
    let mut next_pod = 0usize;
    for i in 0..SERVICES {
        let ns = ns_of(i);
        let name = format!("svc-{i}");
        let headless = i % HEADLESS_EVERY == 0;
        let kind = if headless {
            ServiceKind::Headless
        } else {
            ServiceKind::ClusterIp(vec![IpAddr::V4(svc_ip(i))])
        };
        let port = PortInfo {
            name: "http".into(),
            protocol: "tcp".into(),
            port: 80,
        };
        services.push(ServiceInfo {
            namespace: ns.clone(),
            name: name.clone(),
            kind,
            ports: vec![port.clone()],
            publish_not_ready: false,
        });
        if headless {
            let endpoints = (0..ENDPOINTS_PER_HEADLESS)
                .map(|e| {
                    let ip = IpAddr::V4(pod_ip(next_pod % PODS));
                    next_pod += 1;
                    EndpointInfo {
                        ip,
                        hostname: Some(format!("h{e}")),
                        ready: true,
                    }
                })
                .collect();
            slices.push(SliceInfo {
                namespace: ns,
                name: format!("{name}-abcde"),
                service: name,
                endpoints,
                ports: vec![PortInfo { port: 8080, ..port }],
            });
        }
    }
    let pods = (0..PODS)
        .map(|i| PodInfo {
            namespace: ns_of(i),
            name: format!("pod-{i}"),
            ips: vec![IpAddr::V4(pod_ip(i))],
        })
        .collect();
    Model {
        services,
        slices,
        pods,
    }
}

fn build_index(m: Model) -> Index {
    let mut idx = Index::new(ZoneConfig {
        pods: PodsMode::Verified,
        ..ZoneConfig::default()
    });
    for s in m.services {
        idx.upsert_service(s);
    }
    for s in m.slices {
        idx.upsert_slice(s);
    }
    for p in m.pods {
        idx.upsert_pod(p);
    }
    idx
}

fn zone_file(m: &Model) -> String {
    let mut z = String::with_capacity(32 << 20);
    let _ = writeln!(z, "$ORIGIN {ZONE}.\n$TTL 5");
    let _ = writeln!(
        z,
        "@ IN SOA ns.dns.{ZONE}. hostmaster.{ZONE}. 1 7200 1800 86400 5"
    );
    let _ = writeln!(z, "@ IN NS ns.dns.{ZONE}.");
    let _ = writeln!(z, "ns.dns IN A 127.0.0.1");
    let _ = writeln!(z, "dns-version IN TXT \"1.1.0\"");
    for s in &m.services {
        let base = format!("{}.{}.svc", s.name, s.namespace);
        match &s.kind {
            ServiceKind::ClusterIp(ips) => {
                for ip in ips {
                    let _ = writeln!(z, "{base} IN A {ip}");
                }
                let _ = writeln!(z, "_http._tcp.{base} IN SRV 0 100 80 {base}.{ZONE}.");
            }
            _ => {
                let slice = m
                    .slices
                    .iter()
                    .find(|sl| sl.service == s.name && sl.namespace == s.namespace);
                for ep in slice.map(|s| s.endpoints.as_slice()).unwrap_or_default() {
                    let host = ep.hostname.clone().unwrap_or_default();
                    let _ = writeln!(z, "{base} IN A {}", ep.ip);
                    let _ = writeln!(z, "{host}.{base} IN A {}", ep.ip);
                    let w = 100 / ENDPOINTS_PER_HEADLESS;
                    let _ = writeln!(
                        z,
                        "_http._tcp.{base} IN SRV 0 {w} 8080 {host}.{base}.{ZONE}."
                    );
                }
            }
        }
    }
    for p in &m.pods {
        for ip in &p.ips {
            let _ = writeln!(z, "{}.{}.pod IN A {ip}", ip_label(ip), p.namespace);
        }
    }
    z
}

fn queries(m: &Model) -> String {
    let mut q = String::new();
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut rnd = |n: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n as u64) as usize
    };
    for _ in 0..200_000 {
        let kind = rnd(100);
        if kind < 55 {
            let s = &m.services[rnd(SERVICES)];
            let _ = writeln!(q, "{}.{}.svc.{ZONE} A", s.name, s.namespace);
        } else if kind < 65 {
            let s = &m.services[rnd(SERVICES)];
            let _ = writeln!(q, "{}.{}.svc.{ZONE} AAAA", s.name, s.namespace);
        } else if kind < 75 {
            let s = &m.services[rnd(SERVICES)];
            let _ = writeln!(q, "_http._tcp.{}.{}.svc.{ZONE} SRV", s.name, s.namespace);
        } else if kind < 95 {
            let p = &m.pods[rnd(PODS)];
            let _ = writeln!(q, "{}.{}.pod.{ZONE} A", ip_label(&p.ips[0]), p.namespace);
        } else {
            let _ = writeln!(
                q,
                "missing-{}.ns-{}.svc.{ZONE} A",
                rnd(1_000_000),
                rnd(NAMESPACES)
            );
        }
    }
    q
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("gen") => {
            let dir = std::path::PathBuf::from(args.get(2).map(String::as_str).unwrap_or("."));
            let m = model();
            std::fs::write(dir.join("cluster.local.zone"), zone_file(&m))?;
            std::fs::write(dir.join("queries.txt"), queries(&m))?;
        }
        Some("serve") => {
            let listen = args
                .get(2)
                .map(String::as_str)
                .unwrap_or("127.0.0.1:15353")
                .parse()?;
            let workers = args.get(3).and_then(|w| w.parse().ok()).unwrap_or(1);
            let idx = build_index(model());
            eprintln!(
                "index: {} services, {} pods",
                idx.service_count(),
                idx.pod_count()
            );
            let cfg = ServerConfig {
                listen,
                udp_workers: workers,
                allow_recursion_from: vec![],
                forward: ForwardConfig {
                    upstreams: vec![],
                    stubs: vec![],
                    timeout: std::time::Duration::from_secs(1),
                },
                tcp: ferry_dns::TcpConfig::default(),
            };
            let running = start_with_index(idx, cfg).await?;
            eprintln!(
                "serving on {} (udp) {} (tcp)",
                running.udp_addr, running.tcp_addr
            );
            tokio::signal::ctrl_c().await?;
            running.stop().await?;
        }
        _ => anyhow::bail!("usage: dns_bench gen DIR | serve ADDR:PORT [WORKERS]"),
    }
    Ok(())
}
