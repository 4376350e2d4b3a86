//! `ferry netpol explain|matrix|log`: the verdict function on the cluster's objects (read
//! with kube-rs), and the kernel's counters. The text is built by pure functions.

use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::ListParams;
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use crate::agent::{self, AgentConfig};
use crate::apply::Target;
use crate::matrix;
use crate::model::{self, Interner, Model, PodKey, Proto};
use crate::render::{RenderOptions, render};
use crate::slim::{SlimNamespace, SlimNode, SlimPod};
use crate::verdict::{Conn, Endpoint, evaluate, explain};

#[derive(Args, Debug, Clone)]
pub struct NetpolArgs {
    /// The kubeconfig to reach the API server (default: `$KUBECONFIG`, then in-cluster).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    #[command(subcommand)]
    pub command: NetpolCommand,
}

#[derive(Subcommand, Debug, Clone)]
pub enum NetpolCommand {
    /// Explain whether a connection is allowed: which policies isolate each side, which rule
    /// allows it.
    Explain {
        /// The source: NS/POD, or an address.
        #[arg(long)]
        from: String,
        /// The destination: NS/POD[:PORT[/PROTO]], or ADDRESS[:PORT[/PROTO]] ([v6]:PORT).
        /// Without a port: every container port the destination pod declares.
        #[arg(long)]
        to: String,
        /// Also evaluate the NetworkPolicies in this YAML/JSON file (added to, or replacing,
        /// the applied ones).
        #[arg(long = "what-if")]
        what_if: Option<PathBuf>,
    },
    /// Print the reachability matrix of the pods of some namespaces (`.` allowed, `X` denied).
    Matrix {
        /// Namespaces (repeatable, or comma-separated).
        #[arg(
            short = 'n',
            long = "namespace",
            value_delimiter = ',',
            required = true
        )]
        namespaces: Vec<String>,
        /// PORT/PROTO to evaluate (repeatable; default 80/TCP).
        #[arg(long = "port", value_delimiter = ',')]
        ports: Vec<String>,
        #[arg(long = "what-if")]
        what_if: Option<PathBuf>,
    },
    /// Enforce NetworkPolicy on one node: watch policies, pods, namespaces and nodes, and keep
    /// Ferry's nftables table of the node in line with them (what the node agents of
    /// `ferry up` run for each node).
    Agent {
        /// The node whose pods are enforced.
        #[arg(long = "node-name")]
        node_name: String,
        /// The node's network namespace (a path such as /run/netns/NAME); default: this one.
        #[arg(long)]
        netns: Option<PathBuf>,
        /// Sync once, print the node's table as an `nft -f` script and exit (nothing applied).
        #[arg(long = "dry-run")]
        dry_run: bool,
        /// Drop denied packets instead of rejecting them.
        #[arg(long = "drop")]
        drop: bool,
        /// Minimum time between two syncs, in milliseconds.
        #[arg(long = "min-sync-ms", default_value_t = 100)]
        min_sync_ms: u64,
        /// Remove the table when stopping (by default it stays: enforcement outlives a
        /// restart of the agent).
        #[arg(long = "cleanup-on-exit")]
        cleanup_on_exit: bool,
    },
    /// Denied (and, with --allowed, allowed) connection counts from the kernel's rules.
    Log {
        /// The node's network namespace (a path such as /run/netns/NAME); default: this one.
        #[arg(long)]
        netns: Option<PathBuf>,
        /// Also show the counts of each policy rule's accepts.
        #[arg(long)]
        allowed: bool,
        /// Print Prometheus text instead of a table.
        #[arg(long)]
        prometheus: bool,
        /// The node name for Prometheus labels.
        #[arg(long, default_value = "")]
        node: String,
    },
}

