//! Kernel proxy benchmark (run by `bench/kproxy/run.sh`; a benchmark, not a test), in one run
//! inside a throwaway network namespace it creates and deletes:
//!
//! - full sync of N Services × 3 endpoints into an empty namespace: Ferry's maps-only table
//!   (`nft -f`), a generator of kube-proxy's own nftables layout (a chain and an anonymous
//!   verdict map per Service, a chain per endpoint), and upstream's iptables chains through
//!   `iptables-restore` (nft and legacy back ends);
//! - one Service's endpoints changing, applied in the kernel (p50 / p99 over the samples):
//!   Ferry over netlink, Ferry through `nft -f`, kube-proxy's layout through `nft -f`, and a
//!   full `iptables-restore` (what the iptables proxier does on a change);
//! - first-packet (TCP connect) latency to the 1st and the Nth Service with Ferry's table.
//!
//! Usage: `kproxy_bench [SERVICES] [SAMPLES] [ferry-only|no-iptables-nft]` (defaults 10000,
//! 30), as root.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ferry_proxy::kernel::apply::{self, NftApplier};
use ferry_proxy::kernel::incr::Incremental;
use ferry_proxy::kernel::input::{SvcPort, Target};
use ferry_proxy::kernel::iptables::{self, IptConfig};
use ferry_proxy::kernel::nft::{self, NftConfig};
use ferry_proxy::kernel::{KernelArgs, Syncer, input};
use ferry_proxy::model::{
    EndpointInfo, PortInfo, Proto, ServiceInfo, ServicePortName, SliceInfo, SlicePort,
};
use ferry_proxy::sync::{Kind, Tracker};
use ferry_proxy::{ProxyArgs, ProxyMode};

fn vip(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(198, 19, (i / 250) as u8, (i % 250 + 1) as u8))
}

fn ep(i: usize, j: usize) -> SocketAddr {
    let n = i * 3 + j;
    SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(198, 18, (n / 250) as u8, (n % 250 + 1) as u8)),
        8080,
    )
}

/// The listener every latency probe lands on.
const LISTENER: &str = "198.18.255.1";

fn services(n: usize) -> Vec<SvcPort> {
    (0..n)
        .map(|i| {
            let eps: Vec<SocketAddr> = if i == 0 || i == n - 1 {
                vec![format!("{LISTENER}:8080").parse().unwrap(); 1]
            } else {
                (0..3).map(|j| ep(i, j)).collect()
            };
            SvcPort {
                name: ServicePortName {
                    namespace: "bench".into(),
                    name: format!("svc-{i}"),
                    port: "http".into(),
                    proto: Proto::Tcp,
                },
                ipv6: false,
                port: 80,
                node_port: None,
                cluster_ips: vec![vip(i)],
                externals: vec![],
                internal: Target::Pool(eps),
                external: Target::Reject,
                affinity: None,
                internal_local: false,
                external_local: false,
                health_check_node_port: None,
            }
        })
        .collect()
}

/// Service `i` and its EndpointSlice, as the watches record them, for kernel input `sp`.
fn objects(i: usize, sp: &SvcPort) -> (ServiceInfo, SliceInfo) {
    let svc = ServiceInfo {
        namespace: "bench".into(),
        name: format!("svc-{i}"),
        cluster_ips: sp.cluster_ips.clone(),
        ports: vec![PortInfo {
            name: "http".into(),
            proto: Proto::Tcp,
            port: 80,
            node_port: None,
        }],
        ..ServiceInfo::default()
    };
    let slice = SliceInfo {
        namespace: "bench".into(),
        name: format!("svc-{i}-abcde"),
        service: format!("svc-{i}"),
        ports: vec![SlicePort {
            name: "http".into(),
            proto: Proto::Tcp,
            port: 8080,
        }],
        endpoints: eps_of(sp)
            .iter()
            .map(|e| EndpointInfo {
                ip: e.ip(),
                ready: true,
                serving: true,
                terminating: false,
                node_name: Some("elsewhere".into()),
                zone: None,
                hint_zones: None,
                topology: Default::default(),
            })
            .collect(),
    };
    (svc, slice)
}

