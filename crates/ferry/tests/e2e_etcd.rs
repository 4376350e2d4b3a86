//! Ferry on etcd: several `ferry apiserver` replicas on one etcd (a watch on one sees writes
//! made through another, in order, nothing missing), the etcd leader killed under load, an API
//! server replica killed with SIGKILL, and leader election between two `ferry controllers`.
//!
//! etcd is Debian's `etcd-server` (installed by `scripts/test-deps.sh`), started by the tests on
//! loopback with its data in a temporary directory.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_store::etcd_store::testing::EtcdCluster;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};

fn ferry_bin() -> &'static str {
    env!("CARGO_BIN_EXE_ferry")
}

/// A `ferry` child process, SIGKILLed on drop.
struct Proc {
    child: Option<Child>,
    log: PathBuf,
}

impl Proc {
    fn spawn(args: &[&str], log: PathBuf) -> Proc {
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(ferry_bin())
            .args(args)
            .env("FERRY_LOG", "info,hyper=warn,kube=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("start ferry");
        Proc {
            child: Some(child),
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn term(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let _ = c.wait();
        }
    }

    fn check_alive(&mut self) {
        if let Some(c) = self.child.as_mut()
            && let Ok(Some(status)) = c.try_wait()
        {
            panic!("ferry exited ({status}):\n{}", self.log());
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Starts `ferry apiserver --store etcd` on `data_dir` (shared between replicas: same CA and
/// token) and returns it with a copy of its kubeconfig.
fn start_apiserver(data_dir: &Path, endpoints: &[String], name: &str) -> (Proc, PathBuf) {
    let kc = data_dir.join("kubeconfig");
    let _ = std::fs::remove_file(&kc);
    let eps = endpoints.join(",");
    let mut p = Proc::spawn(
        &[
            "apiserver",
            "--data-dir",
            data_dir.to_str().expect("utf-8 path"),
            "--listen-api",
            "127.0.0.1:0",
            "--store",
            "etcd",
            "--etcd-endpoints",
            &eps,
        ],
        data_dir.join(format!("{name}.log")),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !kc.exists() {
        p.check_alive();
        assert!(Instant::now() < deadline, "{name} not ready:\n{}", p.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    // The file is written once ready; give the writer a moment to finish it.
    std::thread::sleep(Duration::from_millis(50));
    let mine = data_dir.join(format!("{name}.kubeconfig"));
    std::fs::copy(&kc, &mine).expect("copy kubeconfig");
    (p, mine)
}

async fn client(kubeconfig: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    kube::Client::try_from(cfg).expect("client")
}

fn cm(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        data: Some([("v".to_string(), name.to_string())].into()),
        ..Default::default()
    }
}

fn rv_of(cm: &ConfigMap) -> i64 {
    cm.metadata
        .resource_version
        .as_deref()
        .and_then(|r| r.parse().ok())
        .expect("numeric resourceVersion")
}

/// Collects ADDED events (name, resourceVersion) from a watch until `stop` says so.
async fn collect_watch(
    api: Api<ConfigMap>,
    from_rv: String,
    seen: Arc<Mutex<Vec<(String, i64)>>>,
) -> Result<(), String> {
    let mut rv = from_rv;
    let mut stream = api
        .watch(&WatchParams::default().timeout(290), &rv)
        .await
        .map_err(|e| e.to_string())?
        .boxed();
    while let Some(ev) = stream.try_next().await.map_err(|e| e.to_string())? {
        match ev {
            WatchEvent::Added(o) => {
                let r = rv_of(&o);
                rv = r.to_string();
                seen.lock()
                    .expect("lock")
                    .push((o.metadata.name.clone().unwrap_or_default(), r));
            }
            WatchEvent::Modified(o) | WatchEvent::Deleted(o) => rv = rv_of(&o).to_string(),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => return Err(format!("watch error after {rv}: {e:?}")),
        }
    }
    Err(format!("watch ended after {rv}"))
}

fn kubectl(kubeconfig: &Path, home: &Path, args: &[&str]) -> std::process::Output {
    Command::new("kubectl")
        .env("KUBECONFIG", kubeconfig)
        .env("HOME", home)
        .args(args)
        .output()
        .expect("kubectl")
}

/// Waits until `f` sees `n` events, or panics after `secs`.
async fn wait_len(seen: &Arc<Mutex<Vec<(String, i64)>>>, n: usize, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while seen.lock().expect("lock").len() < n {
        assert!(
            Instant::now() < deadline,
            "watch saw {} of {n} events",
            seen.lock().expect("lock").len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Two API servers on one etcd: a watch through A sees every write made through B, in
/// resourceVersion order; then A is killed with SIGKILL while B is under load, and B (and
/// kubectl pointed at it) keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_apiservers_share_etcd_then_one_is_killed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let etcd = EtcdCluster::start(&dir.path().join("etcd"), 1)
        .await
        .expect("start etcd (install etcd-server: scripts/test-deps.sh)");
    let data = dir.path().join("ferry");
    std::fs::create_dir_all(&data).expect("mkdir");
    let (mut a, kc_a) = start_apiserver(&data, &etcd.endpoints(), "a");
    let (mut b, kc_b) = start_apiserver(&data, &etcd.endpoints(), "b");
    let api_a: Api<ConfigMap> = Api::namespaced(client(&kc_a).await, "default");
    let api_b: Api<ConfigMap> = Api::namespaced(client(&kc_b).await, "default");

    // Watch through A from "now", write through B.
    let list = api_a
        .list(&ListParams::default())
        .await
        .expect("list via A");
    let start_rv = list.metadata.resource_version.clone().expect("list rv");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let watcher = tokio::spawn(collect_watch(api_a.clone(), start_rv, seen.clone()));
    let mut written = Vec::new();
    for i in 0..60 {
        let o = api_b
            .create(&PostParams::default(), &cm(&format!("shared-{i:03}")))
            .await
            .expect("create via B");
        written.push((o.metadata.name.clone().expect("name"), rv_of(&o)));
    }
    wait_len(&seen, written.len(), 20).await;
    {
        let seen = seen.lock().expect("lock");
        assert_eq!(*seen, written, "A's watch sees B's writes, in order, once");
        assert!(seen.windows(2).all(|w| w[0].1 < w[1].1));
    }
    // Reads through A of objects written through B, same resourceVersion.
    let got = api_a.get("shared-007").await.expect("get via A");
    assert_eq!(rv_of(&got), written[7].1);
    watcher.abort();

    // Load through B while A is killed with SIGKILL.
    // Counted, not timed: A dies after B has taken some writes, and the load goes on until B
    // has taken as many again (a loaded machine only makes it slower).
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let oks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let load = {
        let api_b = api_b.clone();
        let (stop, oks) = (stop.clone(), oks.clone());
        tokio::spawn(async move {
            let mut failed = 0usize;
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match api_b
                    .create(&PostParams::default(), &cm(&format!("load-{i:05}")))
                    .await
                {
                    Ok(_) => {
                        oks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Err(_) => failed += 1,
                }
                i += 1;
            }
            (oks.load(std::sync::atomic::Ordering::Relaxed), failed)
        })
    };
    let oks_reach = |n: usize| {
        let oks = oks.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            while oks.load(std::sync::atomic::Ordering::Relaxed) < n && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    oks_reach(5).await;
    a.kill9();
    let at_kill = oks.load(std::sync::atomic::Ordering::Relaxed);
    oks_reach(at_kill + 10).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed) = load.await.expect("load task");
    assert!(
        ok >= at_kill + 10,
        "B kept serving writes ({ok} ok, {at_kill} before A died)"
    );
    assert_eq!(failed, 0, "no write through B failed while A died");
    b.check_alive();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).expect("mkdir");
    let out = kubectl(&kc_b, &home, &["get", "configmaps", "-o", "name"]);
    assert!(
        out.status.success(),
        "kubectl via B: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names = String::from_utf8_lossy(&out.stdout);
    assert!(names.contains("configmap/shared-059"), "{names}");
    let out = kubectl(
        &kc_b,
        &home,
        &["create", "configmap", "after-kill", "--from-literal=k=v"],
    );
    assert!(
        out.status.success(),
        "kubectl create via B: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A 3-member etcd cluster behind two API servers: while a client writes continuously through
/// one, the etcd leader is killed. Errors last at most a few seconds, no acknowledged write is
/// lost, and a watch through the other API server spanning the failure has no gap or duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_leader_killed_under_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut etcd = EtcdCluster::start(&dir.path().join("etcd"), 3)
        .await
        .expect("start etcd (install etcd-server: scripts/test-deps.sh)");
    let data = dir.path().join("ferry");
    std::fs::create_dir_all(&data).expect("mkdir");
    // The API servers use their first endpoint until it fails: make that the leader, so that
    // killing it also breaks their connections and the watch feeding B's cache.
    let first_leader = etcd.leader().await.expect("an etcd leader");
    let mut endpoints = etcd.endpoints();
    endpoints.rotate_left(first_leader);
    let (_a, kc_a) = start_apiserver(&data, &endpoints, "a");
    let (b_proc, kc_b) = start_apiserver(&data, &endpoints, "b");
    let api_a: Api<ConfigMap> = Api::namespaced(client(&kc_a).await, "default");
    let api_b: Api<ConfigMap> = Api::namespaced(client(&kc_b).await, "default");

    let list = api_b
        .list(&ListParams::default())
        .await
        .expect("list via B");
    let start_rv = list.metadata.resource_version.clone().expect("rv");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let watcher = tokio::spawn(collect_watch(api_b.clone(), start_rv, seen.clone()));

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let acks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writer = {
        let api_a = api_a.clone();
        let (stop, acks) = (stop.clone(), acks.clone());
        tokio::spawn(async move {
            let mut acked = BTreeMap::new();
            let mut attempted = BTreeSet::new();
            let mut error_since: Option<Instant> = None;
            let mut worst = Duration::ZERO;
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let name = format!("w-{i:05}");
                attempted.insert(name.clone());
                match tokio::time::timeout(
                    Duration::from_secs(15),
                    api_a.create(&PostParams::default(), &cm(&name)),
                )
                .await
                {
                    Ok(Ok(o)) => {
                        acked.insert(name, rv_of(&o));
                        acks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if let Some(t) = error_since.take() {
                            worst = worst.max(t.elapsed());
                        }
                    }
                    _ => {
                        error_since.get_or_insert_with(Instant::now);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                i += 1;
            }
            // An error window still open at the end counts too.
            if let Some(t) = error_since {
                worst = worst.max(t.elapsed());
            }
            (acked, attempted, worst)
        })
    };
    // Counted, not timed: the leader dies after some writes, and the writer goes on until as
    // many again were acknowledged after it (60 s at most each, for a loaded machine).
    let acks_reach = |n: usize| {
        let acks = acks.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            while acks.load(std::sync::atomic::Ordering::Relaxed) < n && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    acks_reach(20).await;
    let leader = etcd.leader().await.expect("an etcd leader");
    let killed_at = Instant::now();
    etcd.kill(leader);
    let at_kill = acks.load(std::sync::atomic::Ordering::Relaxed);
    acks_reach(at_kill + 40).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (acked, attempted, worst) = writer.await.expect("writer");
    eprintln!(
        "etcd leader {leader} (first endpoint: {first_leader}) killed {:?} ago; {} writes acknowledged ({at_kill} before), longest error window {worst:?}",
        killed_at.elapsed(),
        acked.len()
    );
    assert!(
        acked.len() >= at_kill + 40,
        "writes went on after the leader died: {} acknowledged, {at_kill} before",
        acked.len()
    );
    // Failover is a matter of seconds (election timeout, client retry); the bound is generous
    // for a loaded 2-core machine and still tells an outage from a failover.
    assert!(
        worst < Duration::from_secs(30),
        "clients saw errors for {worst:?}"
    );
    // Nothing acknowledged is lost (read through the other API server).
    let all = api_b
        .list(&ListParams::default())
        .await
        .expect("list via B");
    let stored: BTreeMap<String, i64> = all
        .items
        .iter()
        .filter(|o| o.metadata.name.as_deref().unwrap_or("").starts_with("w-"))
        .map(|o| (o.metadata.name.clone().unwrap_or_default(), rv_of(o)))
        .collect();
    for (name, rv) in &acked {
        assert_eq!(stored.get(name), Some(rv), "acknowledged write {name} lost");
    }
    assert!(stored.keys().all(|k| attempted.contains(k)));
    // The watch through B saw exactly what is stored: no gap, no duplicate, in order.
    wait_len(&seen, stored.len(), 30).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seen = seen.lock().expect("lock").clone();
    watcher.abort();
    let mut expected: Vec<(String, i64)> = stored.into_iter().collect();
    expected.sort_by_key(|(_, rv)| *rv);
    assert_eq!(seen, expected, "watch across the etcd leader failure");
    if leader == first_leader {
        // The store watch feeding B's cache was on the killed member and was resumed elsewhere.
        assert!(
            b_proc.log().contains("etcd watch broke"),
            "B's store watch was not resumed:\n{}",
            b_proc.log()
        );
    }
}

fn lease_holder(f: &Path) -> Option<String> {
    let out = Command::new("kubectl")
        .env("KUBECONFIG", f)
        .args([
            "get",
            "lease",
            "-n",
            "kube-system",
            "ferry-controllers",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Two `ferry controllers` against one API server: exactly one holds the Lease and acts; kill it
/// with SIGKILL and the other takes over within the lease duration; a graceful stop releases it.
#[test]
fn controllers_leader_election() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("ferry");
    std::fs::create_dir_all(&data).expect("mkdir");
    let kc = data.join("kubeconfig");
    let mut api = Proc::spawn(
        &[
            "apiserver",
            "--data-dir",
            data.to_str().expect("utf-8"),
            "--listen-api",
            "127.0.0.1:0",
        ],
        dir.path().join("apiserver.log"),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !kc.exists() {
        api.check_alive();
        assert!(Instant::now() < deadline, "apiserver not ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(50));
    let lease_secs = 4;
    let ctl = |name: &str| {
        Proc::spawn(
            &[
                "controllers",
                "--kubeconfig",
                kc.to_str().expect("utf-8"),
                "--leader-elect-lease-duration",
                &format!("{lease_secs}s"),
                "--leader-elect-renew-deadline",
                "3s",
                "--leader-elect-retry-period",
                "500ms",
            ],
            dir.path().join(format!("{name}.log")),
        )
    };
    let mut c1 = ctl("c1");
    std::thread::sleep(Duration::from_millis(300));
    let mut c2 = ctl("c2");
    let acquired = |p: &Proc| p.log().contains("acquired the leader lease");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(acquired(&c1) || acquired(&c2)) {
        c1.check_alive();
        c2.check_alive();
        assert!(Instant::now() < deadline, "no one acquired the lease");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Give the standby several retry periods: it must not act.
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        acquired(&c1) != acquired(&c2),
        "exactly one leader:\nc1: {}\nc2: {}",
        c1.log(),
        c2.log()
    );
    let holder = lease_holder(&kc).expect("lease");
    assert!(!holder.is_empty());
    let (leader, standby) = if acquired(&c1) {
        (&mut c1, &mut c2)
    } else {
        (&mut c2, &mut c1)
    };
    leader.kill9();
    let killed = Instant::now();
    while !acquired(standby) {
        standby.check_alive();
        assert!(
            killed.elapsed() < Duration::from_secs(lease_secs + 3),
            "standby did not take over:\n{}",
            standby.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let took = killed.elapsed();
    eprintln!("standby took over {took:?} after SIGKILL (lease {lease_secs}s)");
    assert!(took <= Duration::from_secs(lease_secs + 2));
    let new_holder = lease_holder(&kc).expect("lease");
    assert!(!new_holder.is_empty() && new_holder != holder);
    // A graceful stop releases the lease.
    standby.term();
    assert_eq!(
        lease_holder(&kc).as_deref(),
        Some(""),
        "released on shutdown"
    );
}