/// Why a `ferry netpol` command failed (`{:#}` shows the cause too).
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("unknown protocol {0:?}")]
    UnknownProtocol(String),
    #[error("invalid port {port:?}")]
    InvalidPort {
        port: String,
        #[source]
        source: std::num::ParseIntError,
    },
    #[error("port 0")]
    PortZero,
    #[error("missing ]")]
    MissingBracket,
    #[error("invalid address {addr:?}")]
    InvalidAddress {
        addr: String,
        #[source]
        source: std::net::AddrParseError,
    },
    #[error("{0:?}: expected NAMESPACE/POD or an address")]
    NotAPodOrAddress(String),
    #[error("pod {0} not found")]
    PodNotFound(String),
    #[error("reading YAML")]
    Yaml(#[source] serde_saphyr::Error),
    #[error("a NetworkPolicy")]
    NotAPolicy(#[source] serde_json::Error),
    #[error(transparent)]
    Project(#[from] model::ProjectError),
    #[error("no NetworkPolicy in the file")]
    NoPolicy,
    #[error(
        "no port given and the destination declares no named container port: use --to ...:PORT/PROTO"
    )]
    NoPort,
    #[error("no pods in {0}")]
    NoPods(String),
    #[error("listing {what}")]
    Listing {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("stopped before the watches synced")]
    StoppedBeforeSync,
    #[error("the sync loop of {0} ended")]
    SyncLoopEnded(String),
    #[error("reading {path}")]
    Reading {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Client(#[from] ferry_kubeclient::Error),
    #[error(transparent)]
    Join(#[from] tokio::task::JoinError),
    #[error(transparent)]
    Apply(#[from] crate::apply::ApplyError),
    #[error(
        "no {} table here: NetworkPolicy is not enforced in this network namespace",
        crate::render::TABLE
    )]
    NotEnforced,
}

type Result<T, E = CliError> = std::result::Result<T, E>;

/// `PORT[/PROTO]`.
pub fn parse_port(s: &str) -> Result<(u16, Proto)> {
    let (p, proto) = match s.split_once('/') {
        Some((p, proto)) => (
            p,
            Proto::parse(proto).ok_or_else(|| CliError::UnknownProtocol(proto.to_string()))?,
        ),
        None => (s, Proto::Tcp),
    };
    let port: u16 = p.parse().map_err(|source| CliError::InvalidPort {
        port: p.to_string(),
        source,
    })?;
    if port == 0 {
        return Err(CliError::PortZero);
    }
    Ok((port, proto))
}

/// A side of `explain`: the endpoint and an optional port.
pub fn parse_endpoint(model: &Model, s: &str) -> Result<(Endpoint, Option<(u16, Proto)>)> {
    let s = s.trim();
    if let Ok(ip) = s.parse() {
        return Ok((Endpoint::at(model, ip), None));
    }
    if let Some(rest) = s.strip_prefix('[') {
        let (addr, tail) = rest.split_once(']').ok_or(CliError::MissingBracket)?;
        let ip = addr.parse().map_err(|source| CliError::InvalidAddress {
            addr: addr.to_string(),
            source,
        })?;
        let port = match tail.strip_prefix(':') {
            Some(p) => Some(parse_port(p)?),
            None => None,
        };
        return Ok((Endpoint::at(model, ip), port));
    }
    let (who, port) = match s.split_once(':') {
        Some((w, p)) => (w, Some(parse_port(p)?)),
        None => (s, None),
    };
    if let Ok(ip) = who.parse() {
        return Ok((Endpoint::at(model, ip), port));
    }
    let (ns, name) = who
        .split_once('/')
        .ok_or_else(|| CliError::NotAPodOrAddress(who.to_string()))?;
    let key = PodKey::new(ns, name);
    if !model.pods.contains_key(&key) {
        return Err(CliError::PodNotFound(key.to_string()));
    }
    Ok((Endpoint::pod(key), port))
}

/// Policies from a YAML or JSON file (documents, or Lists of them).
pub fn parse_policies(text: &str) -> Result<Vec<model::Policy>> {
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(text).map_err(CliError::Yaml)?;
    let mut out = Vec::new();
    let mut push = |v: &serde_json::Value| -> Result<()> {
        if v.get("kind").and_then(|k| k.as_str()) != Some("NetworkPolicy") {
            return Ok(());
        }
        let np: NetworkPolicy = serde_json::from_value(v.clone()).map_err(CliError::NotAPolicy)?;
        out.push(model::project_policy(&np)?);
        Ok(())
    };
    for d in &docs {
        if d.is_null() {
            continue;
        }
        if let Some(items) = d.get("items").and_then(|i| i.as_array()) {
            for i in items {
                push(i)?;
            }
        } else {
            push(d)?;
        }
    }
    if out.is_empty() {
        return Err(CliError::NoPolicy);
    }
    Ok(out)
}

/// The `explain` text.
pub fn explain_text(model: &Model, from: &str, to: &str) -> Result<String> {
    let (src, _) = parse_endpoint(model, from)?;
    let (dst, port) = parse_endpoint(model, to)?;
    let ports: Vec<(u16, Proto)> = match port {
        Some(p) => vec![p],
        None => {
            let declared: Vec<(u16, Proto)> = dst
                .pod
                .as_ref()
                .and_then(|k| model.pods.get(k))
                .map(|p| p.ports.iter().map(|np| (np.port, np.proto)).collect())
                .unwrap_or_default();
            if declared.is_empty() {
                return Err(CliError::NoPort);
            }
            declared
        }
    };
    let mut out = String::new();
    for (i, (port, proto)) in ports.into_iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let c = Conn {
            src: src.clone(),
            dst: dst.clone(),
            proto,
            port,
        };
        let v = evaluate(model, &c);
        for line in explain(model, &c, &v) {
            out.push_str(&line);
            out.push('\n');
        }
    }
    Ok(out)
}

/// The `matrix` text.
pub fn matrix_text(model: &Model, namespaces: &[String], ports: &[(u16, Proto)]) -> Result<String> {
    let pods: Vec<PodKey> = model
        .pods
        .iter()
        .filter(|(k, p)| namespaces.contains(&k.namespace) && !p.host_network)
        .map(|(k, _)| k.clone())
        .collect();
    if pods.is_empty() {
        return Err(CliError::NoPods(namespaces.join(", ")));
    }
    let mut out = String::new();
    for (i, (port, proto)) in ports.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let grid = matrix::matrix(model, &pods, *proto, *port);
        out.push_str(&matrix::format(&pods, &grid, *proto, *port));
    }
    Ok(out)
}