/// kube-proxy's nftables layout (pkg/proxy/nftables): per Service a chain with an anonymous
/// `numgen` verdict map, per endpoint a chain, one `service-ips` verdict map.
fn kube_layout_full(ports: &[SvcPort], table: &str) -> String {
    let mut s = format!(
        "add table ip {table}\ndelete table ip {table}\ntable ip {table} {{\n\
         map service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict; }}\n\
         chain mark-for-masquerade {{ meta mark set meta mark | 0x4000; }}\n\
         chain services {{ ip daddr . meta l4proto . th dport vmap @service-ips; }}\n\
         chain nat-output {{ type nat hook output priority -100; policy accept; jump services; }}\n\
         chain nat-prerouting {{ type nat hook prerouting priority -100; policy accept; jump services; }}\n"
    );
    for (i, sp) in ports.iter().enumerate() {
        s.push_str(&kube_service_chains(i, sp));
    }
    s.push_str("}\n");
    for (i, sp) in ports.iter().enumerate() {
        let _ = writeln!(
            s,
            "add element ip {table} service-ips {{ {} . tcp . 80 : goto service-{i}-bench/svc-{i}/tcp/http }}",
            sp.cluster_ips[0]
        );
    }
    s
}

fn eps_of(sp: &SvcPort) -> Vec<SocketAddr> {
    match &sp.internal {
        Target::Pool(e) => e.clone(),
        _ => vec![],
    }
}

fn kube_endpoint_chain(i: usize, e: &SocketAddr) -> String {
    format!(
        "chain endpoint-{i}-{ip}-{port} {{ ip saddr {ip} jump mark-for-masquerade; meta l4proto tcp dnat to {e}; }}\n",
        ip = e.ip(),
        port = e.port()
    )
}

fn kube_service_chains(i: usize, sp: &SvcPort) -> String {
    let eps = eps_of(sp);
    let mut s = String::new();
    let mut seen = std::collections::BTreeSet::new();
    for e in &eps {
        if seen.insert(*e) {
            s.push_str(&kube_endpoint_chain(i, e));
        }
    }
    let arms: Vec<String> = eps
        .iter()
        .enumerate()
        .map(|(j, e)| format!("{j} : goto endpoint-{i}-{}-{}", e.ip(), e.port()))
        .collect();
    let _ = writeln!(
        s,
        "chain service-{i}-bench/svc-{i}/tcp/http {{ ip daddr {} tcp dport 80 ip saddr != 198.18.0.0/15 jump mark-for-masquerade; numgen random mod {} vmap {{ {} }}; }}",
        sp.cluster_ips[0],
        eps.len(),
        arms.join(", ")
    );
    s
}

/// One endpoint replaced, in kube-proxy's layout: new endpoint chain, the Service chain
/// rewritten, the old endpoint chain deleted — one transaction.
fn kube_layout_change(table: &str, i: usize, old: &SvcPort, new: &SvcPort) -> String {
    let mut s = String::new();
    let olde = eps_of(old);
    let newe = eps_of(new);
    for e in newe.iter().filter(|e| !olde.contains(e)) {
        let body = kube_endpoint_chain(i, e);
        let _ = writeln!(
            s,
            "add {}",
            body.trim_end()
                .replacen("chain ", &format!("chain ip {table} "), 1)
        );
    }
    let chain = format!("service-{i}-bench/svc-{i}/tcp/http");
    let _ = writeln!(s, "flush chain ip {table} {chain}");
    let arms: Vec<String> = newe
        .iter()
        .enumerate()
        .map(|(j, e)| format!("{j} : goto endpoint-{i}-{}-{}", e.ip(), e.port()))
        .collect();
    let _ = writeln!(
        s,
        "add rule ip {table} {chain} ip daddr {} tcp dport 80 ip saddr != 198.18.0.0/15 jump mark-for-masquerade",
        new.cluster_ips[0]
    );
    let _ = writeln!(
        s,
        "add rule ip {table} {chain} numgen random mod {} vmap {{ {} }}",
        newe.len(),
        arms.join(", ")
    );
    for e in olde.iter().filter(|e| !newe.contains(e)) {
        let _ = writeln!(
            s,
            "delete chain ip {table} endpoint-{i}-{}-{}",
            e.ip(),
            e.port()
        );
    }
    s
}

