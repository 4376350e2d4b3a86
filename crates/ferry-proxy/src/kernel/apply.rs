//! Applying rendered state to the kernel: nftables through one `nft -f -` transaction per sync
//! (the whole table on the first sync or after a failure, only the difference afterwards),
//! iptables through `iptables-restore --noflush` of Ferry's chains only, and the removal of
//! stale UDP conntrack entries. Commands may be prefixed (e.g. `ip netns exec NS`) to act in
//! another network namespace.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::input::{SvcPort, Target};
use super::iptables::{self, IptConfig};
use super::netlink::{self, NlSocket};
use super::nft::{self, Ruleset};
use crate::model::Proto;

/// Errors of the appliers.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("running {cmd}: {source}")]
    Spawn { cmd: String, source: std::io::Error },
    #[error("{cmd} failed: {stderr}")]
    Failed { cmd: String, stderr: String },
}

/// Runs `prefix + args` with `input` on stdin.
pub fn run(prefix: &[String], args: &[&str], input: Option<&str>) -> Result<String, ApplyError> {
    let mut argv: Vec<String> = prefix.to_vec();
    argv.extend(args.iter().map(|s| s.to_string()));
    let cmd = argv.join(" ");
    let Some((prog, rest)) = argv.split_first() else {
        return Err(ApplyError::Failed {
            cmd,
            stderr: "empty command".into(),
        });
    };
    let mut child = Command::new(prog)
        .args(rest)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| ApplyError::Spawn {
            cmd: cmd.clone(),
            source,
        })?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(text.as_bytes())
            .map_err(|source| ApplyError::Spawn {
                cmd: cmd.clone(),
                source,
            })?;
    }
    let out = child
        .wait_with_output()
        .map_err(|source| ApplyError::Spawn {
            cmd: cmd.clone(),
            source,
        })?;
    if !out.status.success() {
        let mut stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        stderr.truncate(4000);
        return Err(ApplyError::Failed { cmd, stderr });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// What one sync did.
#[derive(Debug, Clone, Default)]
pub struct SyncStats {
    /// The whole table was written (first sync, resync after an error).
    pub full: bool,
    /// Operations sent (0: nothing changed, no process started).
    pub ops: usize,
    pub took: Duration,
    /// Sent over netlink (no `nft` process).
    pub netlink: bool,
    /// Of `took`, the time spent sending to the kernel and waiting for its answer (the
    /// netlink batch, or the `nft` / `iptables-restore` process).
    pub kernel: Duration,
    /// Of `kernel`, a whole-table write split in two: the `nft -f` transaction with the
    /// table's structure (chains, rules, empty sets), and the netlink batch with every
    /// element. Zero otherwise.
    pub structure: Duration,
    pub elements: Duration,
}

/// The command prefix that runs a command in network namespace `netns`.
pub fn netns_prefix(netns: Option<&str>) -> Vec<String> {
    match netns {
        Some(ns) => vec!["ip".into(), "netns".into(), "exec".into(), ns.to_string()],
        None => Vec::new(),
    }
}

/// How the element-only syncs are sent.
enum Fast {
    /// Not tried yet.
    Untried,
    Netlink(NlSocket),
    /// Netlink could not be opened: `nft -f` for everything.
    Unavailable,
}

/// Keeps Ferry's nftables table in the desired state.
pub struct NftApplier {
    pub table: String,
    pub prefix: Vec<String>,
    netns: Option<String>,
    current: Option<Ruleset>,
    fast: Fast,
    /// Use netlink for element-only syncs (default); `false` sends everything through `nft`.
    pub use_netlink: bool,
    last_kernel: Duration,
}

impl NftApplier {
    /// An applier acting in network namespace `netns` (`ip netns` name), or in the current one.
    pub fn new(table: &str, netns: Option<&str>) -> NftApplier {
        NftApplier {
            table: table.to_string(),
            prefix: netns_prefix(netns),
            netns: netns.map(str::to_string),
            current: None,
            fast: Fast::Untried,
            use_netlink: true,
            last_kernel: Duration::ZERO,
        }
    }

    /// Brings the table to `desired` with `ops` (from [`super::incr::Incremental`], which
    /// knows what changed): one transaction with only those operations, over netlink when
    /// they are element changes. The whole table is written when nothing was written yet (or
    /// after a failure). On failure the next sync rewrites the whole table.
    pub fn sync_ops(
        &mut self,
        desired: &Ruleset,
        ops: &[nft::Op],
    ) -> Result<SyncStats, ApplyError> {
        let started = Instant::now();
        let Some(mut cur) = self.current.take() else {
            return self.sync(desired);
        };
        if ops.is_empty() {
            self.current = Some(cur);
            return Ok(SyncStats::default());
        }
        let netlink = self.try_netlink(desired, ops)?;
        let kernel = if netlink {
            self.last_kernel
        } else {
            let t = Instant::now();
            run(
                &self.prefix,
                &["nft", "-f", "-"],
                Some(&nft::render_ops(&self.table, ops)),
            )?;
            t.elapsed()
        };
        // The model follows the kernel; should it disagree, it becomes the desired state.
        if nft::apply_ops(&mut cur, ops).is_err() {
            tracing::debug!("nftables model out of step; taking the desired state");
            cur = desired.clone();
        }
        self.current = Some(cur);
        Ok(SyncStats {
            full: false,
            ops: ops.len(),
            took: started.elapsed(),
            netlink,
            kernel,
            ..SyncStats::default()
        })
    }

    /// The netlink socket, opened at the first use; `None` when netlink is unavailable.
    fn socket(&mut self) -> Option<&mut NlSocket> {
        if !self.use_netlink {
            return None;
        }
        if matches!(self.fast, Fast::Untried) {
            self.fast = match NlSocket::open(self.netns.as_deref()) {
                Ok(s) => Fast::Netlink(s),
                Err(e) => {
                    tracing::info!("nftables over netlink unavailable, using nft: {e}");
                    Fast::Unavailable
                }
            };
        }
        match &mut self.fast {
            Fast::Netlink(s) => Some(s),
            _ => None,
        }
    }

    /// Writes the whole table into a namespace where it does not exist yet, in two
    /// transactions: the structure through `nft -f` (a few dozen chains and empty maps,
    /// whatever the number of Services), then every element in one netlink batch. Parsing
    /// tens of thousands of elements is what makes `nft -f` slow; the kernel takes them
    /// encoded far faster. Until the second transaction the new table matches nothing it
    /// would not match anyway (its maps are empty and no Service was served here before).
    /// `Ok(None)`: not applicable (no netlink, or the table exists: replacing it must stay
    /// one atomic transaction), the caller writes the whole table through `nft -f`.
    fn write_fresh(&mut self, desired: &Ruleset) -> Result<Option<SyncStats>, ApplyError> {
        let table = self.table.clone();
        let Some(sock) = self.socket() else {
            return Ok(None);
        };
        match sock.table_exists(&table) {
            Ok(false) => {}
            Ok(true) => return Ok(None),
            Err(e) => {
                tracing::debug!("nftables table lookup over netlink: {e}");
                return Ok(None);
            }
        }
        let (elements, structure): (Vec<nft::Op>, Vec<nft::Op>) =
            nft::diff(&Ruleset::default(), desired)
                .into_iter()
                .partition(|o| matches!(o, nft::Op::AddElements(..)));
        let mut script =
            format!("add table inet {table}\ndelete table inet {table}\nadd table inet {table}\n");
        script.push_str(&nft::render_ops(&table, &structure));
        let t = Instant::now();
        run(&self.prefix, &["nft", "-f", "-"], Some(&script))?;
        let structure_t = t.elapsed();
        let t = Instant::now();
        if !elements.is_empty() {
            let kinds: BTreeMap<String, nft::SetKind> = desired
                .sets
                .iter()
                .filter_map(|(n, s)| s.kind.clone().map(|k| (n.clone(), k)))
                .collect();
            let Some(sock) = self.socket() else {
                return Ok(None);
            };
            if let Err(e) = sock.apply(&table, &kinds, &elements) {
                // The structure is in place: the caller's `nft -f` replaces it whole.
                tracing::info!("nftables elements over netlink failed, using nft: {e}");
                return Ok(None);
            }
        }
        let elements_t = t.elapsed();
        Ok(Some(SyncStats {
            full: true,
            ops: 1,
            took: Duration::ZERO,
            netlink: true,
            kernel: structure_t + elements_t,
            structure: structure_t,
            elements: elements_t,
        }))
    }

    /// Sends element-only operations over netlink; `Ok(false)` when that path is unavailable.
    /// `cur` gives the set kinds (any state holding the sets the operations touch).
    fn try_netlink(&mut self, cur: &Ruleset, ops: &[nft::Op]) -> Result<bool, ApplyError> {
        if !netlink::elements_only(ops) {
            return Ok(false);
        }
        let table = self.table.clone();
        let Some(sock) = self.socket() else {
            return Ok(false);
        };
        let kinds: BTreeMap<String, nft::SetKind> = cur
            .sets
            .iter()
            .filter_map(|(n, s)| s.kind.clone().map(|k| (n.clone(), k)))
            .collect();
        let (bytes, _) = netlink::encode_batch(&table, &kinds, ops, 0);
        if bytes.len() > netlink::MAX_BATCH {
            return Ok(false);
        }
        let t = Instant::now();
        sock.apply(&table, &kinds, ops)
            .map_err(|e| ApplyError::Failed {
                cmd: "netlink batch".into(),
                stderr: e.to_string(),
            })?;
        self.last_kernel = t.elapsed();
        Ok(true)
    }

    /// The state the kernel is believed to hold.
    pub fn current(&self) -> Option<&Ruleset> {
        self.current.as_ref()
    }

    /// The script the next sync would send.
    pub fn script(&self, desired: &Ruleset) -> String {
        match &self.current {
            None => nft::render_full(&self.table, desired),
            Some(cur) => nft::render_ops(&self.table, &nft::diff(cur, desired)),
        }
    }

    /// Brings the table to `desired` in one transaction. On failure the next sync rewrites
    /// the whole table.
    pub fn sync(&mut self, desired: &Ruleset) -> Result<SyncStats, ApplyError> {
        let started = Instant::now();
        let (script, full, ops) = match self.current.take() {
            None => {
                if let Some(mut st) = self.write_fresh(desired)? {
                    self.current = Some(desired.clone());
                    st.took = started.elapsed();
                    return Ok(st);
                }
                (nft::render_full(&self.table, desired), true, 1)
            }
            Some(cur) => {
                let ops = nft::diff(&cur, desired);
                if ops.is_empty() {
                    self.current = Some(cur);
                    return Ok(SyncStats::default());
                }
                if self.try_netlink(&cur, &ops)? {
                    self.current = Some(desired.clone());
                    return Ok(SyncStats {
                        full: false,
                        ops: ops.len(),
                        took: started.elapsed(),
                        netlink: true,
                        kernel: self.last_kernel,
                        ..SyncStats::default()
                    });
                }
                (nft::render_ops(&self.table, &ops), false, ops.len())
            }
        };
        let t = Instant::now();
        run(&self.prefix, &["nft", "-f", "-"], Some(&script))?;
        let kernel = t.elapsed();
        self.current = Some(desired.clone());
        Ok(SyncStats {
            full,
            ops,
            took: started.elapsed(),
            netlink: false,
            kernel,
            ..SyncStats::default()
        })
    }

    /// Forces a whole-table rewrite at the next sync.
    pub fn invalidate(&mut self) {
        self.current = None;
    }

    /// Deletes the table.
    pub fn cleanup(&mut self) -> Result<(), ApplyError> {
        self.current = None;
        run(
            &self.prefix,
            &["nft", "-f", "-"],
            Some(&nft::render_cleanup(&self.table)),
        )
        .map(|_| ())
    }
}

/// Keeps upstream's iptables chains in the desired state (both families).
pub struct IptApplier {
    pub prefix: Vec<String>,
    /// `iptables` or `iptables-legacy` (…-restore and ip6… are derived).
    pub command: String,
    chains: [BTreeSet<String>; 2],
    last: [Option<String>; 2],
    jumps: [bool; 2],
}

impl IptApplier {
    pub fn new(command: &str, prefix: Vec<String>) -> IptApplier {
        IptApplier {
            prefix,
            command: command.to_string(),
            chains: [BTreeSet::new(), BTreeSet::new()],
            last: [None, None],
            jumps: [false, false],
        }
    }

    fn cmd(&self, ipv6: bool, restore: bool) -> String {
        let base = if ipv6 {
            self.command.replacen("iptables", "ip6tables", 1)
        } else {
            self.command.clone()
        };
        if restore {
            format!("{base}-restore")
        } else {
            base
        }
    }

    /// The restore input of the next sync for one family.
    pub fn render(&self, ports: &[SvcPort], ipv6: bool, cfg: &IptConfig) -> iptables::IptRules {
        iptables::render(ports, ipv6, cfg, &self.chains[usize::from(ipv6)])
    }

    /// Writes both families (each family only when its text changed).
    pub fn sync(&mut self, ports: &[SvcPort], cfg: &IptConfig) -> Result<SyncStats, ApplyError> {
        let started = Instant::now();
        let mut stats = SyncStats::default();
        for ipv6 in [false, true] {
            let i = usize::from(ipv6);
            let r = self.render(ports, ipv6, cfg);
            if self.last[i].as_deref() == Some(r.text.as_str()) && self.jumps[i] {
                continue;
            }
            self.last[i] = None;
            run(
                &self.prefix,
                &[&self.cmd(ipv6, true), "-w", "--noflush"],
                Some(&r.text),
            )?;
            self.chains[i] = r.chains;
            self.last[i] = Some(r.text);
            stats.ops += 1;
            if !self.jumps[i] {
                self.ensure_jumps(ipv6)?;
                self.jumps[i] = true;
                stats.full = true;
            }
        }
        stats.took = started.elapsed();
        Ok(stats)
    }

    fn ensure_jumps(&self, ipv6: bool) -> Result<(), ApplyError> {
        let ipt = self.cmd(ipv6, false);
        for (table, chain, spec) in iptables::jump_rules() {
            let mut check = vec![ipt.as_str(), "-w", "-t", table, "-C", chain];
            check.extend(spec.iter().copied());
            if run(&self.prefix, &check, None).is_err() {
                let mut ins = vec![ipt.as_str(), "-w", "-t", table, "-I", chain];
                ins.extend(spec.iter().copied());
                run(&self.prefix, &ins, None)?;
            }
        }
        Ok(())
    }

    /// Removes the jumps and every chain of ours, in both families.
    pub fn cleanup(&mut self) -> Result<(), ApplyError> {
        for ipv6 in [false, true] {
            let ipt = self.cmd(ipv6, false);
            for (table, chain, spec) in iptables::jump_rules() {
                let mut del = vec![ipt.as_str(), "-w", "-t", table, "-D", chain];
                del.extend(spec.iter().copied());
                while run(&self.prefix, &del, None).is_ok() {}
            }
            // Chains of ours left by an earlier run are found by name.
            let mut chains = self.chains[usize::from(ipv6)].clone();
            if let Ok(saved) = run(&self.prefix, &[&format!("{ipt}-save"), "-t", "nat"], None) {
                for line in saved.lines() {
                    if let Some(c) = line.strip_prefix(':')
                        && let Some(name) = c.split_whitespace().next()
                        && ["KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-SEP-"]
                            .iter()
                            .any(|p| name.starts_with(p))
                    {
                        chains.insert(name.to_string());
                    }
                }
            }
            let text = iptables::render_cleanup(&chains);
            run(
                &self.prefix,
                &[&self.cmd(ipv6, true), "-w", "--noflush"],
                Some(&text),
            )?;
            self.chains[usize::from(ipv6)].clear();
            self.last[usize::from(ipv6)] = None;
            self.jumps[usize::from(ipv6)] = false;
        }
        Ok(())
    }
}

/// A UDP flow target that went away: conntrack entries DNATed to `endpoint` for `frontend`
/// (`None`: a NodePort, any local address) must be deleted, or the flow keeps going to it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct StaleUdp {
    pub frontend: Option<std::net::IpAddr>,
    pub port: u16,
    pub endpoint: SocketAddr,
}

