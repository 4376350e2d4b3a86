//! A `ferry up` cluster on the netns pod network (as root): several nodes, each a network
//! namespace Ferry creates; everything is removed when the cluster is dropped (SIGTERM, then
//! whatever is left in namespaces named with this data directory's prefix).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn ferry_bin() -> &'static str {
    env!("CARGO_BIN_EXE_ferry")
}

/// Whether the netns pod network can run here (root, nsenter, the CNI reference plugins);
/// prints why not.
pub fn usable() -> bool {
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    let ok = root
        && Path::new("/usr/lib/cni/bridge").exists()
        && Command::new("nsenter").arg("--version").output().is_ok();
    if !ok {
        eprintln!("skipped: needs root, nsenter and /usr/lib/cni (containernetworking-plugins)");
    }
    ok
}

/// The namespace prefix of a data directory (as `ferry up` computes it: FNV-1a of the path).
pub fn prefix_of(dir: &Path) -> String {
    let canon = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let mut h: u32 = 0x811c_9dc5;
    for b in canon.as_os_str().as_encoded_bytes() {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("ferry-{h:08x}-")
}

pub struct NetnsCluster {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
}

impl NetnsCluster {
    /// `ferry up --pod-network netns` with `extra` flags; returns once the kubeconfig exists.
    pub fn start(extra: &[&str]) -> NetnsCluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = std::fs::File::create(dir.path().join("ferry.log")).expect("log");
        let mut child = Command::new(ferry_bin())
            .args(["up", "--data-dir"])
            .arg(dir.path())
            .args(["--pod-network", "netns", "--listen-api", "127.0.0.1:0"])
            .args(["--agent-port", "0", "--dns-metrics-listen", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("ferry up");
        let kc = dir.path().join("kubeconfig");
        let deadline = Instant::now() + Duration::from_secs(90);
        while !kc.exists() {
            if let Ok(Some(st)) = child.try_wait() {
                let log = std::fs::read_to_string(dir.path().join("ferry.log")).unwrap_or_default();
                panic!("ferry exited ({st}):\n{log}");
            }
            assert!(Instant::now() < deadline, "ferry not ready");
            std::thread::sleep(Duration::from_millis(50));
        }
        NetnsCluster {
            child: Some(child),
            dir,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("ferry.log")).unwrap_or_default()
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut child = Command::new("kubectl")
            .env("KUBECONFIG", self.kubeconfig())
            .env("HOME", self.dir.path())
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl");
        if let (Some(text), Some(mut si)) = (stdin, child.stdin.take()) {
            use std::io::Write;
            si.write_all(text.as_bytes()).expect("stdin");
        }
        child.wait_with_output().expect("kubectl")
    }

    /// kubectl that must succeed; its trimmed stdout.
    pub fn k(&self, args: &[&str]) -> String {
        let out = self.kubectl(args, None);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    pub fn apply(&self, yaml: &str) {
        let out = self.kubectl(&["apply", "-f", "-"], Some(yaml));
        assert!(
            out.status.success(),
            "apply: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Runs a command in the cluster network namespace (`ferry exec-net`): outside every node.
    pub fn exec_net(&self, cmd: &[&str]) -> Output {
        Command::new(ferry_bin())
            .args(["exec-net", "--data-dir"])
            .arg(self.dir.path())
            .arg("--")
            .args(cmd)
            .output()
            .expect("ferry exec-net")
    }

    /// Stops `ferry up` with SIGTERM (its exit removes the cluster network).
    pub fn stop(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        if let Some(pid) = i32::try_from(c.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(40);
        while !matches!(c.try_wait(), Ok(Some(_))) {
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for NetnsCluster {
    fn drop(&mut self) {
        self.stop();
        let prefix = prefix_of(self.dir.path());
        if let Ok(d) = std::fs::read_dir("/run/netns") {
            for e in d.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with(&prefix) {
                    let _ = Command::new("ip").args(["netns", "delete", &name]).status();
                }
            }
        }
    }
}
