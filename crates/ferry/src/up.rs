//! `ferry up`: the cluster's services around the API server, in one process, each an ordinary
//! client of the API server just started — controllers, cluster DNS, a node agent for this host
//! and the userspace service proxy — on the loopback pod network (pods, Services and load
//! balancers all in 127.0.0.0/8, so nothing touches the machine's real network).

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use anyhow::{Context, Result};
use clap::Parser;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::ServerArgs;

/// The Service range of `ferry up` when none is given.
pub const SERVICE_RANGE: &str = "127.96.0.0/16";
/// The load-balancer pool of `ferry up` when none is given.
const LOADBALANCER_RANGE: &str = "127.0.0.240-127.0.0.254";

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// The tenth address of the primary Service range: the kube-dns Service (as kubeadm does).
fn kube_dns_ip(service_range: &str) -> Option<IpAddr> {
    let first = service_range.split(',').next()?.trim();
    let net: ipnet::IpNet = first.parse().ok()?;
    match net.network() {
        IpAddr::V4(a) => Some(IpAddr::V4(Ipv4Addr::from(u32::from(a).checked_add(10)?))),
        IpAddr::V6(a) => Some(IpAddr::V6(std::net::Ipv6Addr::from(
            u128::from(a).checked_add(10)?,
        ))),
    }
}

/// The first node-sized block of the cluster CIDR (the one node IPAM gives the only node).
fn first_pod_block(cluster_cidr: &str) -> Option<ipnet::IpNet> {
    let net: ipnet::IpNet = cluster_cidr.split(',').next()?.trim().parse().ok()?;
    let len = if net.addr().is_ipv4() { 24 } else { 64 };
    net.subnets(len.max(net.prefix_len())).ok()?.next()
}

/// Starts controllers, DNS, agent and proxy; returns once they are spawned.
pub async fn start_services(
    a: &ServerArgs,
    running: &ferry_apiserver::Running,
    shutdown: &CancellationToken,
) -> Result<()> {
    let kubeconfig = running.kubeconfig.clone();
    let service_range = crate::service_range(a, "up");
    let dns_ip =
        kube_dns_ip(&service_range).context("the Service range has no room for kube-dns")?;
    let root = is_root();
    ensure_kube_dns_service(running, dns_ip).await;

    start_controllers(
        &kubeconfig,
        shutdown,
        &a.controllers_arg,
        &a.cluster_cidr,
        &service_range,
    )?;

    let dns_listen = a.listen_dns.clone().unwrap_or_else(|| {
        if root {
            format!("{}:53", bracket(dns_ip))
        } else {
            "127.0.0.1:1053".to_string()
        }
    });
    if dns_listen != "off" {
        start_dns(a, &kubeconfig, shutdown, &dns_listen).await?;
    }
    if !root {
        eprintln!(
            "ferry up: not running as root, so: pods share the host's /etc/resolv.conf, /etc/hosts and \
             hostname (no mount/UTS namespaces); cluster DNS listens on {dns_listen} instead of {dns_ip}:53; \
             Service ports below 1024 cannot be served"
        );
    }

    let node_name = a.node_name.clone().unwrap_or_else(ferry_node::host_name);
    let mut agent = ferry_node::AgentArgs::defaults();
    agent.kubeconfig = Some(kubeconfig.clone());
    agent.node_name = Some(node_name.clone());
    agent.node_ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
    agent.cluster_dns = vec![dns_ip.to_string()];
    agent.state_dir = a.data_dir.join("agent");
    agent.port = a.agent_port;
    // The agent's endpoint: HTTPS with a serving certificate from the cluster CA, callers
    // authenticated by client certificates from that CA (the API server's kubelet client one).
    let tls = ferry_apiserver::pki::issue_agent_serving(&a.data_dir, &node_name, &[agent.node_ip])
        .context("issuing the agent's serving certificate")?;
    agent.tls_cert_file = Some(tls.cert_file);
    agent.tls_private_key_file = Some(tls.key_file);
    agent.client_ca_file = Some(tls.ca_file);
    // The node is NotReady until node IPAM (in the controllers) gives it a pod CIDR.
    agent.wait_for_pod_cidr = true;
    if let Some(block) = first_pod_block(&a.cluster_cidr) {
        agent.pod_cidr = block;
    }
    let stop = shutdown.clone();
    tokio::spawn(async move {
        if let Err(e) = ferry_node::run(agent, stop.cancelled_owned()).await {
            tracing::error!("node agent stopped: {e:#}");
        }
    });

    start_proxy(&kubeconfig, shutdown, &node_name, &a.proxy_healthz_listen)?;
    start_ingress(a, running, &kubeconfig, shutdown, root).await;
    // The loopback pod network cannot isolate pods: every NetworkPolicy gets a Warning Event
    // saying so, and the first one is reported here, once.
    {
        let kc = kubeconfig.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            match ferry_netpol::cli::client(Some(&kc)).await {
                Ok(c) => {
                    ferry_netpol::warn::run(c, "loopback".into(), stop, |name| {
                        eprintln!(
                            "ferry up: NetworkPolicy {name} (and any other) is not enforced on the \
                             loopback pod network; each gets a Warning Event (run as root for the \
                             netns pod network, which enforces them)"
                        )
                    })
                    .await
                }
                Err(e) => tracing::warn!("NetworkPolicy warnings: {e:#}"),
            }
        });
    }
    eprintln!(
        "ferry up: node {node_name}, Services in {service_range}, pods in {}, kube-dns {dns_ip}",
        a.cluster_cidr
    );
    Ok(())
}

