//! Issue 14, finding 2, against the real `ferry up` binary: thousands of idle connections to one
//! Service's ClusterIP used to exhaust the process's file descriptors, so `/readyz`, kubectl and
//! DNS over TCP timed out while the proxy's accept loop spun and flooded the log. The test runs
//! `ferry up --max-open-files 1024` (the same exhaustion, cheaply) and holds more connections
//! than that limit could carry; everything else must keep answering, the proxy must neither spin
//! nor flood the log, and the slots must come back when the connections go.
//! Also: a taken DNS port stops `ferry up` at once, naming the address.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Ferry, eventually};

const FD_LIMIT: u64 = 1024;

/// A backend "pod" in the test process: accepts and holds every connection.
struct Backend {
    port: u16,
    accepted: Arc<AtomicUsize>,
    held: Arc<Mutex<Vec<TcpStream>>>,
}

fn backend() -> Backend {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let held = Arc::new(Mutex::new(Vec::new()));
    let (a, h) = (accepted.clone(), held.clone());
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            a.fetch_add(1, Ordering::SeqCst);
            h.lock().unwrap().push(s);
        }
    });
    Backend {
        port,
        accepted,
        held,
    }
}

/// The backend connections the proxy still holds open.
fn alive(b: &Backend) -> usize {
    let mut g = b.held.lock().unwrap();
    g.retain(|s| {
        s.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 1];
        match (&*s).read(&mut buf) {
            Ok(0) => false,
            Ok(_) => true,
            Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
        }
    });
    g.len()
}

fn ferry_pid(f: &Ferry) -> Option<u32> {
    let needle = f.dir.path().display().to_string();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        (cmd.contains(" up ") && cmd.contains(&needle) && !cmd.contains("unshare")).then_some(pid)
    })
}

/// CPU time (user + system) of a process, in clock ticks (1/100 s).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = stat.rsplit_once(')').unwrap().1;
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn api_url(f: &Ferry) -> String {
    std::fs::read_to_string(&f.kubeconfig)
        .unwrap()
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: ").map(String::from))
        .unwrap()
}

fn readyz(f: &Ferry) -> (bool, String) {
    let out = Command::new("curl")
        .args(["-sk", "--max-time", "20", "-w", "\n%{http_code}"])
        .arg(format!("{}/readyz?verbose", api_url(f)))
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout).into_owned();
    (s.trim_end().ends_with("200"), s)
}

