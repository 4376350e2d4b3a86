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
}