fn bracket(ip: IpAddr) -> String {
    match ip {
        IpAddr::V6(v6) => format!("[{v6}]"),
        IpAddr::V4(v4) => v4.to_string(),
    }
}

/// The `kube-system/kube-dns` Service (selectorless: the in-process DNS serves its address).
async fn ensure_kube_dns_service(running: &ferry_apiserver::Running, ip: IpAddr) {
    let api = &running.server.api;
    let Some(res) = api.resource("", "v1", "services").cloned() else {
        return;
    };
    let path = ferry_apiserver::request::ResourcePath {
        group: String::new(),
        version: "v1".into(),
        namespace: Some("kube-system".into()),
        resource: "services".into(),
        name: None,
        subresource: None,
    };
    let body = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "kube-dns",
            "namespace": "kube-system",
            "labels": {"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS", "kubernetes.io/cluster-service": "true"}
        },
        "spec": {
            "clusterIP": ip.to_string(),
            "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
                {"name": "metrics", "port": 9153, "protocol": "TCP", "targetPort": 9153}
            ]
        }
    });
    match api
        .create(
            &res,
            &path,
            &ferry_apiserver::request::Query::default(),
            body,
        )
        .await
    {
        Ok(_) => {}
        Err(e) if e.code == 409 => {}
        Err(e) => tracing::warn!("creating the kube-dns Service: {}", e.message),
    }
}

fn start_controllers(
    kubeconfig: &Path,
    shutdown: &CancellationToken,
    extra: &[String],
    cluster_cidr: &str,
    service_range: &str,
) -> Result<()> {
    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        c: ferry_controllers::ControllersArgs,
    }
    let mut argv: Vec<String> = vec![
        "controllers".into(),
        "--kubeconfig".into(),
        kubeconfig.display().to_string(),
    ];
    let given = |flag: &str| extra.iter().any(|a| a.starts_with(flag));
    // A one-machine cluster: LoadBalancer Services get loopback addresses (as k3s ServiceLB
    // hands out the node's address), node pod CIDRs come from the loopback pod network.
    if !given("--loadbalancer-ip-range") {
        argv.push(format!("--loadbalancer-ip-range={LOADBALANCER_RANGE}"));
    }
    if !given("--cluster-cidr") {
        argv.push(format!("--cluster-cidr={cluster_cidr}"));
    }
    if !given("--node-ipam-excluded-cidrs") {
        argv.push(format!("--node-ipam-excluded-cidrs={service_range}"));
    }
    argv.extend(extra.iter().cloned());
    let args = Wrap::try_parse_from(argv)
        .context("controller arguments")?
        .c;
    let stop = shutdown.clone();
    crate::supervise::spawn(
        crate::supervise::Component::new("ferry-controllers"),
        shutdown.clone(),
        move || ferry_controllers::run(args.clone(), stop.clone().cancelled_owned()),
    );
    Ok(())
}

/// Connection caps of the components sharing this process's descriptors.
fn budget() -> ferry_limits::Budget {
    ferry_limits::plan(
        ferry_limits::fdlimit::current().soft,
        ferry_limits::Parts::ALL,
    )
}

async fn start_dns(
    a: &ServerArgs,
    kubeconfig: &Path,
    shutdown: &CancellationToken,
    listen: &str,
) -> Result<()> {
    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        dns: ferry_dns::DnsArgs,
    }
    let mut argv: Vec<String> = vec![
        "dns".into(),
        "--kubeconfig".into(),
        kubeconfig.display().to_string(),
        "--listen".into(),
        listen.to_string(),
        "--metrics-listen".into(),
        a.dns_metrics_listen.to_string(),
        format!("--service-cidr={}", crate::service_range(a, "up")),
        format!("--pod-cidr={}", a.cluster_cidr),
    ];
    if !a.dns_upstream.is_empty() {
        argv.push("--upstream".into());
        argv.push(
            a.dns_upstream
                .iter()
                .map(|u| u.to_string())
                .collect::<Vec<_>>()
                .join(","),
        );
    }
    argv.push(format!("--tcp-max-connections={}", budget().dns_tcp));
    let args = Wrap::try_parse_from(argv).context("DNS arguments")?.dns;
    // Bind now: a taken port stops `ferry up` at once, naming it.
    let first = ferry_dns::prepare(&args).await?;
    let component = crate::supervise::Component::new("ferry-dns");
    // Ready once the running instance has its first full lists.
    let index: std::sync::Arc<std::sync::Mutex<Option<std::sync::Arc<ferry_dns::SharedIndex>>>> =
        Default::default();
    crate::supervise::add_check("ferry-dns", {
        let (component, index) = (component.clone(), index.clone());
        move || {
            component.check()?;
            match &*index.lock().unwrap_or_else(|p| p.into_inner()) {
                Some(i) if i.is_ready() => Ok(()),
                _ => Err("DNS has not synced Services and EndpointSlices yet".into()),
            }
        }
    });
    let mut first = Some(first);
    let stop = shutdown.clone();
    crate::supervise::spawn(component, shutdown.clone(), move || {
        let (prepared, args, stop, index) =
            (first.take(), args.clone(), stop.clone(), index.clone());
        async move {
            let p = match prepared {
                Some(p) => p,
                None => ferry_dns::prepare(&args).await?,
            };
            *index.lock().unwrap_or_else(|p| p.into_inner()) = Some(p.readiness());
            p.run(stop.cancelled_owned()).await
        }
    });
    eprintln!("ferry up: cluster DNS on {listen} (UDP and TCP)");
    Ok(())
}

