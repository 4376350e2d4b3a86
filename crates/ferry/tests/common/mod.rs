//! Test harness: starts the real `ferry` binary and drives it with real clients.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub mod netns;

pub struct Ferry {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
    cache: tempfile::TempDir,
    /// The claim on this instance's address ranges (see [`next_ranges`]).
    _range_lock: Option<RangeClaim>,
}

fn ferry_bin() -> &'static str {
    env!("CARGO_BIN_EXE_ferry")
}

static INSTANCE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Address ranges of one `ferry up` instance: tests run several at once, and each one's proxy
/// binds its Service addresses and its pods bind their pod IPs, so the ranges must not overlap.
pub fn ranges_for(n: u32) -> (String, String) {
    (
        format!("127.{}.0.0/16", 10 + n),
        format!("127.{}.0.0/16", 150 + n),
    )
}

/// Range 59 is kept for tests that start `ferry up` themselves ([`RESERVED_RANGE`]): the
/// harness's instances take 0..59, so the two never share Service addresses (a shared kube-dns
/// address made one instance fail to bind its DNS port).
pub const RESERVED_RANGE: u32 = 59;

/// A claim on range pair `n`: `/tmp/ferry-e2e-range-<n>.claim`, created exclusively and
/// holding the claiming process's id; removed when the instance is dropped.
pub struct RangeClaim(PathBuf);

impl Drop for RangeClaim {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn claim(n: u32) -> Option<RangeClaim> {
    use std::io::Write;
    let path = PathBuf::from(format!("/tmp/ferry-e2e-range-{n}.claim"));
    for _ in 0..2 {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(mut f) => {
                let _ = write!(f, "{}", std::process::id());
                return Some(RangeClaim(path));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                // The claim of a process that is gone (killed before its drop ran) is stale; a
                // claim without a process id yet is being written, unless it is old.
                let holder = std::fs::read_to_string(&path)
                    .ok()
                    .and_then(|s| s.trim().parse::<u32>().ok());
                let stale = match holder {
                    Some(pid) => !Path::new(&format!("/proc/{pid}")).exists(),
                    None => std::fs::metadata(&path)
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .is_some_and(|age| age > Duration::from_secs(60)),
                };
                if !stale {
                    return None;
                }
                let _ = std::fs::remove_file(&path);
            }
            Err(_) => return None,
        }
    }
    None
}

/// The next free pair of ranges, claimed for the instance's life (see [`RangeClaim`]): test
/// processes running at once (two test binaries, several people's runs side by side) never
/// share a range, which made an instance fail to bind its DNS port.
fn next_ranges() -> ((String, String), Option<RangeClaim>) {
    let k = INSTANCE.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let start = (k + std::process::id()) % RESERVED_RANGE;
    for i in 0..RESERVED_RANGE {
        let n = (start + i) % RESERVED_RANGE;
        if let Some(c) = claim(n) {
            return (ranges_for(n), Some(c));
        }
    }
    // Every range claimed, or /tmp unwritable: the unclaimed choice.
    (ranges_for(start), None)
}

/// The kube-dns address of a Service range (its tenth address).
pub fn kube_dns_ip(service_range: &str) -> String {
    let base = service_range.split('/').next().unwrap_or("");
    let mut o: Vec<u32> = base.split('.').filter_map(|x| x.parse().ok()).collect();
    if o.len() == 4 {
        o[3] += 10;
    }
    o.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(".")
}

use ferry_node::is_root;

/// Cluster DNS on the kube-dns address, port 53, as root (as `ferry up` does by default);
/// otherwise on a free loopback port.
fn dns_listen(service_range: &str) -> String {
    if is_root() {
        format!("{}:53", kube_dns_ip(service_range))
    } else {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        format!("127.0.0.1:{}", s.local_addr().expect("addr").port())
    }
}

/// Starts `ferry up` on `dir`; a first start claims a range pair (the lock is returned, to be
/// held as long as the instance lives), a restart reuses the pair kept in `dir`.
fn spawn(dir: &Path) -> (Child, Option<RangeClaim>) {
    let log = std::fs::File::create(dir.join("ferry.log")).expect("log file");
    let ranges_file = dir.join("test-ranges");
    let mut lock = None;
    let (svc, pods) = match std::fs::read_to_string(&ranges_file) {
        Ok(s) => {
            let mut it = s.lines().map(String::from);
            (it.next().unwrap_or_default(), it.next().unwrap_or_default())
        }
        Err(_) => {
            let (r, l) = next_ranges();
            lock = l;
            std::fs::write(&ranges_file, format!("{}\n{}\n", r.0, r.1)).expect("ranges");
            r
        }
    };
    let child = Command::new(ferry_bin())
        .args(["up", "--data-dir"])
        .arg(dir)
        .args(["--service-cluster-ip-range", &svc, "--cluster-cidr", &pods])
        .args(["--agent-port", "0", "--proxy-healthz-listen", "off"])
        .args([
            "--listen-api",
            "127.0.0.1:0",
            "--listen-dns",
            &dns_listen(&svc),
        ])
        .args(["--dns-metrics-listen", "127.0.0.1:0"])
        .args(extra_args(dir))
        .args(["--ingress-http-addr", "127.0.0.1:0"])
        .args(["--ingress-https-addr", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start ferry");
    (child, lock)
}

/// Flags a test gave [`Ferry::start_with`] (kept in the data directory for restarts).
fn extra_args(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("test-extra-args"))
        .map(|s| s.lines().map(String::from).collect())
        .unwrap_or_default()
}

fn wait_ready(dir: &Path, child: &mut Child) {
    let kc = dir.join("kubeconfig");
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(dir.join("ferry.log")).unwrap_or_default();
            panic!("ferry exited early ({status}):\n{log}");
        }
        if kc.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("ferry did not become ready");
}