fn run(prefix: &[String], args: &[&str], input: Option<&str>) -> Duration {
    let t = Instant::now();
    apply::run(prefix, args, input).unwrap_or_else(|e| panic!("{e}"));
    t.elapsed()
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    let idx = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[idx.min(v.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

const PROBE: &str = r#"
import socket, sys, time, statistics
host, n = sys.argv[1], int(sys.argv[2])
ts = []
for _ in range(n):
    s = socket.socket(); s.settimeout(5)
    t = time.perf_counter(); s.connect((host, 80)); ts.append(time.perf_counter() - t); s.close()
print(statistics.median(ts) * 1e6)
"#;

const SERVER: &str = r#"
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("198.18.255.1", 8080)); s.listen(1024)
print("ready", flush=True)
while True:
    c, _ = s.accept(); c.close()
"#;

struct Ns(String, Vec<std::process::Child>);
impl Drop for Ns {
    fn drop(&mut self) {
        for c in &mut self.1 {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).map_or(10_000, |s| s.parse().unwrap());
    let samples: usize = args.get(2).map_or(30, |s| s.parse().unwrap());
    let mut ns = Ns(format!("ferry-kp-bench-{}", std::process::id()), Vec::new());
    let prefix = apply::netns_prefix(Some(&ns.0));
    assert!(
        Command::new("ip")
            .args(["netns", "add", &ns.0])
            .status()
            .unwrap()
            .success()
    );
    let sh = |a: &[&str]| run(&prefix, a, None);
    sh(&["ip", "link", "set", "lo", "up"]);
    sh(&["ip", "addr", "add", &format!("{LISTENER}/32"), "dev", "lo"]);
    sh(&[
        "ip", "link", "add", "kb0", "type", "veth", "peer", "name", "kb1",
    ]);
    sh(&["ip", "link", "set", "kb0", "up"]);
    sh(&["ip", "link", "set", "kb1", "up"]);
    sh(&["ip", "addr", "add", "198.18.254.1/24", "dev", "kb0"]);
    sh(&["ip", "route", "add", "198.19.0.0/16", "dev", "kb0"]);
    let mut server = Command::new("ip")
        .args(["netns", "exec", &ns.0, "python3", "-c", SERVER])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::BufRead;
        let mut l = String::new();
        std::io::BufReader::new(server.stdout.take().unwrap())
            .read_line(&mut l)
            .unwrap();
    }
    ns.1.push(server);

    println!(
        "kernel proxy benchmark: {n} Services x 3 endpoints, {samples} change samples, netns {}",
        ns.0
    );
    let ports = services(n);
    let cfg = NftConfig {
        pod_cidrs: vec!["198.18.0.0/15".parse().unwrap()],
        ..Default::default()
    };

    // Ferry: full sync into an empty namespace, two ways. (1) From the kernel input: the
    // incremental renderer's first update, then the applier (structure through nft -f,
    // elements in one netlink batch). (2) The live proxy's whole first sync from the
    // tracker's Services and EndpointSlices (input built per Service, rendered, written).
    let t = Instant::now();
    let whole_render = nft::render(&ports, &cfg);
    let whole_render_t = t.elapsed();
    drop(whole_render);
    let t = Instant::now();
    let mut inc = Incremental::new(&cfg);
    let u = inc.update(&ports);
    assert!(u.full);
    let render_t = t.elapsed();
    let table = "ferry-bench";
    let mut a = NftApplier::new(table, Some(&ns.0));
    let st = a.sync(inc.state()).unwrap();
    let ferry_input_full = render_t + st.took;
    println!(
        "ferry nftables   full sync from the kernel input: {:>7.1} ms (renderer primed {:.1} ms [a single whole render: {:.1} ms], kernel {:.1} ms = nft -f structure {:.1} ms + netlink elements {:.1} ms)",
        ms(ferry_input_full),
        ms(render_t),
        ms(whole_render_t),
        ms(st.kernel),
        ms(st.structure),
        ms(st.elements)
    );
    a.cleanup().unwrap();

    let tracker = Tracker::default();
    for (i, sp) in ports.iter().enumerate() {
        let (svc, slice) = objects(i, sp);
        tracker.update(|st| st.put_service((svc.namespace.clone(), svc.name.clone()), Some(svc)));
        tracker
            .update(|st| st.put_slice((slice.namespace.clone(), slice.name.clone()), Some(slice)));
    }
    tracker.mark_synced(Kind::Service);
    tracker.mark_synced(Kind::EndpointSlice);
    let pargs = ProxyArgs {
        proxy_mode: ProxyMode::Nftables,
        kernel: KernelArgs {
            nft_table: table.into(),
            apply_in_netns: Some(ns.0.clone()),
            cluster_cidr: cfg.pod_cidrs.clone(),
            ..KernelArgs::default()
        },
        ..ProxyArgs::default()
    };
    // Several runs (each into an empty namespace): the load of a shared machine stretches
    // single figures; the minimum is the least disturbed, the median the typical.
    let reps = 5;
    let mut fulls: Vec<(Duration, apply::SyncStats)> = Vec::new();
    let mut syncer = None;
    for r in 0..reps {
        let mut s = Syncer::new(&pargs, "bench-node").unwrap();
        let t = Instant::now();
        let rep = s.step(&tracker);
        let took = t.elapsed();
        let st = rep.result.unwrap().unwrap();
        assert!(rep.full && rep.changed == n && st.structure > Duration::ZERO);
        fulls.push((took, st));
        if r + 1 < reps {
            s.cleanup().unwrap();
        } else {
            syncer = Some(s);
        }
    }
    let mut syncer = syncer.unwrap();
    fulls.sort_by_key(|f| f.0);
    let (ferry_full, fmin) = fulls[0].clone();
    let (fmed, fmed_st) = fulls[reps / 2].clone();
    println!(
        "ferry nftables   full sync (live proxy step: tracker -> input -> render -> kernel), {reps} runs: min {:.1} ms (kernel {:.1} ms = nft -f structure {:.1} ms + netlink elements {:.1} ms), median {:.1} ms (kernel {:.1} ms), max {:.1} ms",
        ms(ferry_full),
        ms(fmin.kernel),
        ms(fmin.structure),
        ms(fmin.elements),
        ms(fmed),
        ms(fmed_st.kernel),
        ms(fulls[reps - 1].0)
    );

    // Ferry: first-packet latency, 1st vs Nth Service.
    let probe = |ip: IpAddr| -> f64 {
        let out = apply::run(
            &prefix,
            &["python3", "-c", PROBE, &ip.to_string(), "300"],
            None,
        )
        .unwrap();
        out.trim().parse().unwrap()
    };
    // Alternating rounds (1st, Nth, 1st, ...): load changes hit both alike; the minimum
    // of the rounds' medians is the least disturbed.
    let (mut r1, mut rn) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        r1.push(probe(vip(0)));
        rn.push(probe(vip(n - 1)));
    }
    let l1 = r1.iter().copied().fold(f64::INFINITY, f64::min);
    let ln = rn.iter().copied().fold(f64::INFINITY, f64::min);
    println!(
        "ferry nftables   first-packet connect (min of 5 alternating rounds of a 300-connect median): 1st {l1:.1} us, {n}th {ln:.1} us, ratio {:.2}",
        ln / l1
    );

    // Ferry: one Service's endpoints change (an EndpointSlice update recorded by the tracker),
    // then one live sync step: what changed is taken from the tracker, that Service's input
    // is built and rendered, the difference goes to the kernel (netlink), then the same
    // through nft -f. For comparison, what the first design did per change: build the whole
    // input, render every Service and diff the whole table (CPU only, no kernel).
    let mut cur = ports.clone();
    let mut before: Vec<Duration> = Vec::new();
    let mut prev_whole = nft::render(&cur, &cfg);
    let mut change = |syncer: &mut Syncer, round: usize| -> (Duration, Duration) {
        let i = 1 + (round * 7919) % (n - 2);
        let mut eps = eps_of(&cur[i]);
        eps[round % 3] = SocketAddr::new(
            IpAddr::V4(Ipv4Addr::new(198, 18, 253, (round % 250 + 1) as u8)),
            8080,
        );
        cur[i].internal = Target::Pool(eps);
        let (_, slice) = objects(i, &cur[i]);
        tracker
            .update(|st| st.put_slice((slice.namespace.clone(), slice.name.clone()), Some(slice)));
        let t = Instant::now();
        let rep = syncer.step(&tracker);
        let whole = t.elapsed();
        let st = rep.result.unwrap().unwrap();
        assert!(
            !rep.full && rep.changed == 1 && st.ops > 0,
            "one Service changed"
        );
        let t = Instant::now();
        let (all, _) = tracker.take(|st| {
            input::build(
                &st.services,
                &st.slices,
                &st.nodes,
                "bench-node",
                &Default::default(),
            )
        });
        let desired = nft::render(&all, &cfg);
        let ops = nft::diff(&prev_whole, &desired);
        before.push(t.elapsed());
        assert!(!ops.is_empty());
        prev_whole = desired;
        (st.kernel, whole)
    };
    let (mut nl, mut nl_all): (Vec<Duration>, Vec<Duration>) =
        (0..samples).map(|r| change(&mut syncer, r)).unzip();
    syncer.set_use_netlink(false);
    let (mut cli, mut cli_all): (Vec<Duration>, Vec<Duration>) = (samples..2 * samples)
        .map(|r| change(&mut syncer, r))
        .unzip();
    assert_eq!(
        syncer.nft_state(),
        Some(&prev_whole),
        "the kernel model is the whole render"
    );
    let (nl50, nl99) = (pct(&mut nl, 0.5), pct(&mut nl, 0.99));
    let (cli50, cli99) = (pct(&mut cli, 0.5), pct(&mut cli, 0.99));
    let (all50, all99) = (pct(&mut nl_all, 0.5), pct(&mut nl_all, 0.99));
    println!(
        "ferry nftables   one Service change, kernel apply (netlink batch): p50 {:.3} ms, p99 {:.3} ms, min {:.3} ms; whole sync (live step: tracker changes + input of one Service + render + diff + kernel): p50 {:.2} ms, p99 {:.2} ms, min {:.2} ms",
        ms(nl50),
        ms(nl99),
        ms(nl[0]),
        ms(all50),
        ms(all99),
        ms(nl_all[0])
    );
    let (b50, b99) = (pct(&mut before, 0.5), pct(&mut before, 0.99));
    println!(
        "ferry nftables   one Service change, first design (whole input + render all + diff all, no kernel): p50 {:.1} ms, p99 {:.1} ms, min {:.1} ms; the live step is {:.1}x faster at p99, {:.1}x at the min",
        ms(b50),
        ms(b99),
        ms(before[0]),
        b99.as_secs_f64() / all99.as_secs_f64(),
        before[0].as_secs_f64() / nl_all[0].as_secs_f64()
    );
    println!(
        "ferry nftables   one Service change, kernel apply (nft -f process): p50 {:.2} ms, p99 {:.2} ms; whole sync: p50 {:.1} ms, p99 {:.1} ms",
        ms(cli50),
        ms(cli99),
        ms(pct(&mut cli_all, 0.5)),
        ms(pct(&mut cli_all, 0.99))
    );
    println!(
        "goals: full sync <= 300 ms (min of {reps} runs): {}; one change <= 5 ms p99: kernel apply {}, whole sync {}; first packet ratio <= 1.1: {}",
        if ferry_full <= Duration::from_millis(300) {
            "met"
        } else {
            "NOT met"
        },
        if nl99 <= Duration::from_millis(5) {
            "met"
        } else {
            "NOT met"
        },
        if all99 <= Duration::from_millis(5) {
            "met"
        } else {
            "NOT met"
        },
        if ln / l1 <= 1.1 { "met" } else { "NOT met" }
    );

    syncer.cleanup().unwrap();
    if args.get(3).map(String::as_str) == Some("ferry-only") {
        return;
    }

    // kube-proxy's nftables layout.
    let kt = "kube-proxy-bench";
    let text = kube_layout_full(&ports, kt);
    let kube_full = run(&prefix, &["nft", "-f", "-"], Some(&text));
    println!("kube-proxy nft layout full sync: {:>9.1} ms", ms(kube_full));
    let mut kc: Vec<Duration> = Vec::new();
    let mut kcur = ports.clone();
    for r in 0..samples.min(10) {
        let i = 1 + (r * 7919) % (n - 2);
        let old = kcur[i].clone();
        let mut eps = eps_of(&old);
        eps[r % 3] = SocketAddr::new(
            IpAddr::V4(Ipv4Addr::new(198, 18, 252, (r % 250 + 1) as u8)),
            9000 + r as u16,
        );
        kcur[i].internal = Target::Pool(eps);
        let script = kube_layout_change(kt, i, &old, &kcur[i]);
        kc.push(run(&prefix, &["nft", "-f", "-"], Some(&script)));
    }
    let (k50, k99) = (pct(&mut kc, 0.5), pct(&mut kc, 0.99));
    println!(
        "kube-proxy nft layout one Service change (nft -f): p50 {:.2} ms, p99 {:.2} ms",
        ms(k50),
        ms(k99)
    );
    run(&prefix, &["nft", "delete", "table", "ip", kt], None);

    // iptables-restore, both back ends.
    let icfg = IptConfig {
        pod_cidrs: cfg.pod_cidrs.clone(),
        masquerade_all: false,
    };
    let none = Default::default();
    let ipt_text = iptables::render(&ports, false, &icfg, &none).text;
    let mut ipt_results = Vec::new();
    // `no-iptables-nft`: iptables-nft's full restore of 10k Services takes minutes per sample.
    let skip_nft_backend = args.get(3).map(String::as_str) == Some("no-iptables-nft");
    for cmd in ["iptables-legacy", "iptables"] {
        if skip_nft_backend && cmd == "iptables" {
            println!("iptables-restore (nft back end): skipped (no-iptables-nft)");
            continue;
        }
        let restore = format!("{cmd}-restore");
        if apply::run(&[], &["sh", "-c", &format!("command -v {restore}")], None).is_err() {
            continue;
        }
        let full = run(&prefix, &[&restore, "-w", "--noflush"], Some(&ipt_text));
        let mut ch: Vec<Duration> = Vec::new();
        let mut icur = ports.clone();
        for r in 0..samples.min(5) {
            let i = 1 + (r * 7919) % (n - 2);
            let mut eps = eps_of(&icur[i]);
            eps[r % 3] = SocketAddr::new(
                IpAddr::V4(Ipv4Addr::new(198, 18, 251, (r % 250 + 1) as u8)),
                9100 + r as u16,
            );
            icur[i].internal = Target::Pool(eps);
            let t = Instant::now();
            let text = iptables::render(&icur, false, &icfg, &none).text;
            apply::run(&prefix, &[&restore, "-w", "--noflush"], Some(&text)).unwrap();
            ch.push(t.elapsed());
        }
        let (c50, c99) = (pct(&mut ch, 0.5), pct(&mut ch, 0.99));
        println!(
            "{restore:<16} full sync: {:>9.1} ms; one Service change (full restore): p50 {:.1} ms, p99 {:.1} ms",
            ms(full),
            ms(c50),
            ms(c99)
        );
        ipt_results.push((restore, full, c99));
        let mut ipt = apply::IptApplier::new(cmd, prefix.clone());
        ipt.cleanup().unwrap();
    }

    println!("--- ratios (the other / Ferry; > 1 means Ferry is faster) ---");
    println!(
        "full sync:   kube-proxy nft layout / ferry = {:.1}x",
        kube_full.as_secs_f64() / ferry_full.as_secs_f64()
    );
    for (name, full, _) in &ipt_results {
        println!(
            "full sync:   {name} / ferry = {:.1}x",
            full.as_secs_f64() / ferry_full.as_secs_f64()
        );
    }
    println!(
        "change p99:  ferry nft -f / ferry netlink = {:.1}x",
        cli99.as_secs_f64() / nl99.as_secs_f64()
    );
    println!(
        "change p99:  kube-proxy nft layout / ferry netlink = {:.1}x",
        k99.as_secs_f64() / nl99.as_secs_f64()
    );
    for (name, _, c99) in &ipt_results {
        println!(
            "change p99:  {name} / ferry netlink = {:.1}x",
            c99.as_secs_f64() / nl99.as_secs_f64()
        );
    }
    println!(
        "first packet: {n}th / 1st Service = {:.2} (goal <= 1.1)",
        ln / l1
    );
}