/// Adds what-if policies to the model.
pub fn with_policies(mut model: Model, extra: Vec<model::Policy>) -> Model {
    for p in extra {
        model.policies.insert(p.key(), p);
    }
    model
}

/// A model built from lists of objects (page by page); unreadable policies are reported, not
/// fatal.
#[derive(Debug, Default)]
pub struct ModelBuilder {
    pub model: Model,
    pub warnings: Vec<String>,
    interner: Interner,
}

impl ModelBuilder {
    pub fn namespaces(&mut self, namespaces: &[SlimNamespace]) {
        for ns in namespaces {
            if let Some((n, l)) = model::project_slim_namespace(ns) {
                self.model.namespaces.insert(n, l);
            }
        }
    }
    pub fn pods(&mut self, pods: &[SlimPod]) {
        for p in pods {
            if let Some((k, info)) = model::project_slim_pod(p, &mut self.interner) {
                self.model.pods.insert(k, info);
            }
        }
    }
    pub fn nodes(&mut self, nodes: &[SlimNode]) {
        for n in nodes {
            if let Some((k, ips)) = model::project_slim_node(n) {
                self.model.nodes.insert(k, ips);
            }
        }
    }
    pub fn policies(&mut self, policies: &[NetworkPolicy]) {
        for np in policies {
            match model::project_policy(np) {
                Ok(p) => {
                    self.model.policies.insert(p.key(), p);
                }
                Err(e) => self.warnings.push(format!("ignoring a NetworkPolicy: {e}")),
            }
        }
    }
}

/// Calls `each` with every page of 500 objects of a kind (as kubectl and client-go list): only
/// one page is held at a time.
async fn each_page<K>(api: Api<K>, mut each: impl FnMut(&[K])) -> kube::Result<()>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut lp = ListParams::default().limit(500);
    loop {
        let page = api.list(&lp).await?;
        each(&page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => return Ok(()),
        }
    }
}

/// The model of the cluster: Pods, Namespaces and Nodes listed slim (see [`crate::slim`]),
/// page by page.
async fn load(client: Client) -> Result<Model> {
    let mut b = ModelBuilder::default();
    each_page(Api::<NetworkPolicy>::all(client.clone()), |p| b.policies(p))
        .await
        .map_err(|source| CliError::Listing {
            what: "NetworkPolicies",
            source,
        })?;
    each_page(Api::<SlimPod>::all(client.clone()), |p| b.pods(p))
        .await
        .map_err(|source| CliError::Listing {
            what: "Pods",
            source,
        })?;
    each_page(Api::<SlimNamespace>::all(client.clone()), |p| {
        b.namespaces(p)
    })
    .await
    .map_err(|source| CliError::Listing {
        what: "Namespaces",
        source,
    })?;
    // Nodes are optional for the verdict (own-node traffic): a user without access still gets
    // answers.
    let mut nodes = ModelBuilder::default();
    if each_page(Api::<SlimNode>::all(client), |p| nodes.nodes(p))
        .await
        .is_ok()
    {
        b.model.nodes = nodes.model.nodes;
    }
    for w in &b.warnings {
        eprintln!("warning: {w}");
    }
    Ok(b.model)
}

