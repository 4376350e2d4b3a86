//! Issue 14, finding 1, against a running API server (in this process, on loopback): the work a
//! single request can make the server do is bounded, and what each worst case costs in peak
//! memory is measured (the process's peak resident set, reset before each request through
//! `/proc/self/clear_refs`) and held to the bound the crate documents.
//!
//! One test function on purpose: the measurement is per process, so no other test may run
//! beside it in this binary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use ferry_apiserver::limits::MAX_REQUEST_MEMORY_BYTES;
use serde_json::{Value, json};

mod common;

fn status_kb(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// Runs `f` and returns how far the peak resident set rose above the resident set before it.
async fn peak_growth<F: std::future::Future<Output = T>, T>(f: F) -> (T, u64) {
    // Writing 5 resets VmHWM to the current resident set (Linux >= 4.0).
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    let before = status_kb("VmRSS:");
    let out = f.await;
    let grown = status_kb("VmHWM:").saturating_sub(before) * 1024;
    (out, grown)
}

const CM: &str = "/api/v1/namespaces/default/configmaps";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_is_bounded() {
    let server = common::start().await;
    let api = server.api.clone();
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "doubling"}, "data": {"seed": "x".repeat(40)}});
    let (code, created) = api
        .send(
            "POST",
            CM,
            "application/json",
            serde_json::to_vec(&cm).unwrap(),
        )
        .await;
    assert_eq!(code, 201, "{created}");
    let path = format!("{CM}/doubling");
    let rv = created["metadata"]["resourceVersion"].clone();

    let mut report = Vec::new();
    let mut worst = 0u64;
    macro_rules! measure {
        ($name:expr, $method:expr, $path:expr, $ct:expr, $body:expr, $code:expr) => {{
            let body: Vec<u8> = $body;
            let len = body.len();
            let ((code, status), grown) = peak_growth(api.send($method, $path, $ct, body)).await;
            let want: &[u16] = &$code;
            assert!(want.contains(&code), "{}: {code} {status}", $name);
            report.push(format!(
                "{:<44} body {:>8} B  peak +{:>4} MiB",
                $name,
                len,
                grown / (1024 * 1024)
            ));
            worst = worst.max(grown);
            status
        }};
    }

    // Finding 1: 41 self-doubling copies (2^41 × 40 bytes if applied).
    let ops: Vec<Value> = (0..41)
        .map(|i| json!({"op": "copy", "from": "/data", "path": format!("/data/k{i}")}))
        .collect();
    let s = measure!(
        "41 self-doubling copies",
        "PATCH",
        &path,
        "application/json-patch+json",
        serde_json::to_vec(&ops).unwrap(),
        [422]
    );
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .ends_with("exceeding the limit 3145728"),
        "{s}"
    );
    // 20,000 operations.
    let ops = vec![json!({"op": "test", "path": "/data/seed", "value": "x"}); 20_000];
    let s = measure!(
        "20,000-operation patch",
        "PATCH",
        &path,
        "application/json-patch+json",
        serde_json::to_vec(&ops).unwrap(),
        [413]
    );
    assert_eq!(
        s["message"],
        "Request entity too large: The allowed maximum operations in a JSON patch is 10000, got 20000"
    );
    // 10,000 operations copying a 300-byte value: within the copy budget (3 MB), but the
    // result is larger than any object may be.
    let mut ops = vec![json!({"op": "add", "path": "/data/v", "value": "v".repeat(298)})];
    ops.extend(
        (1..10_000)
            .map(|i| json!({"op": "copy", "from": "/data/v", "path": format!("/data/c{i}")})),
    );
    measure!(
        "10,000 copies within the copy budget",
        "PATCH",
        &path,
        "application/json-patch+json",
        serde_json::to_vec(&ops).unwrap(),
        [413]
    );
    // Bodies of the largest size, in the shapes that cost the most memory per byte.
    let max = ferry_apiserver::body::MAX_REQUEST_BODY_BYTES;
    let mut zeros = b"[0".to_vec();
    while zeros.len() + 4 < max {
        zeros.extend_from_slice(b",0");
    }
    zeros.push(b']');
    measure!(
        "3 MiB array of zeros (POST)",
        "POST",
        CM,
        "application/json",
        zeros,
        [400]
    );
    let mut keys = String::from(
        "{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"metadata\":{\"name\":\"keys\"},\"data\":{",
    );
    let mut i = 0;
    while keys.len() + 40 < max {
        keys.push_str(&format!("\"{i:x}\":\"\","));
        i += 1;
    }
    keys.push_str("\"end\":\"\"}}");
    measure!(
        "3 MiB of small keys (POST)",
        "POST",
        CM,
        "application/json",
        keys.into_bytes(),
        [413, 422]
    );
    let mut merge = String::from("{\"data\":{");
    let mut i = 0;
    while merge.len() + 40 < max {
        merge.push_str(&format!("\"{i:x}\":\"\","));
        i += 1;
    }
    merge.push_str("\"end\":\"\"}}");
    measure!(
        "3 MiB merge patch of small keys",
        "PATCH",
        &path,
        "application/merge-patch+json",
        merge.clone().into_bytes(),
        [413]
    );
    measure!(
        "3 MiB strategic merge patch of small keys",
        "PATCH",
        &path,
        "application/strategic-merge-patch+json",
        merge.into_bytes(),
        [413]
    );
    // A YAML alias bomb (10^9 scalars if expanded).
    let mut y = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..10 {
        let p = i - 1;
        y.push_str(&format!(
            "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
        ));
    }
    measure!(
        "YAML alias bomb",
        "POST",
        CM,
        "application/yaml",
        y.into_bytes(),
        [400]
    );
    // Over the body limit.
    measure!(
        "4 MiB body",
        "POST",
        CM,
        "application/json",
        vec![b' '; 4 * 1024 * 1024],
        [413]
    );
    // A large object (ConfigMaps hold at most 1 MiB of data), then patched past the limit.
    let big = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "big"}, "data": {"a": "y".repeat(1_000_000)}});
    measure!(
        "1 MB object (create)",
        "POST",
        CM,
        "application/json",
        serde_json::to_vec(&big).unwrap(),
        [201]
    );
    let ops = json!([{"op": "copy", "from": "/data/a", "path": "/data/b"}]);
    measure!(
        "copy of 1 MB within an object",
        "PATCH",
        &format!("{CM}/big"),
        "application/json-patch+json",
        serde_json::to_vec(&ops).unwrap(),
        [413]
    );

    eprintln!("peak memory per request:\n  {}", report.join("\n  "));
    assert!(
        worst < MAX_REQUEST_MEMORY_BYTES,
        "a request raised the peak resident set by {} MiB (documented bound {} MiB):\n{}",
        worst / (1024 * 1024),
        MAX_REQUEST_MEMORY_BYTES / (1024 * 1024),
        report.join("\n")
    );

    // Nothing refused was stored.
    let (code, now) = api.send("GET", &path, "application/json", Vec::new()).await;
    assert_eq!(code, 200);
    assert_eq!(now["metadata"]["resourceVersion"], rv);
    assert_eq!(now["data"], json!({"seed": "x".repeat(40)}));
    for name in ["keys"] {
        let (code, _) = api
            .send(
                "GET",
                &format!("{CM}/{name}"),
                "application/json",
                Vec::new(),
            )
            .await;
        assert_eq!(code, 404, "{name} was stored");
    }
    drop(server);
}
