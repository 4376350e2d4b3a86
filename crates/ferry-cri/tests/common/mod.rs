//! Shared helpers of the root-only containerd tests: skip checks, a test network namespace,
//! images, a CNI conflist, and the final "nothing left" checks.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ferry_cri::containerd::{self, Layout};
use ferry_cri::images;

/// Why this machine cannot run the containerd tests, if it cannot.
pub fn skip_reason() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("not root".into());
    }
    for tool in [
        "containerd",
        "ctr",
        "runc",
        "containerd-shim-runc-v2",
        "nsenter",
        "ip",
    ] {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
            .unwrap_or(false);
        if !found {
            return Some(format!(
                "{tool} not found (scripts/test-deps.sh installs it)"
            ));
        }
    }
    if !Path::new("/usr/lib/cni/bridge").exists() {
        return Some("CNI plugins missing (/usr/lib/cni/bridge)".into());
    }
    if let Err(e) = images::read_busybox() {
        return Some(e.to_string());
    }
    None
}

pub fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd} {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A network namespace the test owns; deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(tag: &str) -> Netns {
        let name = format!("ferry-cri-test-{}-{tag}", std::process::id());
        run("ip", &["netns", "add", &name]);
        run("ip", &["-n", &name, "link", "set", "lo", "up"]);
        Netns { name }
    }
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.name))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// A cgroup parent for the test's pods, removed (in every v1 hierarchy or in v2) on drop.
pub struct CgroupParent {
    pub name: String,
}

impl CgroupParent {
    pub fn new(tag: &str) -> CgroupParent {
        CgroupParent {
            name: format!("/ferry-cri-test-{}-{tag}", std::process::id()),
        }
    }
    fn dirs(&self) -> Vec<PathBuf> {
        let base = Path::new("/sys/fs/cgroup");
        let rel = self.name.trim_start_matches('/');
        let mut out = vec![base.join(rel)];
        if let Ok(rd) = std::fs::read_dir(base) {
            for e in rd.flatten() {
                out.push(e.path().join(rel));
            }
        }
        out
    }
    pub fn remaining(&self) -> Vec<PathBuf> {
        self.dirs().into_iter().filter(|d| d.is_dir()).collect()
    }
}

impl Drop for CgroupParent {
    fn drop(&mut self) {
        for d in self.dirs() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Writes the pause and busybox archives into `dir`; returns their paths.
pub fn write_images(dir: &Path, busybox_ref: &str) -> (PathBuf, PathBuf) {
    let (path, data) = images::read_busybox().expect("busybox");
    let applets = images::busybox_applets(&path).expect("applets");
    let pause = images::pause_image(&data).expect("pause image");
    let bb = images::busybox_image(busybox_ref, &data, &applets).expect("busybox image");
    let p = dir.join("pause.tar");
    let b = dir.join("busybox.tar");
    images::write_archive(&pause, &p).expect("write pause");
    images::write_archive(&bb, &b).expect("write busybox");
    (p, b)
}

/// A bridge conflist for `subnet` (inside the test netns), host-local IPAM state in `dir`.
pub fn write_cni_conf(layout: &Layout, dir: &Path, subnet: &str, bridge: &str) {
    let conf = serde_json::json!({
        "cniVersion": "0.4.0",
        "name": "ferry-cri-test",
        "plugins": [{
            "type": "bridge",
            "bridge": bridge,
            "isGateway": true,
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": subnet}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": dir.join("ipam").display().to_string(),
            }
        }]
    });
    std::fs::create_dir_all(layout.cni_conf_dir()).expect("mkdir cni");
    std::fs::write(
        layout.cni_conf_dir().join("10-ferry-test.conflist"),
        conf.to_string(),
    )
    .expect("write conflist");
}

/// Polls `f` until it returns Some, for up to `secs` seconds.
pub async fn poll<T, F, Fut>(secs: u64, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// /etc/containerd's files with their sizes and modification times (Debian ships a
/// config.toml there, which Ferry's containerd must neither read nor touch).
pub fn etc_containerd() -> Vec<(PathBuf, u64, Option<std::time::SystemTime>)> {
    let mut out: Vec<_> = std::fs::read_dir("/etc/containerd")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    let m = e.metadata().ok()?;
                    Some((e.path(), m.len(), m.modified().ok()))
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Which of containerd's default paths exist now.
pub fn default_paths() -> Vec<(&'static str, bool)> {
    [
        "/var/lib/containerd",
        "/run/containerd",
        "/opt/containerd",
        "/var/lib/cni",
    ]
    .into_iter()
    .map(|p| (p, Path::new(p).exists()))
    .collect()
}

/// Resident set size of a process in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// Asserts nothing of the containerd under `data_dir` is left.
pub fn assert_nothing_left(data_dir: &Path, tmp: &Path) {
    let layout = Layout::new(data_dir);
    let left = containerd::detect_leftovers(&layout);
    assert!(left.containerd.is_empty(), "containerd left: {left:?}");
    assert!(left.shims.is_empty(), "shims left: {left:?}");
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let m = containerd::mounts_under(&mountinfo, tmp);
    assert!(m.is_empty(), "mounts left under {}: {m:?}", tmp.display());
}

/// containerd's own default paths must not appear; the two that containerd 1.6 hard-codes
/// (shim sockets under /run/containerd/s, libcni's cache under /var/lib/cni/results) must be
/// empty again, and are removed when the test created them.
pub fn check_default_paths(before: &[(&'static str, bool)]) {
    for (p, was) in before {
        let now = Path::new(p).exists();
        eprintln!("default path {p}: existed before {was}, now {now}");
        match *p {
            "/run/containerd" | "/var/lib/cni" => {
                let sub = if *p == "/run/containerd" {
                    "s"
                } else {
                    "results"
                };
                let inner = Path::new(p).join(sub);
                let left: Vec<_> = std::fs::read_dir(&inner)
                    .map(|rd| rd.flatten().map(|e| e.path()).collect())
                    .unwrap_or_default();
                assert!(left.is_empty(), "left in {}: {left:?}", inner.display());
                if !*was && now {
                    let _ = std::fs::remove_dir(&inner);
                    let _ = std::fs::remove_dir(p);
                }
            }
            _ => assert!(*was || !now, "{p} was created"),
        }
    }
}

/// Removes the hard-coded containerd/libcni dirs when this test created them and they are
/// empty (the failure path; [`check_default_paths`] asserts before doing the same).
pub fn tidy_default_paths(before: &[(&'static str, bool)]) {
    for (p, was) in before {
        if !*was && (*p == "/run/containerd" || *p == "/var/lib/cni") {
            let sub = if *p == "/run/containerd" {
                "s"
            } else {
                "results"
            };
            let _ = std::fs::remove_dir(Path::new(p).join(sub));
            let _ = std::fs::remove_dir(p);
        }
    }
}
