//! The real `ferry apiserver` on its embedded store: a SIGTERM stops it cleanly — everything in
//! the database file and no write-ahead log left — so the next start has nothing to replay;
//! after a SIGKILL the log is there and the next start replays it. Either way every
//! acknowledged write is back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const RECOVERED: &str = "recovered writes from the write-ahead log";

struct ApiServer {
    child: Option<Child>,
    log: PathBuf,
}

impl ApiServer {
    /// Starts `ferry apiserver` on `data` and waits until its kubeconfig is written (ready).
    fn start(data: &Path, log_name: &str) -> ApiServer {
        let kc = data.join("kubeconfig");
        let _ = std::fs::remove_file(&kc);
        // Logs beside the data directory (which the server creates, private).
        let log = data.with_file_name(log_name);
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(["apiserver", "--data-dir"])
            .arg(data)
            .args(["--listen-api", "127.0.0.1:0"])
            .env("FERRY_LOG", "info,hyper=warn,kube=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("start ferry apiserver");
        let mut s = ApiServer {
            child: Some(child),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(90);
        while !kc.exists() {
            if let Some(Ok(Some(status))) = s.child.as_mut().map(Child::try_wait) {
                panic!("ferry apiserver exited ({status}):\n{}", s.log());
            }
            assert!(Instant::now() < deadline, "not ready:\n{}", s.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        // The kubeconfig is written whole once ready; give the writer a moment to finish it.
        std::thread::sleep(Duration::from_millis(50));
        s
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `signal` and waits for the process to end; returns whether it exited with 0.
    fn stop(&mut self, signal: &str) -> bool {
        let mut c = self.child.take().expect("running");
        let _ = Command::new("kill")
            .args([signal, &c.id().to_string()])
            .status();
        c.wait().expect("wait").success()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn kubectl(data: &Path, args: &[&str]) -> String {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(data.join("kubeconfig"))
        .args(args)
        .output()
        .expect("kubectl");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The names of the ConfigMaps `kubectl` lists in the default namespace.
fn configmaps(data: &Path) -> Vec<String> {
    let out = kubectl(data, &["get", "configmaps", "-o", "name"]);
    let mut v: Vec<String> = out
        .lines()
        .filter_map(|l| l.strip_prefix("configmap/"))
        .filter(|n| n.starts_with("cm-"))
        .map(String::from)
        .collect();
    v.sort();
    v
}

fn wal_bytes(data: &Path) -> Option<u64> {
    std::fs::metadata(data.join("store.redb.wal"))
        .ok()
        .map(|m| m.len())
}

#[test]
fn sigterm_leaves_no_log_to_replay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let mut want = Vec::new();

    // Round 1: writes, then SIGKILL: the log holds them and the next start replays it.
    let mut api = ApiServer::start(&data, "first.log");
    for i in 0..5 {
        let name = format!("cm-kill-{i}");
        kubectl(&data, &["create", "configmap", &name, "--from-literal=k=v"]);
        want.push(name);
    }
    assert!(
        wal_bytes(&data).is_some_and(|n| n > 0),
        "the log holds the writes"
    );
    api.stop("-KILL");
    assert!(wal_bytes(&data).is_some_and(|n| n > 0));

    let mut api = ApiServer::start(&data, "second.log");
    assert!(
        api.log().contains(RECOVERED),
        "a SIGKILLed store replays its log:\n{}",
        api.log()
    );
    want.sort();
    assert_eq!(configmaps(&data), want);

    // Round 2: more writes, then SIGTERM: a clean stop, no log left.
    for i in 0..5 {
        let name = format!("cm-term-{i}");
        kubectl(&data, &["create", "configmap", &name, "--from-literal=k=v"]);
        want.push(name);
    }
    assert!(wal_bytes(&data).is_some_and(|n| n > 0));
    assert!(
        api.stop("-TERM"),
        "exit status 0 on SIGTERM:\n{}",
        api.log()
    );
    assert!(
        api.log().contains("store shut down cleanly"),
        "{}",
        api.log()
    );
    assert_eq!(wal_bytes(&data), None, "no write-ahead log after SIGTERM");

    // Round 3: the restart has nothing to replay, and every write is there.
    let mut api = ApiServer::start(&data, "third.log");
    assert!(
        !api.log().contains(RECOVERED),
        "nothing to replay after a clean stop:\n{}",
        api.log()
    );
    want.sort();
    assert_eq!(configmaps(&data), want);
    assert!(api.stop("-TERM"));
    assert_eq!(wal_bytes(&data), None);
}

/// `kubectl` without asserting success: (success, stdout + stderr).
fn kubectl_try(data: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(data.join("kubeconfig"))
        .args(args)
        .output()
        .expect("kubectl");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// A tmpfs mounted on a directory of a temp dir, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// The data directory on a small file system that fills up: writes through the API fail with
/// a Status naming the cause, `/readyz` fails with the reason in `?verbose`, and once the test
/// frees space (removes its filler file beside the store) writes succeed again without a
/// restart; after a restart every acknowledged write is there.
#[test]
fn full_disk_refuses_writes_and_recovers_without_restart() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mnt = dir.path().join("fs");
    std::fs::create_dir(&mnt).unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=48m", "tmpfs"])
        .arg(&mnt)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipped: mount -t tmpfs failed");
        return;
    }
    let fs = Tmpfs(mnt.clone());
    let data = mnt.join("data");
    let mut api = ApiServer::start(&data, "first.log");
    let filler = mnt.join("filler");
    std::fs::write(&filler, vec![1u8; 16 << 20]).unwrap();
    let big = dir.path().join("big");
    std::fs::write(&big, "x".repeat(500 << 10)).unwrap();
    let from_file = format!("--from-file=big={}", big.display());

    let mut acked = Vec::new();
    let mut refused = None;
    for i in 0..200 {
        let name = format!("cm-{i:03}");
        let (ok, out) = kubectl_try(&data, &["create", "configmap", &name, &from_file]);
        if ok {
            acked.push(name);
        } else {
            refused = Some((name, out));
            break;
        }
    }
    let (name, out) = refused.expect("the disk fills up");
    assert!(!acked.is_empty());
    assert!(
        out.contains("store: no space left on device (")
            && out.contains("writes refused until space is freed"),
        "{out}"
    );
    let (ready, out) = kubectl_try(&data, &["get", "--raw", "/readyz?verbose"]);
    assert!(!ready, "{out}");
    assert!(
        out.contains("[-]store-writable failed: store: no space left on device"),
        "{out}"
    );
    // Reads go on.
    let mut want = acked.clone();
    want.sort();
    assert_eq!(configmaps(&data), want);

    std::fs::remove_file(&filler).unwrap();
    let freed = Instant::now();
    let deadline = freed + Duration::from_secs(60);
    loop {
        let (ok, out) = kubectl_try(&data, &["create", "configmap", &name, &from_file]);
        if ok {
            break;
        }
        assert!(Instant::now() < deadline, "writes did not come back: {out}");
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "{} writes acknowledged before the disk was full; first write {:?} after space was freed",
        acked.len(),
        freed.elapsed()
    );
    acked.push(name);
    let (ready, out) = kubectl_try(&data, &["get", "--raw", "/readyz?verbose"]);
    assert!(ready && out.contains("[+]store-writable ok"), "{out}");

    assert!(api.stop("-TERM"), "{}", api.log());
    let mut api = ApiServer::start(&data, "second.log");
    let mut want = acked.clone();
    want.sort();
    assert_eq!(configmaps(&data), want);
    assert!(api.stop("-TERM"));
    drop(fs);
}
