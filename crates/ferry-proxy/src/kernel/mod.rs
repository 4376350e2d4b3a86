//! The kernel service proxy: `--proxy-mode nftables` (Ferry's own `inet` table, maps-only
//! layout, one transaction per sync carrying only the difference) and `--proxy-mode iptables`
//! (upstream kube-proxy's chains through `iptables-restore --noflush`, as in seed 002).
//!
//! The same change tracker and coalescing sync loop as the userspace proxy feed a pure
//! pipeline: service table ([`crate::table`]) → kernel input ([`input`]) → desired state
//! ([`nft::render`] / [`iptables::render`]) → difference ([`nft::diff`]) → kernel
//! ([`apply`]). [`trace`] explains the rendered nftables state for one packet.
//!
//! Rules are applied with the `nft` and `iptables-restore` commands (one process per sync, the
//! whole batch at once); only Ferry's table (nftables) or kube-proxy's `KUBE-*` chains
//! (iptables) are touched, and both are removed on exit and by `--cleanup`.

pub mod apply;
pub mod healthcheck;
pub mod incr;
pub mod input;
pub mod iptables;
pub mod netlink;
pub mod nft;
pub mod trace;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use ipnet::IpNet;
use tokio::sync::watch as tokio_watch;
use tokio_util::sync::CancellationToken;

use crate::sync::{State, SyncStatus, Tracker};
use crate::{ProxyArgs, ProxyMode};

/// Kernel-mode flags of `ferry proxy`.
#[derive(clap::Args, Debug, Clone)]
pub struct KernelArgs {
    /// The cluster's pod CIDRs (comma-separated): ClusterIP traffic from elsewhere is
    /// masqueraded, and pod traffic to a `Local` external frontend is short-circuited.
    #[arg(long = "cluster-cidr", value_delimiter = ',')]
    pub cluster_cidr: Vec<IpNet>,
    /// Masquerade all ClusterIP traffic.
    #[arg(long = "masquerade-all")]
    pub masquerade_all: bool,
    /// The name of Ferry's nftables table (family inet).
    #[arg(long = "nft-table", default_value = nft::TABLE)]
    pub nft_table: String,
    /// The iptables command of the iptables mode (`iptables`, `iptables-legacy`, ...).
    #[arg(long = "iptables-command", default_value = "iptables")]
    pub iptables_command: String,
    /// Print the ruleset for the cluster as it is, change nothing, and exit.
    #[arg(long = "dry-run")]
    pub dry_run: bool,
    /// Remove Ferry's nftables table and the iptables chains, then exit.
    #[arg(long)]
    pub cleanup: bool,
    /// Apply the rules inside this network namespace (`ip netns exec NAME ...`).
    #[arg(long = "apply-in-netns")]
    pub apply_in_netns: Option<String>,
}

impl Default for KernelArgs {
    fn default() -> Self {
        KernelArgs {
            cluster_cidr: Vec::new(),
            masquerade_all: false,
            nft_table: nft::TABLE.into(),
            iptables_command: "iptables".into(),
            dry_run: false,
            cleanup: false,
            apply_in_netns: None,
        }
    }
}

impl KernelArgs {
    fn prefix(&self) -> Vec<String> {
        apply::netns_prefix(self.apply_in_netns.as_deref())
    }
}

/// `ferry proxy trace`: explain one packet from the rules the proxy would write.
#[derive(clap::Args, Debug, Clone)]
pub struct TraceArgs {
    /// The packet's source address.
    #[arg(long)]
    pub from: IpAddr,
    /// The destination, `IP:PORT/PROTO` (`[IPv6]:PORT/PROTO`; TCP when no protocol is given).
    #[arg(long)]
    pub to: String,
}

fn nft_config(args: &ProxyArgs) -> nft::NftConfig {
    nft::NftConfig {
        pod_cidrs: args.kernel.cluster_cidr.clone(),
        node_ips: args.node_ip.clone(),
        masquerade_all: args.kernel.masquerade_all,
    }
}

fn ipt_config(args: &ProxyArgs) -> iptables::IptConfig {
    iptables::IptConfig {
        pod_cidrs: args.kernel.cluster_cidr.clone(),
        masquerade_all: args.kernel.masquerade_all,
    }
}

/// The kernel input for this node from the tracked state.
pub fn input_from(st: &State, node: &str) -> (Vec<input::SvcPort>, crate::table::Table) {
    let labels = st
        .nodes
        .get(node)
        .map(|n| n.labels.clone())
        .unwrap_or_default();
    input::build(&st.services, &st.slices, &st.nodes, node, &labels)
}

/// The node's own addresses (for the tracer): `--node-ip`, else the Node's addresses.
fn local_addrs(st: &State, args: &ProxyArgs, node: &str) -> BTreeSet<IpAddr> {
    let mut out: BTreeSet<IpAddr> = args.node_ip.iter().copied().collect();
    if out.is_empty()
        && let Some(n) = st.nodes.get(node)
    {
        out.extend(n.addresses.iter().copied());
    }
    out
}