/// `ferry netpol agent`: until `shutdown`, or (`--dry-run`) until the first sync.
async fn run_agent(
    client: Client,
    cfg: AgentConfig,
    dry_run: bool,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let started = Instant::now();
    let cancel = CancellationToken::new();
    let _stop = cancel.clone().drop_guard();
    if dry_run {
        let tracker = agent::watch(client, cancel.clone());
        tokio::select! {
            _ = shutdown => return Err(CliError::StoppedBeforeSync),
            _ = tracker.wait_synced() => {}
        }
        let synced = started.elapsed();
        let model = tracker.model();
        let table = render(&model, &cfg.node_name, &cfg.render);
        print!("{}", crate::ruleset::full_script(&table));
        eprintln!(
            "netpol agent {}: synced in {:.2} s ({} pods, {} namespaces, {} policies, {} shared label sets and node names)",
            cfg.node_name,
            synced.as_secs_f64(),
            model.pods.len(),
            model.namespaces.len(),
            model.policies.len(),
            tracker.interned(),
        );
        return Ok(());
    }
    let node = cfg.node_name.clone();
    let mut running = agent::start(client, cfg, cancel.clone());
    let mut status = running.status.clone();
    tokio::pin!(shutdown);
    let mut announced = false;
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            r = status.changed() => {
                if r.is_err() {
                    return Err(CliError::SyncLoopEnded(node));
                }
                let st = status.borrow_and_update().clone();
                if !announced && st.syncs > 0 {
                    announced = true;
                    tracing::info!(
                        "netpol agent {node}: synced and applied in {:.2} s ({} isolated pod chains)",
                        started.elapsed().as_secs_f64(),
                        st.isolated_chains
                    );
                }
            }
        }
    }
    cancel.cancel();
    for t in running.tasks.drain(..) {
        let _ = t.await;
    }
    Ok(())
}

fn what_if(model: Model, file: Option<&std::path::Path>) -> Result<Model> {
    match file {
        None => Ok(model),
        Some(f) => {
            let text = std::fs::read_to_string(f).map_err(|source| CliError::Reading {
                path: f.display().to_string(),
                source,
            })?;
            Ok(with_policies(model, parse_policies(&text)?))
        }
    }
}