fn dig_tcp(f: &Ferry) -> String {
    let dns = f.dns_addr().expect("dns address in the log");
    let (ip, port) = dns.rsplit_once(':').unwrap();
    let out = Command::new("dig")
        .args(["+tcp", "+short", "+time=10", "+tries=1", "-p", port])
        .arg(format!("@{ip}"))
        .arg("kubernetes.default.svc.cluster.local")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The log without terminal colours.
fn plain(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c == '\u{1b}' {
            for d in it.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn limit_lines(f: &Ferry) -> usize {
    f.log()
        .lines()
        .filter(|l| l.contains("connection limit reached"))
        .count()
}

#[test]
fn an_idle_connection_flood_through_a_service_leaves_everything_else_serving() {
    let f = Ferry::start_with(&["--max-open-files", &FD_LIMIT.to_string()]);
    let log = plain(&f.log());
    assert!(
        log.lines()
            .any(|l| l.contains("file descriptor limit") && l.contains("soft=1024")),
        "limit not applied:\n{log}"
    );
    let cap = ferry_limits::plan(FD_LIMIT, ferry_limits::Parts::ALL).proxy;
    // More connections than the whole process has descriptors for (each proxied one needs two).
    let flood = 2 * cap + 200;
    assert!(2 * flood as u64 > FD_LIMIT);

    let b = backend();
    let manifest = format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: flood\nspec:\n  ports:\n  - port: 80\n    targetPort: {p}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: flood-1\n  labels:\n    kubernetes.io/service-name: flood\naddressType: IPv4\nports:\n- port: {p}\n  protocol: TCP\nendpoints:\n- addresses: [\"127.0.0.1\"]\n  conditions:\n    ready: true\n",
        p = b.port
    );
    let out = f.k_stdin("kubectl", &["apply", "-f", "-"], &manifest);
    assert!(out.status.success(), "{out:?}");
    let vip = f.k(
        "kubectl",
        &["get", "svc", "flood", "-o", "jsonpath={.spec.clusterIP}"],
    );
    let vip = format!("{}:80", vip.trim());
    // Wait until the proxy serves it (a probe reaches the backend).
    assert!(
        eventually(60, || {
            let before = b.accepted.load(Ordering::SeqCst);
            TcpStream::connect(&vip).is_ok()
                && eventually(2, || b.accepted.load(Ordering::SeqCst) > before)
        }),
        "the Service never served:\n{}",
        f.log()
    );
    assert!(eventually(30, || alive(&b) == 0), "probes still open");
    let pid = ferry_pid(&f).expect("ferry's pid");

    // The flood: idle connections, held.
    let mut clients = Vec::new();
    for _ in 0..flood {
        if let Ok(s) = TcpStream::connect(&vip) {
            clients.push(s);
        }
    }
    assert!(
        eventually(60, || alive(&b) >= cap),
        "only {} proxied",
        alive(&b)
    );
    let cpu_before = cpu_ticks(pid);
    let lines_before = f.log().lines().count();

    // While held, everything else answers.
    let (ok, body) = readyz(&f);
    assert!(ok, "/readyz: {body}");
    assert!(body.contains("[+]ferry-proxy ok"), "{body}");
    assert!(body.contains("[+]ferry-dns ok"), "{body}");
    let out = f.k("kubectl", &["get", "services", "-A"]);
    assert!(out.contains("flood"), "{out}");
    let ns = f.k("kubectl", &["get", "namespaces"]);
    assert!(ns.contains("kube-system"));
    let a = dig_tcp(&f);
    assert!(a.parse::<std::net::IpAddr>().is_ok(), "DNS over TCP: {a:?}");
    // New connections beyond the cap are turned away without spinning: a few more attempts.
    for _ in 0..50 {
        if let Ok(s) = TcpStream::connect(&vip) {
            clients.push(s);
        }
    }
    std::thread::sleep(Duration::from_secs(3));

    // The cap held, the proxy did not spin and the log did not flood.
    assert!(alive(&b) <= cap, "{} proxied > cap {cap}", alive(&b));
    let cpu = cpu_ticks(pid) - cpu_before;
    let grown = f.log().lines().count() - lines_before;
    let limited = limit_lines(&f);
    eprintln!(
        "flood {flood}, cap {cap}, proxied {}, cpu {cpu} ticks while held, log +{grown} lines, {limited} cap lines",
        alive(&b)
    );
    assert!(limited >= 1, "reaching the cap is logged");
    assert!(limited <= 6, "cap logged {limited} times:\n{}", f.log());
    assert!(grown <= 100, "log grew by {grown} lines");
    // A spinning accept loop burns a core: hundreds of ticks over these seconds.
    assert!(
        cpu < 250,
        "{cpu} CPU ticks while idle connections were held"
    );

    // Letting go gives the slots back: the Service serves again.
    drop(clients);
    b.held.lock().unwrap().clear();
    assert!(
        eventually(60, || {
            let before = b.accepted.load(Ordering::SeqCst);
            TcpStream::connect(&vip).is_ok()
                && eventually(2, || b.accepted.load(Ordering::SeqCst) > before)
        }),
        "no slot came back"
    );
    let (ok, body) = readyz(&f);
    assert!(ok, "{body}");
}

#[test]
fn a_taken_dns_port_stops_ferry_up_naming_it() {
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let (svc, pods) = common::ranges_for(common::RESERVED_RANGE);
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["up", "--data-dir"])
        .arg(dir.path())
        .args(["--service-cluster-ip-range", &svc, "--cluster-cidr", &pods])
        .args(["--agent-port", "0", "--proxy-healthz-listen", "off"])
        .args(["--listen-api", "127.0.0.1:0", "--listen-dns", &addr])
        .args(["--dns-metrics-listen", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = child.wait().unwrap();
    assert!(!status.success(), "ferry up kept running:\n{err}");
    assert!(
        err.contains(&format!("cluster DNS cannot listen on {addr}")),
        "{err}"
    );
}