enum Applier {
    /// The table is rendered one changed Service at a time.
    Nft(apply::NftApplier, Box<incr::Incremental>),
    Ipt(apply::IptApplier),
}

impl Applier {
    fn new(args: &ProxyArgs) -> Result<Applier> {
        let prefix = args.kernel.prefix();
        Ok(match args.proxy_mode {
            ProxyMode::Nftables => Applier::Nft(
                apply::NftApplier::new(
                    &args.kernel.nft_table,
                    args.kernel.apply_in_netns.as_deref(),
                ),
                Box::new(incr::Incremental::new(&nft_config(args))),
            ),
            ProxyMode::Iptables => {
                // Localhost NodePorts (as upstream's iptables mode): 127.0.0.1 may be routed
                // to an endpoint. Set where the rules go (a node namespace in `ferry up`).
                if let Err(e) = apply::run(
                    &prefix,
                    &["sysctl", "-q", "-w", "net.ipv4.conf.all.route_localnet=1"],
                    None,
                ) {
                    tracing::warn!("route_localnet (localhost NodePorts): {e}");
                }
                Applier::Ipt(apply::IptApplier::new(
                    &args.kernel.iptables_command,
                    prefix,
                ))
            }
            ProxyMode::Userspace => bail!("not a kernel proxy mode"),
        })
    }

    fn sync(
        &mut self,
        ports: &[input::SvcPort],
        args: &ProxyArgs,
    ) -> Result<apply::SyncStats, apply::ApplyError> {
        match self {
            Applier::Nft(a, inc) => {
                let u = inc.update(ports);
                let r = if u.full {
                    a.invalidate();
                    a.sync(inc.state())
                } else {
                    a.sync_ops(inc.state(), &u.ops)
                };
                if r.is_err() {
                    // The next sync writes the whole table again.
                    inc.reset();
                }
                r
            }
            Applier::Ipt(a) => a.sync(ports, &ipt_config(args)),
        }
    }

    fn cleanup(&mut self) -> Result<(), apply::ApplyError> {
        match self {
            Applier::Nft(a, _) => a.cleanup(),
            Applier::Ipt(a) => a.cleanup(),
        }
    }
}

/// `ferry proxy --cleanup`: removes Ferry's nftables table and kube-proxy's iptables chains.
pub fn cleanup(args: &ProxyArgs) -> Result<()> {
    let prefix = args.kernel.prefix();
    apply::NftApplier::new(
        &args.kernel.nft_table,
        args.kernel.apply_in_netns.as_deref(),
    )
    .cleanup()
    .context("removing the nftables table")?;
    let mut ipt = apply::IptApplier::new(&args.kernel.iptables_command, prefix);
    if let Err(e) = ipt.cleanup() {
        // No iptables on the machine, or nothing of ours: only worth a note.
        tracing::debug!("iptables cleanup: {e}");
    }
    Ok(())
}

