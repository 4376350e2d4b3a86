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
pub mod portals;
pub mod trace;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::error::{Context, Error, Result};
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
    /// Userspace mode: do not bind Service addresses; open a port of the proxy's own per
    /// frontend and have the kernel redirect the frontend there (nftables rules in Ferry's
    /// table, as upstream's userspace proxier did with iptables portals). NodePorts stay bound.
    #[arg(long, action = clap::ArgAction::Set, num_args = 0..=1, default_value_t = false,
        default_missing_value = "true")]
    pub portals: bool,
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
            portals: false,
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

/// What one sync hands to the applier.
enum Input {
    /// The Services that may have changed, each with its whole kernel input (empty: gone).
    Services(Vec<(incr::SvcKey, Vec<input::SvcPort>)>),
    /// The whole kernel input (the iptables mode writes everything each time).
    All(Vec<input::SvcPort>),
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
            ProxyMode::Userspace => return Err(Error::NotKernelMode),
        })
    }

    /// Does this applier need the whole input at every sync?
    fn wants_all(&self) -> bool {
        matches!(self, Applier::Ipt(_))
    }

    fn sync(
        &mut self,
        input: Input,
        args: &ProxyArgs,
    ) -> Result<apply::SyncStats, apply::ApplyError> {
        match self {
            Applier::Nft(a, inc) => {
                let u = match input {
                    Input::Services(ch) => inc.update_services(ch),
                    Input::All(ports) => inc.update(&ports),
                };
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
            Applier::Ipt(a) => match input {
                Input::All(ports) => a.sync(&ports, &ipt_config(args)),
                Input::Services(_) => Err(apply::ApplyError::Failed {
                    cmd: "iptables sync".into(),
                    stderr: "the iptables mode needs the whole input".into(),
                }),
            },
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
        return Err(Error::NotListed);
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
    let (dst, port, proto) = trace::parse_target(&t.to)?;
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
    let syncer = Syncer::new(args, &node_name)?;
    let mut tasks = crate::watch::spawn(client, tracker.clone());
    tasks.push(tokio::spawn(sync_loop(
        tracker,
        syncer,
        args.clone(),
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

/// The loop's view of the kernel input, per Service, kept up to date from the tracker's
/// change sets: a sync touches only the Services that changed.
#[derive(Default)]
struct Known {
    ports: BTreeMap<incr::SvcKey, Vec<input::SvcPort>>,
    tables: BTreeMap<incr::SvcKey, crate::table::Table>,
    /// Services with a `healthCheckNodePort`.
    hc: BTreeSet<incr::SvcKey>,
}

/// One sync's worth of work, from [`Known::apply`].
struct Step {
    changes: Vec<(incr::SvcKey, Vec<input::SvcPort>)>,
    stale: Vec<apply::StaleUdp>,
    hc_changed: bool,
}

impl Known {
    /// Records the rebuilt Services; returns the changes with the UDP flows they end. Pure.
    fn apply(
        &mut self,
        built: Vec<(incr::SvcKey, Vec<input::SvcPort>, crate::table::Table)>,
    ) -> Step {
        let mut old = Vec::new();
        let mut new = Vec::new();
        let mut changes = Vec::new();
        let mut hc_changed = false;
        for (key, ports, table) in built {
            let prev = self.ports.remove(&key).unwrap_or_default();
            if prev == ports {
                if !ports.is_empty() {
                    self.ports.insert(key.clone(), prev);
                    self.tables.insert(key, table);
                }
                continue;
            }
            let had_hc = self.hc.remove(&key);
            let has_hc = ports.iter().any(|p| p.health_check_node_port.is_some());
            hc_changed |= had_hc || has_hc;
            if has_hc {
                self.hc.insert(key.clone());
            }
            old.extend(prev);
            new.extend(ports.iter().cloned());
            if ports.is_empty() {
                self.tables.remove(&key);
            } else {
                self.ports.insert(key.clone(), ports.clone());
                self.tables.insert(key.clone(), table);
            }
            changes.push((key, ports));
        }
        Step {
            changes,
            stale: apply::stale_udp(&old, &new),
            hc_changed,
        }
    }

    fn all_ports(&self) -> Vec<input::SvcPort> {
        self.ports.values().flatten().cloned().collect()
    }

    fn hc_targets(&self) -> BTreeMap<u16, healthcheck::HcTarget> {
        let ports: Vec<input::SvcPort> = self
            .hc
            .iter()
            .filter_map(|k| self.ports.get(k))
            .flatten()
            .cloned()
            .collect();
        healthcheck::targets(&ports)
    }

    /// The whole service table (what [`input::build`] gives).
    fn table(&self) -> crate::table::Table {
        let mut t = crate::table::Table::default();
        for st in self.tables.values() {
            t.pools
                .extend(st.pools.iter().map(|(k, v)| (k.clone(), v.clone())));
            for (f, k) in &st.frontends {
                t.frontends.entry(*f).or_insert_with(|| k.clone());
            }
        }
        t
    }
}

/// What one [`Syncer::step`] did.
#[derive(Debug, Default)]
pub struct StepReport {
    /// Every Service was rebuilt (the first sync, a Node changed).
    pub full: bool,
    /// Services whose kernel input changed.
    pub changed: usize,
    /// The health check ports may have changed.
    pub hc_changed: bool,
    pub result: Option<Result<apply::SyncStats, apply::ApplyError>>,
}

/// The kernel proxy's sync, one step at a time (the sync loop runs it on a blocking
/// thread): take what changed from the tracker, rebuild those Services' input, hand them to
/// the incremental renderer and the applier, flush the UDP flows that lost their endpoint.
pub struct Syncer {
    applier: Applier,
    known: Known,
    args: Arc<ProxyArgs>,
    node: String,
    first: bool,
    pending_stale: Vec<apply::StaleUdp>,
}

impl Syncer {
    pub fn new(args: &ProxyArgs, node: &str) -> Result<Syncer> {
        Ok(Syncer {
            applier: Applier::new(args)?,
            known: Known::default(),
            args: Arc::new(args.clone()),
            node: node.to_string(),
            first: true,
            pending_stale: Vec::new(),
        })
    }

    /// One sync: the Services changed since the last step (all of them at the first).
    pub fn step(&mut self, tracker: &Tracker) -> StepReport {
        let node = &self.node;
        let known = &self.known;
        let first = self.first;
        let (full, built) = tracker.take_changes(|st, ch| {
            let labels = st
                .nodes
                .get(node)
                .map(|n| n.labels.clone())
                .unwrap_or_default();
            if first || ch.all {
                let keys: BTreeSet<incr::SvcKey> = st
                    .services
                    .keys()
                    .chain(known.ports.keys())
                    .cloned()
                    .collect();
                (true, input::build_services(st, &keys, node, &labels))
            } else {
                (
                    false,
                    input::build_services(st, &ch.services, node, &labels),
                )
            }
        });
        self.first = false;
        let step = self.known.apply(built);
        let changed = step.changes.len();
        let input = if self.applier.wants_all() {
            Input::All(self.known.all_ports())
        } else {
            Input::Services(step.changes)
        };
        let mut stale = std::mem::take(&mut self.pending_stale);
        stale.extend(step.stale);
        let r = self.applier.sync(input, &self.args);
        if r.is_ok() {
            if !stale.is_empty() {
                apply::flush_stale_udp(&self.args.kernel.prefix(), &stale);
            }
        } else {
            self.pending_stale = stale;
        }
        StepReport {
            full,
            changed,
            hc_changed: step.hc_changed,
            result: Some(r),
        }
    }

    /// The health check servers wanted.
    pub fn hc_targets(&self) -> BTreeMap<u16, healthcheck::HcTarget> {
        self.known.hc_targets()
    }

    /// This node's whole service table (a copy: O(Services)).
    pub fn table(&self) -> crate::table::Table {
        self.known.table()
    }

    /// The state of Ferry's nftables table the applier believes the kernel holds.
    pub fn nft_state(&self) -> Option<&nft::Ruleset> {
        match &self.applier {
            Applier::Nft(a, _) => a.current(),
            Applier::Ipt(_) => None,
        }
    }

    /// Sends element changes through `nft -f` instead of netlink (for comparisons).
    pub fn set_use_netlink(&mut self, on: bool) {
        if let Applier::Nft(a, _) = &mut self.applier {
            a.use_netlink = on;
        }
    }

    /// Removes the rules.
    pub fn cleanup(&mut self) -> Result<(), apply::ApplyError> {
        self.applier.cleanup()
    }
}

/// The published service table is refreshed at most this often (it is a copy of every
/// Service's part: O(Services)), so that one Service's change costs what it touches.
const TABLE_REFRESH: Duration = Duration::from_secs(1);

async fn sync_loop(
    tracker: Arc<Tracker>,
    syncer: Syncer,
    args: ProxyArgs,
    status: tokio_watch::Sender<SyncStatus>,
    cancel: CancellationToken,
) {
    if !wait_synced(&tracker, &cancel).await {
        return;
    }
    // Exit removes the rules, also when the task is aborted rather than cancelled.
    let _guard = CleanupGuard(Some(args.clone()));
    let mut syncer = Some(syncer);
    let mut last_run: Option<Instant> = None;
    let mut syncs = 0u64;
    let mut hc = healthcheck::HcServers::default();
    let mut table = Arc::new(crate::table::Table::default());
    let mut table_at: Option<Instant> = None;
    let mut table_stale = false;
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
        let Some(mut s) = syncer.take() else { break };
        let t = tracker.clone();
        let joined = tokio::task::spawn_blocking(move || {
            let r = s.step(&t);
            (s, r)
        })
        .await;
        let Ok((s, report)) = joined else { break };
        if report.full || report.hc_changed {
            hc.sync(&s.hc_targets()).await;
        }
        table_stale |= report.changed > 0;
        if table_stale && (report.full || table_at.is_none_or(|t| t.elapsed() >= TABLE_REFRESH)) {
            table = Arc::new(s.table());
            table_at = Some(Instant::now());
            table_stale = false;
        }
        syncer = Some(s);
        let mut failed = Vec::new();
        let mut retry = args.sync_period;
        match report.result {
            Some(Ok(st)) => {
                tracing::debug!(
                    full = st.full,
                    changed = report.changed,
                    ops = st.ops,
                    took_us = st.took.as_micros() as u64,
                    "kernel proxy sync"
                );
            }
            Some(Err(e)) => {
                tracing::warn!("kernel proxy sync failed: {e}");
                failed.push(e.to_string());
                retry = Duration::from_secs(1);
            }
            None => {}
        }
        if table_stale {
            retry = retry.min(TABLE_REFRESH);
        }
        syncs += 1;
        status.send_replace(SyncStatus {
            syncs,
            last_sync: Some(SystemTime::now()),
            table: table.clone(),
            failed,
        });
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tracker.changed() => {}
            _ = tokio::time::sleep(retry) => {}
        }
    }
    drop(syncer);
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::model::{EndpointInfo, PortInfo, Proto, ServiceInfo, SliceInfo, SlicePort};
    use crate::sync::State;

    fn state(n: usize, eps: &[&str]) -> State {
        let mut st = State::default();
        for i in 0..n {
            let name = format!("s{i}");
            st.put_service(
                ("ns".into(), name.clone()),
                Some(ServiceInfo {
                    namespace: "ns".into(),
                    name: name.clone(),
                    cluster_ips: vec![format!("10.96.0.{}", i + 1).parse().unwrap()],
                    ports: vec![PortInfo {
                        name: "dns".into(),
                        proto: Proto::Udp,
                        port: 53,
                        node_port: (i == 1).then_some(30053),
                    }],
                    ..ServiceInfo::default()
                }),
            );
            st.put_slice(
                ("ns".into(), format!("{name}-x")),
                Some(SliceInfo {
                    namespace: "ns".into(),
                    name: format!("{name}-x"),
                    service: name,
                    ports: vec![SlicePort {
                        name: "dns".into(),
                        proto: Proto::Udp,
                        port: 5353,
                    }],
                    endpoints: eps
                        .iter()
                        .map(|ip| EndpointInfo {
                            ip: ip.parse().unwrap(),
                            ready: true,
                            serving: true,
                            terminating: false,
                            node_name: None,
                            zone: None,
                            hint_zones: None,
                            topology: BTreeMap::new(),
                        })
                        .collect(),
                }),
            );
        }
        st
    }

    #[test]
    fn per_service_input_is_the_whole_input() {
        let st = state(4, &["10.244.0.2", "10.244.0.3"]);
        let labels = Labels::new();
        let (whole, table) = input::build(&st.services, &st.slices, &st.nodes, "n1", &labels);
        let keys: BTreeSet<incr::SvcKey> = st.services.keys().cloned().collect();
        let built = input::build_services(&st, &keys, "n1", &labels);
        let mut known = Known::default();
        let step = known.apply(built);
        assert_eq!(step.changes.len(), 4);
        assert_eq!(known.all_ports(), whole);
        assert_eq!(known.table(), table);
        // A Service that is gone gives no ports.
        let gone = input::build_services(
            &st,
            &[("ns".to_string(), "nope".to_string())],
            "n1",
            &labels,
        );
        assert!(gone[0].1.is_empty());
    }

    #[test]
    fn a_change_touches_only_its_service_and_its_udp_flows() {
        let labels = Labels::new();
        let st = state(3, &["10.244.0.2", "10.244.0.3"]);
        let keys: BTreeSet<incr::SvcKey> = st.services.keys().cloned().collect();
        let mut known = Known::default();
        known.apply(input::build_services(&st, &keys, "n1", &labels));
        // Every Service handed over again, one endpoint gone everywhere but only s1 rebuilt.
        let st2 = state(3, &["10.244.0.2"]);
        let one = [("ns".to_string(), "s1".to_string())];
        let step = known.apply(input::build_services(&st2, &one, "n1", &labels));
        assert_eq!(step.changes.len(), 1);
        assert!(!step.hc_changed);
        let ep: std::net::SocketAddr = "10.244.0.3:5353".parse().unwrap();
        assert_eq!(
            step.stale,
            vec![
                apply::StaleUdp {
                    frontend: None,
                    port: 30053,
                    endpoint: ep
                },
                apply::StaleUdp {
                    frontend: Some("10.96.0.2".parse().unwrap()),
                    port: 53,
                    endpoint: ep
                },
            ]
        );
        // Unchanged: nothing to do.
        let step = known.apply(input::build_services(&st2, &one, "n1", &labels));
        assert!(step.changes.is_empty() && step.stale.is_empty());
        // Gone: its ports go, its flows are stale.
        let mut st3 = state(3, &["10.244.0.2"]);
        st3.put_service(one[0].clone(), None);
        let step = known.apply(input::build_services(&st3, &one, "n1", &labels));
        assert_eq!(step.changes, vec![(one[0].clone(), Vec::new())]);
        assert_eq!(step.stale.len(), 2);
        assert_eq!(known.ports.len(), 2);
        assert_eq!(known.tables.len(), 2);
    }
}
