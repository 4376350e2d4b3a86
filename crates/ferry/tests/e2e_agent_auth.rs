//! Issue 14, findings 3 and 4, on the real `ferry up`: its node agent's endpoint speaks HTTPS
//! only, refuses callers without a client certificate (the admin bearer token included) and
//! serves the API server's kubelet client certificate, which the cluster CA issued. `kubectl
//! logs` / `kubectl exec` through the API server keep working.

mod common;

use std::process::Command;

use common::{Ferry, eventually, json};

/// `curl` with `args`; returns (HTTP status, body).
fn curl(args: &[&str]) -> (String, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "20", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.to_string(), body.to_string())
}

#[test]
fn agent_endpoint_of_ferry_up_serves_only_the_api_server() {
    let f = Ferry::start();
    let pki = f.dir.path().join("pki");
    let ca = pki.join("ca.crt").display().to_string();
    let token = std::fs::read_to_string(pki.join("admin.token"))
        .expect("admin token")
        .trim()
        .to_string();

    // Where the agent listens: the Node's ferry.dev/agent-endpoint, else InternalIP:port.
    let mut endpoint = String::new();
    assert!(
        eventually(60, || {
            let out = f.kubectl(&["get", "nodes", "-o", "json"]);
            let v = json(&String::from_utf8_lossy(&out.stdout));
            let Some(node) = v["items"].as_array().and_then(|a| a.first()).cloned() else {
                return false;
            };
            if let Some(ep) = node["metadata"]["annotations"]["ferry.dev/agent-endpoint"].as_str() {
                endpoint = ep.to_string();
                return true;
            }
            let port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"].as_u64();
            let ip = node["status"]["addresses"]
                .as_array()
                .and_then(|a| a.iter().find(|x| x["type"] == "InternalIP"))
                .and_then(|x| x["address"].as_str().map(str::to_string));
            match (ip, port) {
                (Some(ip), Some(port)) if port > 0 => {
                    endpoint = format!("{ip}:{port}");
                    true
                }
                _ => false,
            }
        }),
        "no node reported its agent endpoint:\n{}",
        f.log()
    );
    let exec = "/exec/default/nobody/c?command=id&stdout=true";
    let logs = "/containerLogs/default/nobody/c";

    // Plain HTTP with the admin token (what the API server used to send): refused.
    let (code, body) = curl(&[
        "-H",
        &format!("Authorization: Bearer {token}"),
        &format!("http://{endpoint}{exec}"),
    ]);
    assert_eq!(code, "400", "{body}");
    assert!(body.contains("HTTP request to an HTTPS server"), "{body}");

    // HTTPS, no client certificate, admin bearer token: 401, for exec and logs.
    for path in [exec, logs] {
        let (code, body) = curl(&[
            "--cacert",
            &ca,
            "-H",
            &format!("Authorization: Bearer {token}"),
            &format!("https://{endpoint}{path}"),
        ]);
        assert_eq!(code, "401", "{path}: {body}");
    }

    // The API server's kubelet client certificate is authorized (the pod does not exist, so
    // the agent says so), and the agent's serving certificate verifies against the cluster CA.
    let (code, body) = curl(&[
        "--cacert",
        &ca,
        "--cert",
        &pki.join("apiserver-kubelet-client.crt")
            .display()
            .to_string(),
        "--key",
        &pki.join("apiserver-kubelet-client.key")
            .display()
            .to_string(),
        &format!("https://{endpoint}{logs}"),
    ]);
    assert_eq!(code, "404", "{body}");
    assert!(body.contains("not running on this node"), "{body}");

    // Through the API server, logs and exec work.
    f.k(
        "kubectl",
        &[
            "run",
            "talker",
            "--image=busybox",
            "--restart=Never",
            "--",
            "sh",
            "-c",
            "echo hello from talker; sleep 3600",
        ],
    );
    assert!(
        eventually(90, || {
            let out = f.kubectl(&["logs", "talker"]);
            String::from_utf8_lossy(&out.stdout).contains("hello from talker")
        }),
        "kubectl logs never showed the pod's output:\n{}",
        f.log()
    );
    let out = f.k("kubectl", &["exec", "talker", "--", "echo", "exec works"]);
    assert_eq!(out.trim(), "exec works");
    let log = f.log();
    assert!(
        !log.contains(&token),
        "the admin token appeared in ferry's log"
    );

    // A standalone `ferry agent` without client authentication refuses to start...
    let state = tempfile::tempdir().expect("state dir");
    let kubeconfig = f.kubeconfig.display().to_string();
    let agent = |extra: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ferry"));
        c.args([
            "agent",
            "--kubeconfig",
            &kubeconfig,
            "--node-name",
            "standalone",
        ])
        .args(["--port", "0", "--pod-network", "loopback", "--state-dir"])
        .arg(state.path())
        .args(extra);
        c
    };
    let out = agent(&[])
        .env("FERRY_LOG", "warn")
        .output()
        .expect("ferry agent");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "an open agent started:\n{stderr}");
    assert!(
        stderr.contains("refusing to serve the agent endpoint without client authentication"),
        "{stderr}"
    );

    // ...and runs with a serving certificate from `ferry agent-certificate`, which the API
    // server accepts (kubectl logs through it reaches the standalone agent).
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["agent-certificate", "--data-dir"])
        .arg(f.dir.path())
        .args(["--node-name", "standalone", "--node-ip", "127.0.0.1"])
        .output()
        .expect("ferry agent-certificate");
    assert!(out.status.success(), "{out:?}");
    let flags: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    assert_eq!(flags.len(), 3, "{flags:?}");
    let flag_refs: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut child = agent(&flag_refs)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("ferry agent");
    let pod = r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "standalone-pod"},
        "spec": {"nodeName": "standalone", "containers": [{"name": "c", "image": "busybox",
        "command": ["sh", "-c", "echo from the standalone agent; sleep 3600"]}]}}"#;
    let out = f.k_stdin("kubectl", &["create", "-f", "-"], pod);
    assert!(out.status.success(), "{out:?}");
    let ok = eventually(90, || {
        let out = f.kubectl(&["logs", "standalone-pod"]);
        String::from_utf8_lossy(&out.stdout).contains("from the standalone agent")
    });
    let _ = f.kubectl(&[
        "delete",
        "pod",
        "standalone-pod",
        "--grace-period=0",
        "--force",
    ]);
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    assert!(
        ok,
        "kubectl logs never reached the standalone agent:\n{}",
        f.log()
    );
}
