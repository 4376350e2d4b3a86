//! Issue 14, findings 1 and 5, against the real `ferry up` binary:
//!
//! * a JSON patch of 41 self-doubling `copy` operations on a ConfigMap (the one that drove the
//!   API server to 24 GB) is refused with a clean 422 while the process's peak memory stays
//!   bounded; a 20,000-operation patch is 413; bodies over 3 MiB and objects over 1.5 MiB are
//!   413; nothing refused is stored, and the server keeps answering;
//! * the data directory is 0700 and the store, keys, token and kubeconfig 0600, and looser modes
//!   left on disk are tightened (with a warning) at the next start.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::{Ferry, json};

/// What `curl` got: HTTP code and body.
fn curl(f: &Ferry, method: &str, path: &str, content_type: &str, body: &[u8]) -> (u16, String) {
    let kc = std::fs::read_to_string(&f.kubeconfig).unwrap();
    let server = kc
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .unwrap()
        .to_string();
    let pki = f.dir.path().join("pki");
    let token = std::fs::read_to_string(pki.join("admin.token")).unwrap();
    let body_file = f.dir.path().join("curl-body");
    std::fs::write(&body_file, body).unwrap();
    let out = Command::new("curl")
        .args(["-sS", "-o", "-", "-w", "\n%{http_code}", "--cacert"])
        .arg(pki.join("ca.crt"))
        .args(["-X", method, "-H"])
        .arg(format!("Authorization: Bearer {}", token.trim()))
        .args([
            "-H",
            &format!("Content-Type: {content_type}"),
            "--data-binary",
        ])
        .arg(format!("@{}", body_file.display()))
        .arg(format!("{server}{path}"))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    let code = code.trim().parse().unwrap_or(0);
    if code == 0 {
        return (0, String::from_utf8_lossy(&out.stderr).into_owned());
    }
    (code, body.to_string())
}

/// The process's peak resident set (VmHWM), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o7777
}

fn cm_state(f: &Ferry) -> serde_json::Value {
    let out = f.kubectl(&["get", "configmap", "doubling", "-o", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json(&String::from_utf8_lossy(&out.stdout));
    serde_json::json!({"rv": v["metadata"]["resourceVersion"], "data": v["data"]})
}

const CM: &str = "/api/v1/namespaces/default/configmaps";

#[test]
fn bounded_patches_and_private_files() {
    let mut f = Ferry::start();
    let pid = f.pid().unwrap();
    f.k(
        "kubectl",
        &[
            "create",
            "configmap",
            "doubling",
            &format!("--from-literal=seed={}", "x".repeat(40)),
        ],
    );
    let before = cm_state(&f);
    let peak_before = peak_rss(pid);

    // Finding 1: 41 copies of /data into itself, each doubling it (2^41 × 40 bytes if applied).
    let ops: Vec<serde_json::Value> = (0..41)
        .map(|i| serde_json::json!({"op": "copy", "from": "/data", "path": format!("/data/k{i}")}))
        .collect();
    let patch = serde_json::to_string(&ops).unwrap();
    let out = f.kubectl(&[
        "patch",
        "configmap",
        "doubling",
        "--type=json",
        "-p",
        &patch,
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("Unable to complete the copy, the accumulated size increase of copy is")
            && stderr.contains("exceeding the limit 3145728"),
        "{stderr}"
    );
    let path = format!("{CM}/doubling");
    let (code, body) = curl(
        &f,
        "PATCH",
        &path,
        "application/json-patch+json",
        patch.as_bytes(),
    );
    assert_eq!(code, 422, "{body}");
    let status = json(&body);
    assert_eq!(status["reason"], "Invalid", "{body}");

    // A 20,000-operation patch: 413 with upstream's message.
    let ops: Vec<serde_json::Value> =
        vec![serde_json::json!({"op": "test", "path": "/data/seed", "value": "x"}); 20_000];
    let (code, body) = curl(
        &f,
        "PATCH",
        &path,
        "application/json-patch+json",
        serde_json::to_string(&ops).unwrap().as_bytes(),
    );
    assert_eq!(code, 413, "{body}");
    let status = json(&body);
    assert_eq!(status["reason"], "RequestEntityTooLarge");
    assert_eq!(
        status["message"],
        "Request entity too large: The allowed maximum operations in a JSON patch is 10000, got 20000"
    );

    // A body over 3 MiB, and an object over etcd's 1.5 MiB: 413, nothing stored.
    let (code, body) = curl(
        &f,
        "POST",
        CM,
        "application/json",
        &vec![b' '; 4 * 1024 * 1024],
    );
    assert_eq!(code, 413, "{body}");
    assert_eq!(
        json(&body)["message"],
        "Request entity too large: limit is 3145728"
    );
    // (A Pod: ConfigMaps and Secrets are held to 1 MiB by validation first.)
    let big = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "too-big"},
        "spec": {"containers": [{"name": "c", "image": "busybox", "args": ["y".repeat(2_000_000)]}]}});
    let pods = "/api/v1/namespaces/default/pods";
    let (code, body) = curl(
        &f,
        "POST",
        pods,
        "application/json",
        &serde_json::to_vec(&big).unwrap(),
    );
    assert_eq!(code, 413, "{body}");
    assert_eq!(
        json(&body)["message"],
        "Request entity too large: limit is 1572864"
    );
    let out = f.kubectl(&["get", "pod", "too-big"]);
    assert!(!out.status.success());
    // Growing an object past the limit by a merge patch is refused the same way.
    let grow = serde_json::json!({"data": {"big": "z".repeat(1_600_000)}});
    let (code, body) = curl(
        &f,
        "PATCH",
        &path,
        "application/merge-patch+json",
        &serde_json::to_vec(&grow).unwrap(),
    );
    assert_eq!(code, 413, "{body}");

    // Nothing was stored, the server still answers, and its memory stayed bounded.
    assert_eq!(cm_state(&f), before);
    f.k("kubectl", &["get", "--raw", "/readyz"]);
    let grown = peak_rss(pid).saturating_sub(peak_before);
    assert!(
        grown < 512 * 1024 * 1024,
        "peak RSS grew by {} MiB",
        grown / (1024 * 1024)
    );

    // Finding 5: the data directory and everything secret in it are the owner's alone.
    let dir = f.dir.path().to_path_buf();
    let pki = dir.join("pki");
    assert_eq!(mode(&dir), 0o700);
    for file in [
        dir.join("store.redb"),
        dir.join("kubeconfig"),
        pki.join("ca.key"),
        pki.join("apiserver.key"),
        pki.join("admin.token"),
    ] {
        assert_eq!(mode(&file), 0o600, "{}", file.display());
    }
    // Loosened while stopped: tightened, with a warning, at the next start.
    f.stop();
    let loosen = |p: &Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    };
    loosen(&dir, 0o755);
    loosen(&dir.join("store.redb"), 0o644);
    loosen(&pki.join("ca.key"), 0o644);
    loosen(&pki, 0o755);
    f.restart();
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&pki), 0o700);
    assert_eq!(mode(&dir.join("store.redb")), 0o600);
    assert_eq!(mode(&pki.join("ca.key")), 0o600);
    assert!(
        f.log().contains("was readable by other users"),
        "no warning in the log"
    );
    assert_eq!(cm_state(&f), before);
}