/// The Ingress controller and proxy on loopback (ports 80 and 443 as root), and the default
/// IngressClass `ferry` (as k3s installs one for its bundled controller), so that Ingresses
/// naming no class are served.
async fn start_ingress(
    a: &ServerArgs,
    running: &ferry_apiserver::Running,
    kubeconfig: &Path,
    shutdown: &CancellationToken,
    root: bool,
) {
    let (http, https) = if root {
        ("127.0.0.1:80", "127.0.0.1:443")
    } else {
        ("127.0.0.1:8080", "127.0.0.1:8443")
    };
    let mut args = ferry_ingress::IngressArgs::defaults();
    args.kubeconfig = Some(kubeconfig.to_path_buf());
    args.http_addr = a.ingress_http_addr.clone().unwrap_or_else(|| http.into());
    args.https_addr = a.ingress_https_addr.clone().unwrap_or_else(|| https.into());
    if args.http_addr == "off" && args.https_addr == "off" {
        return;
    }
    ensure_ingress_class(running).await;
    let show = |a: Option<std::net::SocketAddr>, scheme: &str| {
        a.map_or("off".to_string(), |a| format!("{scheme}://{a}"))
    };
    match ferry_ingress::start(&args, shutdown.clone()).await {
        Ok(r) => eprintln!(
            "ferry up: ingress listening on {} and {} (IngressClass ferry, controller {})",
            show(r.http, "http"),
            show(r.https, "https"),
            ferry_ingress::CONTROLLER_NAME
        ),
        Err(e) => {
            tracing::warn!("ingress not started: {e}");
            eprintln!("ferry up: ingress not started: {e}");
        }
    }
}

/// The default IngressClass `ferry` for the built-in controller.
async fn ensure_ingress_class(running: &ferry_apiserver::Running) {
    let api = &running.server.api;
    let Some(res) = api
        .resource("networking.k8s.io", "v1", "ingressclasses")
        .cloned()
    else {
        return;
    };
    let path = ferry_apiserver::request::ResourcePath {
        group: "networking.k8s.io".into(),
        version: "v1".into(),
        namespace: None,
        resource: "ingressclasses".into(),
        name: None,
        subresource: None,
    };
    let body = json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "IngressClass",
        "metadata": {
            "name": "ferry",
            "annotations": {"ingressclass.kubernetes.io/is-default-class": "true"}
        },
        "spec": {"controller": ferry_ingress::CONTROLLER_NAME}
    });
    match api
        .create(&res, &path, &ferry_apiserver::request::Query::default(), body)
        .await
    {
        Ok(_) => {}
        Err(e) if e.code == 409 => {}
        Err(e) => tracing::warn!("creating the IngressClass ferry: {}", e.message),
    }
}

fn start_proxy(
    kubeconfig: &Path,
    shutdown: &CancellationToken,
    node_name: &str,
    healthz: &str,
) -> Result<()> {
    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        p: ferry_proxy::ProxyArgs,
    }
    let healthz = if healthz == "off" { "" } else { healthz };
    let argv: Vec<String> = vec![
        "proxy".into(),
        "--kubeconfig".into(),
        kubeconfig.display().to_string(),
        "--node-name".into(),
        node_name.to_string(),
        "--node-ip".into(),
        "127.0.0.1".into(),
        format!("--healthz-bind-address={healthz}"),
        format!("--max-connections={}", budget().proxy),
    ];
    let args = Wrap::try_parse_from(argv).context("proxy arguments")?.p;
    let stop = shutdown.clone();
    crate::supervise::spawn(
        crate::supervise::Component::new("ferry-proxy"),
        shutdown.clone(),
        move || ferry_proxy::run(args.clone(), stop.clone().cancelled_owned()),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(
            kube_dns_ip("127.96.0.0/16"),
            Some("127.96.0.10".parse().expect("ip"))
        );
        assert_eq!(
            kube_dns_ip("10.96.0.0/12,fd00::/108"),
            Some("10.96.0.10".parse().expect("ip"))
        );
        assert_eq!(
            first_pod_block("127.100.0.0/16"),
            Some("127.100.0.0/24".parse().expect("net"))
        );
    }
}