/// Waits until the watches have listed everything once.
async fn wait_synced(tracker: &Tracker, cancel: &CancellationToken) -> bool {
    while !tracker.synced() {
        tokio::select! {
            _ = cancel.cancelled() => return false,
            _ = tracker.changed() => {}
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
    true
}

/// Lists the cluster once (for `--dry-run` and `trace`).
async fn snapshot(client: kube::Client) -> Result<Arc<Tracker>> {
    let tracker = Arc::new(Tracker::default());
    let tasks = crate::watch::spawn(client, tracker.clone());
    let cancel = CancellationToken::new();
    let ok = tokio::time::timeout(Duration::from_secs(30), wait_synced(&tracker, &cancel)).await;
    for t in tasks {
        t.abort();
    }
    if !matches!(ok, Ok(true)) {
        bail!("the API server did not list Services and EndpointSlices within 30 s");
    }
    Ok(tracker)
}

/// `ferry proxy --dry-run`: the ruleset for the cluster as it is.
pub async fn dry_run(client: kube::Client, args: &ProxyArgs) -> Result<String> {
    let tracker = snapshot(client).await?;
    let node = args.node_name.clone().unwrap_or_else(crate::hostname);
    let (ports, _) = tracker.take(|st| input_from(st, &node));
    Ok(match args.proxy_mode {
        ProxyMode::Iptables => {
            let cfg = ipt_config(args);
            let none = BTreeSet::new();
            let mut s = iptables::render(&ports, false, &cfg, &none).text;
            if ports.iter().any(|p| p.ipv6) {
                s.push_str("# IPv6 (ip6tables-restore)\n");
                s.push_str(&iptables::render(&ports, true, &cfg, &none).text);
            }
            s
        }
        _ => nft::render_full(
            &args.kernel.nft_table,
            &nft::render(&ports, &nft_config(args)),
        ),
    })
}

/// `ferry proxy trace`.
pub async fn trace_cmd(client: kube::Client, args: &ProxyArgs, t: &TraceArgs) -> Result<String> {
    let (dst, port, proto) = trace::parse_target(&t.to).map_err(anyhow::Error::msg)?;
    let tracker = snapshot(client).await?;
    let node = args.node_name.clone().unwrap_or_else(crate::hostname);
    let (ports, local) = tracker.take(|st| (input_from(st, &node).0, local_addrs(st, args, &node)));
    let rs = nft::render(&ports, &nft_config(args));
    let pkt = trace::Packet {
        src: t.from,
        dst,
        port,
        proto,
    };
    Ok(trace::trace(&rs, &pkt, &local).to_string())
}

/// Starts the kernel proxy: the watches, the sync loop and the health server.
pub async fn start(
    client: kube::Client,
    args: &ProxyArgs,
    cancel: CancellationToken,
) -> Result<crate::Proxy> {
    let node_name = args.node_name.clone().unwrap_or_else(crate::hostname);
    let tracker = Arc::new(Tracker::default());
    let (status_tx, status_rx) = tokio_watch::channel(SyncStatus::default());
    let healthz_addr = match args.healthz_bind_address.0 {
        Some(a) => Some(
            crate::health::serve(
                a,
                tracker.clone(),
                status_rx.clone(),
                args.healthz_timeout,
                cancel.clone(),
            )
            .await
            .with_context(|| format!("binding the health server on {a}"))?,
        ),
        None => None,
    };
    let applier = Applier::new(args)?;
    let mut tasks = crate::watch::spawn(client, tracker.clone());
    tasks.push(tokio::spawn(sync_loop(
        tracker,
        applier,
        args.clone(),
        node_name.clone(),
        status_tx,
        cancel.clone(),
    )));
    tracing::info!(node = %node_name, mode = ?args.proxy_mode, healthz = ?healthz_addr,
        "service proxy started (kernel mode)");
    Ok(crate::Proxy {
        healthz_addr,
        status: status_rx,
        cancel,
        tasks,
    })
}

async fn sync_loop(
    tracker: Arc<Tracker>,
    applier: Applier,
    args: ProxyArgs,
    node: String,
    status: tokio_watch::Sender<SyncStatus>,
    cancel: CancellationToken,
) {
    if !wait_synced(&tracker, &cancel).await {
        return;
    }
    // Exit removes the rules, also when the task is aborted rather than cancelled.
    let _guard = CleanupGuard(Some(args.clone()));
    let mut applier = Some(applier);
    let args = Arc::new(args);
    let mut last_run: Option<Instant> = None;
    let mut syncs = 0u64;
    let mut prev: Vec<input::SvcPort> = Vec::new();
    let mut hc = healthcheck::HcServers::default();
    loop {
        if let Some(last) = last_run {
            let since = last.elapsed();
            if since < args.min_sync_period {
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = tokio::time::sleep(args.min_sync_period - since) => {}
                }
            }
        }
        last_run = Some(Instant::now());
        let (ports, table) = tracker.take(|st| input_from(st, &node));
        let Some(mut a) = applier.take() else { break };
        let a2 = args.clone();
        let stale = apply::stale_udp(&prev, &ports);
        let ports_c = ports.clone();
        let joined = tokio::task::spawn_blocking(move || {
            let r = a.sync(&ports_c, &a2);
            if r.is_ok() && !stale.is_empty() {
                let prefix = a2.kernel.prefix();
                apply::flush_stale_udp(&prefix, &stale);
            }
            (a, r)
        })
        .await;
        let Ok((a, result)) = joined else { break };
        applier = Some(a);
        hc.sync(&healthcheck::targets(&ports)).await;
        let mut failed = Vec::new();
        let mut retry = args.sync_period;
        match result {
            Ok(st) => {
                prev = ports;
                tracing::debug!(
                    full = st.full,
                    ops = st.ops,
                    took_us = st.took.as_micros() as u64,
                    "kernel proxy sync"
                );
            }
            Err(e) => {
                tracing::warn!("kernel proxy sync failed: {e}");
                failed.push(e.to_string());
                retry = Duration::from_secs(1);
            }
        }
        syncs += 1;
        status.send_replace(SyncStatus {
            syncs,
            last_sync: Some(SystemTime::now()),
            table: Arc::new(table),
            failed,
        });
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tracker.changed() => {}
            _ = tokio::time::sleep(retry) => {}
        }
    }
    drop(applier);
}

/// Removes the kernel rules when dropped (the sync loop's end, cancelled or aborted).
struct CleanupGuard(Option<ProxyArgs>);

impl Drop for CleanupGuard {
    fn drop(&mut self) {
        let Some(args) = self.0.take() else { return };
        match Applier::new(&args) {
            Ok(mut a) => {
                if let Err(e) = a.cleanup() {
                    tracing::warn!("removing the kernel rules: {e}");
                } else {
                    tracing::info!("kernel proxy rules removed");
                }
            }
            Err(e) => tracing::warn!("removing the kernel rules: {e}"),
        }
    }
}

/// The node labels map type used by [`input::build`].
pub type Labels = BTreeMap<String, String>;