/// Runs one `ferry netpol` command, printing to stdout; `agent` runs until `shutdown`.
pub async fn run(args: NetpolArgs, shutdown: impl Future<Output = ()>) -> Result<()> {
    match args.command {
        NetpolCommand::Agent {
            node_name,
            netns,
            dry_run,
            drop,
            min_sync_ms,
            cleanup_on_exit,
        } => {
            let client = ferry_kubeclient::client(args.kubeconfig.as_deref()).await?;
            let mut cfg = AgentConfig::new(node_name, Target { netns });
            cfg.render = RenderOptions {
                reject: !drop,
                ..RenderOptions::default()
            };
            cfg.min_interval = Duration::from_millis(min_sync_ms);
            cfg.cleanup_on_exit = cleanup_on_exit;
            run_agent(client, cfg, dry_run, shutdown).await?;
        }
        NetpolCommand::Explain {
            from,
            to,
            what_if: file,
        } => {
            let m = what_if(
                load(ferry_kubeclient::client(args.kubeconfig.as_deref()).await?).await?,
                file.as_deref(),
            )?;
            print!("{}", explain_text(&m, &from, &to)?);
        }
        NetpolCommand::Matrix {
            namespaces,
            ports,
            what_if: file,
        } => {
            let m = what_if(
                load(ferry_kubeclient::client(args.kubeconfig.as_deref()).await?).await?,
                file.as_deref(),
            )?;
            let ports = if ports.is_empty() {
                vec![(80, Proto::Tcp)]
            } else {
                ports.iter().map(|p| parse_port(p)).collect::<Result<_>>()?
            };
            print!("{}", matrix_text(&m, &namespaces, &ports)?);
        }
        NetpolCommand::Log {
            netns,
            allowed,
            prometheus,
            node,
        } => {
            let target = Target { netns };
            let json = tokio::task::spawn_blocking(move || target.list_json()).await??;
            let Some(json) = json else {
                return Err(CliError::NotEnforced);
            };
            let rows = crate::log::counters(&json);
            if prometheus {
                print!("{}", crate::log::prometheus(&rows, &node));
            } else {
                print!("{}", crate::log::format(&rows, allowed));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::fixtures::e2e_model;

    const WHAT_IF: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: default-deny-ingress
  namespace: x
spec:
  podSelector: {}
  policyTypes:
  - Ingress
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: allow-b-81
  namespace: x
spec:
  podSelector:
    matchLabels:
      pod: a
  ingress:
  - from:
    - namespaceSelector:
        matchLabels:
          ns: "y"
      podSelector:
        matchLabels:
          pod: b
    ports:
    - port: serve-81-tcp
"#;

    #[test]
    fn ports_and_endpoints_parse() {
        let m = e2e_model(1);
        assert_eq!(parse_port("81/udp").unwrap(), (81, Proto::Udp));
        assert_eq!(parse_port("80").unwrap(), (80, Proto::Tcp));
        assert!(parse_port("0").is_err() && parse_port("80/icmp").is_err());
        let (e, p) = parse_endpoint(&m, "x/a:81/SCTP").unwrap();
        assert_eq!(e.pod, Some(PodKey::new("x", "a")));
        assert_eq!(p, Some((81, Proto::Sctp)));
        let (e, p) = parse_endpoint(&m, "10.0.1.2:80").unwrap();
        assert_eq!(
            e.pod,
            Some(PodKey::new("y", "b")),
            "a pod address is that pod"
        );
        assert_eq!(p, Some((80, Proto::Tcp)));
        let (e, p) = parse_endpoint(&m, "[fd00::1]:53/UDP").unwrap();
        assert_eq!(e.ip, Some("fd00::1".parse().unwrap()));
        assert_eq!(p, Some((53, Proto::Udp)));
        assert!(parse_endpoint(&m, "fd00::1").unwrap().1.is_none());
        assert!(parse_endpoint(&m, "x/nope").is_err());
    }

    #[test]
    fn explain_with_what_if() {
        let m = with_policies(e2e_model(3), parse_policies(WHAT_IF).unwrap());
        let t = explain_text(&m, "y/b", "x/a:81/TCP").unwrap();
        assert_eq!(
            t,
            "egress of the source y/b (10.0.1.2): no policy with Egress selects it, not isolated: allowed\n\
             ingress of the destination x/a (10.0.0.1): isolated by x/allow-b-81, x/default-deny-ingress; \
             allowed by x/allow-b-81 ingress[0] (peer [0] namespaceSelector {ns=y} + podSelector {pod=b}, port [0] serve-81-tcp/TCP)\n\
             verdict: y/b (10.0.1.2) → x/a (10.0.0.1) 81/TCP: ALLOWED\n"
        );
        let t = explain_text(&m, "y/c", "x/a:81").unwrap();
        assert!(
            t.ends_with("81/TCP: DENIED\n") && t.contains("no rule allows 81/TCP"),
            "{t}"
        );
        // Without a port: every declared port of the destination (6 in the e2e model).
        let t = explain_text(&m, "y/b", "x/a").unwrap();
        assert_eq!(t.matches("verdict:").count(), 6);
        assert_eq!(t.matches("ALLOWED").count(), 1, "{t}");
    }

    #[test]
    fn matrix_prints_a_truth_table() {
        let m = with_policies(e2e_model(3), parse_policies(WHAT_IF).unwrap());
        let t = matrix_text(
            &m,
            &["x".into(), "y".into()],
            &[(81, Proto::Tcp), (80, Proto::Udp)],
        )
        .unwrap();
        let tables: Vec<&str> = t.split("\n\n").collect();
        assert_eq!(tables.len(), 2);
        let lines: Vec<&str> = tables[0].lines().collect();
        assert_eq!(lines[0], "81/TCP\tx/a\tx/b\tx/c\ty/a\ty/b\ty/c");
        // Column x/a: only y/b and x/a itself; x/b and x/c deny everyone but themselves.
        assert_eq!(lines[1], "x/a   \t.\tX\tX\t.\t.\t.");
        assert_eq!(lines[5], "y/b   \t.\tX\tX\t.\t.\t.");
        assert_eq!(lines[6], "y/c   \tX\tX\tX\t.\t.\t.");
        assert!(tables[1].starts_with("80/UDP"));
        assert!(matrix_text(&m, &["nope".into()], &[(80, Proto::Tcp)]).is_err());
    }

    #[test]
    fn what_if_needs_a_policy() {
        assert!(parse_policies("apiVersion: v1\nkind: Pod\nmetadata: {name: a}\n").is_err());
        let list = r#"{"apiVersion": "v1", "kind": "List", "items": [{"kind": "NetworkPolicy", "metadata": {"name": "p", "namespace": "x"}, "spec": {"podSelector": {}}}]}"#;
        assert_eq!(parse_policies(list).unwrap().len(), 1);
    }
}
