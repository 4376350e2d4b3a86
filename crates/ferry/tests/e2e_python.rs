//! End to end with the Python `kubernetes` client, and durability across kill -9.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Ferry, json};

#[test]
fn python_client_crud_errors_and_watch() {
    let f = Ferry::start();
    let out = f.python(include_str!("python/client.py"), &[]);
    assert!(out.contains("OK"), "{out}");
}

#[test]
fn acknowledged_creates_survive_kill9() {
    let mut f = Ferry::start();
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(include_str!("python/durability.py"))
        .arg("2000")
        .env("KUBECONFIG", &f.kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("python");
    let stdout = child.stdout.take().expect("stdout");
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let sink = acked.clone();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            match line {
                Ok(l) => sink.lock().expect("lock").push(l),
                Err(_) => break,
            }
        }
    });
    // Kill the server mid-stream, once a few hundred creates were acknowledged.
    let start = Instant::now();
    while acked.lock().expect("lock").len() < 300 && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(5));
    }
    f.kill9();
    let _ = child.wait();
    reader.join().expect("reader");
    let acked = acked.lock().expect("lock").clone();
    assert!(acked.len() < 2000, "the stream finished before the kill");
    assert!(
        !acked.is_empty(),
        "no create was acknowledged in {:?}",
        start.elapsed()
    );
    f.restart();
    let list = json(&f.k("kubectl", &["get", "cm", "-o", "json"]));
    let names: std::collections::HashSet<String> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str().map(String::from))
        .collect();
    let missing: Vec<&String> = acked.iter().filter(|n| !names.contains(*n)).collect();
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged creates lost: {:?}",
        missing.len(),
        acked.len(),
        &missing[..missing.len().min(5)]
    );
}

#[test]
fn restart_keeps_objects_and_sigterm_is_clean() {
    let mut f = Ferry::start();
    f.k(
        "kubectl",
        &["create", "configmap", "keep", "--from-literal=a=b"],
    );
    let status = f.stop();
    assert!(status.success(), "SIGTERM exit: {status}\n{}", f.log());
    f.restart();
    let cm = json(&f.k("kubectl", &["get", "cm", "keep", "-o", "json"]));
    assert_eq!(cm["data"]["a"], "b");
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        f.k("kubectl", &["get", "ns", ns]);
    }
}

#[test]
fn unauthenticated_requests_get_401() {
    let f = Ferry::start();
    let kc = std::fs::read_to_string(&f.kubeconfig).expect("kubeconfig");
    let server = kc
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .expect("server")
        .to_string();
    let script = format!(
        "import ssl,urllib.request,urllib.error\nctx=ssl.create_default_context();ctx.check_hostname=False;ctx.verify_mode=ssl.CERT_NONE\n\
try:\n  urllib.request.urlopen('{server}/api/v1/namespaces',context=ctx)\n  print('200')\nexcept urllib.error.HTTPError as e:\n  print(e.code)\n\
print(urllib.request.urlopen('{server}/readyz',context=ctx).read().decode())\n"
    );
    let out = f.python(&script, &[]);
    assert!(out.starts_with("401"), "{out}");
    assert!(out.contains("ok"), "{out}");
}

/// Issue 15: a paged LIST of 2,000 objects under concurrent writes is one snapshot, and a watch
/// from its resourceVersion loses no event.
#[test]
fn paged_list_is_a_snapshot_and_watch_loses_nothing() {
    let f = Ferry::start();
    let out = f.python(include_str!("python/paged_watch.py"), &[]);
    assert!(out.contains("OK"), "{out}");
}

/// Issue 15: a patch may not rename or move an object; duplicate JSON keys under Strict are 400.
#[test]
fn patch_cannot_rename_and_strict_refuses_duplicate_keys() {
    let f = Ferry::start();
    let out = f.python(include_str!("python/strict_writes.py"), &[]);
    assert!(out.contains("OK"), "{out}");
}