impl Ferry {
    /// Starts with extra `ferry up` flags.
    pub fn start_with(extra: &[&str]) -> Ferry {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("test-extra-args"), extra.join("\n")).expect("args");
        let (mut child, lock) = spawn(dir.path());
        wait_ready(dir.path(), &mut child);
        let kubeconfig = dir.path().join("kubeconfig");
        Ferry {
            child: Some(child),
            dir,
            kubeconfig,
            cache: tempfile::tempdir().expect("tempdir"),
            _range_lock: lock,
        }
    }

    pub fn start() -> Ferry {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut child, lock) = spawn(dir.path());
        wait_ready(dir.path(), &mut child);
        let kubeconfig = dir.path().join("kubeconfig");
        Ferry {
            child: Some(child),
            dir,
            kubeconfig,
            cache: tempfile::tempdir().expect("tempdir"),
            _range_lock: lock,
        }
    }

    /// Kills the process with SIGKILL (no shutdown path runs), and the pod processes its agent
    /// started (found by their command lines, which name this instance's data directory).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        kill_pods(self.dir.path());
    }

    /// Stops with SIGTERM and waits.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        let pid = c.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let status = c.wait().expect("wait");
        kill_pods(self.dir.path());
        status
    }

    /// The process id of the running `ferry`.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The Service range and the pod range of this instance.
    pub fn ranges(&self) -> (String, String) {
        let s = std::fs::read_to_string(self.dir.path().join("test-ranges")).unwrap_or_default();
        let mut it = s.lines().map(String::from);
        (it.next().unwrap_or_default(), it.next().unwrap_or_default())
    }

    /// Where this instance's cluster DNS listens (`ip:port`), from its log.
    pub fn dns_addr(&self) -> Option<String> {
        let log = self.log();
        let line = log.lines().find(|l| l.contains("cluster DNS on "))?;
        let rest = line.split("cluster DNS on ").nth(1)?;
        Some(rest.split_whitespace().next()?.to_string())
    }

    /// Where this instance's Ingress proxy serves HTTP and HTTPS (`ip:port`), from its log.
    pub fn ingress_addrs(&self) -> Option<(String, String)> {
        let log = self.log();
        let line = log.lines().find(|l| l.contains("ingress listening on "))?;
        let rest = line.split("ingress listening on ").nth(1)?;
        let mut words = rest.split_whitespace();
        let http = words.next()?.strip_prefix("http://")?.to_string();
        let https = words.nth(1)?.strip_prefix("https://")?.to_string();
        Some((http, https))
    }

    /// Starts again on the same data directory.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "still running");
        let _ = std::fs::remove_file(self.dir.path().join("kubeconfig"));
        // The ranges are kept in the data directory: no new claim.
        let (mut child, _) = spawn(self.dir.path());
        wait_ready(self.dir.path(), &mut child);
        self.child = Some(child);
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("ferry.log")).unwrap_or_default()
    }

    pub fn kubectl_with(&self, bin: &str, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = Command::new(bin);
        cmd.env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", self.cache.path())
            .arg("--cache-dir")
            .arg(self.cache.path().join(bin.replace('/', "_")))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if stdin.is_some() {
            cmd.stdin(Stdio::piped());
        } else {
            cmd.stdin(Stdio::null());
        }
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("running {bin}: {e}"));
        if let Some(input) = stdin {
            use std::io::Write;
            let mut si = child.stdin.take().expect("stdin");
            si.write_all(input.as_bytes()).expect("write stdin");
        }
        child.wait_with_output().expect("kubectl output")
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_with("kubectl", args, None)
    }

    /// Runs kubectl and asserts success; returns stdout.
    pub fn k(&self, bin: &str, args: &[&str]) -> String {
        let out = self.kubectl_with(bin, args, None);
        assert!(
            out.status.success(),
            "{bin} {args:?} failed:\nstdout: {}\nstderr: {}\nferry log tail: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            tail(&self.log())
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Applies/creates manifests from stdin.
    pub fn k_stdin(&self, bin: &str, args: &[&str], input: &str) -> Output {
        self.kubectl_with(bin, args, Some(input))
    }

    /// Runs a Python script (with the kubeconfig in `KUBECONFIG`); asserts success; returns stdout.
    pub fn python(&self, script: &str, args: &[&str]) -> String {
        let out = Command::new("python3")
            .arg("-c")
            .arg(script)
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .output()
            .expect("python3");
        assert!(
            out.status.success(),
            "python failed:\nstdout: {}\nstderr: {}\nferry log tail: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            tail(&self.log())
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// SIGKILLs the pod wrappers (`unshare ... <data dir>/agent/pods/...`) of one instance; their
/// `--kill-child` takes the pod process with them.
fn kill_pods(dir: &Path) {
    let needle = dir.join("agent").display().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(&needle) && pid != std::process::id() {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

impl Drop for Ferry {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The kubectl binaries to test with: the machine's, and Debian's 1.20 when the test script
/// provided it.
pub fn kubectls() -> Vec<String> {
    let mut v = vec!["kubectl".to_string()];
    if let Ok(k) = std::env::var("FERRY_KUBECTL_120")
        && Path::new(&k).exists()
    {
        v.push(k);
    }
    v
}

pub fn is_120(bin: &str) -> bool {
    bin != "kubectl"
}

pub fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

/// Polls `f` until it returns true or `secs` pass.
pub fn eventually(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}