/// The UDP (frontend, endpoint) pairs served by `old` and not by `new`. Pure.
pub fn stale_udp(old: &[SvcPort], new: &[SvcPort]) -> Vec<StaleUdp> {
    fn pairs(ports: &[SvcPort]) -> BTreeSet<StaleUdp> {
        let mut out = BTreeSet::new();
        for sp in ports.iter().filter(|s| s.name.proto == Proto::Udp) {
            if let Target::Pool(eps) = &sp.internal {
                for ip in &sp.cluster_ips {
                    for e in eps {
                        out.insert(StaleUdp {
                            frontend: Some(*ip),
                            port: sp.port,
                            endpoint: *e,
                        });
                    }
                }
            }
            if let Target::Pool(eps) = &sp.external {
                for e in eps {
                    for (ip, _) in &sp.externals {
                        out.insert(StaleUdp {
                            frontend: Some(*ip),
                            port: sp.port,
                            endpoint: *e,
                        });
                    }
                    if let Some(np) = sp.node_port {
                        out.insert(StaleUdp {
                            frontend: None,
                            port: np,
                            endpoint: *e,
                        });
                    }
                }
            }
        }
        out
    }
    let new = pairs(new);
    pairs(old)
        .into_iter()
        .filter(|p| !new.contains(p))
        .collect()
}

/// Deletes the conntrack entries of stale UDP flows (`conntrack -D` exits 1 when nothing
/// matched: not an error).
pub fn flush_stale_udp(prefix: &[String], stale: &[StaleUdp]) -> usize {
    let mut n = 0;
    for s in stale {
        let port = s.port.to_string();
        let ep = s.endpoint.ip().to_string();
        let family = if s.endpoint.is_ipv6() { "ipv6" } else { "ipv4" };
        let mut args: Vec<&str> = vec!["conntrack", "-D", "-f", family, "-p", "udp"];
        let fe;
        if let Some(ip) = s.frontend {
            fe = ip.to_string();
            args.extend(["--orig-dst", fe.as_str()]);
        }
        args.extend(["--orig-port-dst", port.as_str(), "--dst-nat", ep.as_str()]);
        if run(prefix, &args, None).is_ok() {
            n += 1;
        }
    }
    n
}
