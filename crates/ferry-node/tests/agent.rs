//! The agent against an in-process API server: Node registration, pods as processes,
//! env vars, probes, restart policy, graceful termination, logs and exec via the API server.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Node, Pod, Secret};
use kube::api::{Api, AttachParams, DeleteParams, ListParams, LogParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

struct Cluster {
    _dir: tempfile::TempDir,
    client: kube::Client,
    kubeconfig: std::path::PathBuf,
    stop: CancellationToken,
    agent_done: Option<tokio::task::JoinHandle<()>>,
}

impl Cluster {
    async fn start(pod_cidr: &str) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let store =
            Arc::new(ferry_store::RedbStore::open(&dir.path().join("store.redb")).expect("store"));
        let stop = CancellationToken::new();
        let cfg = ferry_apiserver::Config {
            data_dir: dir.path().join("api"),
            ..Default::default()
        };
        let running = ferry_apiserver::start(cfg, store, stop.clone())
            .await
            .expect("apiserver");
        let client = ferry_kubeclient::client(Some(&running.kubeconfig))
            .await
            .expect("client");
        let mut args = ferry_node::AgentArgs::defaults();
        args.kubeconfig = Some(running.kubeconfig.clone());
        args.node_name = Some("node-a".into());
        args.zone = Some("zone-1".into());
        args.region = Some("region-1".into());
        args.port = 0;
        args.state_dir = dir.path().join("agent");
        args.pod_cidr = pod_cidr.parse().expect("cidr");
        args.cluster_dns = vec!["127.96.0.10".into()];
        args.builtin_command = Some(env!("CARGO_BIN_EXE_ferry-node-builtin").to_string());
        args.restart_backoff_seconds = 1;
        args.heartbeat_seconds = 1;
        // HTTPS endpoint with a serving certificate from the cluster CA; the API server's
        // kubelet client certificate authenticates to it.
        let tls = ferry_apiserver::pki::issue_agent_serving(
            &dir.path().join("api"),
            "node-a",
            &[args.node_ip],
        )
        .expect("agent certificate");
        args.tls_cert_file = Some(tls.cert_file);
        args.tls_private_key_file = Some(tls.key_file);
        args.client_ca_file = Some(tls.ca_file);
        let (_agent, done) = ferry_node::start(args, stop.clone()).await.expect("agent");
        Cluster {
            _dir: dir,
            client,
            kubeconfig: running.kubeconfig,
            stop,
            agent_done: Some(done),
        }
    }

    async fn shutdown(mut self) {
        self.stop.cancel();
        if let Some(d) = self.agent_done.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), d).await;
        }
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), "default")
    }

    async fn create_pod(&self, v: serde_json::Value) -> Pod {
        let mut v = v;
        v["apiVersion"] = json!("v1");
        v["kind"] = json!("Pod");
        v["spec"]["nodeName"] = json!("node-a");
        let p: Pod = serde_json::from_value(v).expect("pod");
        self.pods()
            .create(&PostParams::default(), &p)
            .await
            .expect("create pod")
    }

    async fn wait_pod(&self, name: &str, what: &str, f: impl Fn(&Pod) -> bool) -> Pod {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(p)) = self.pods().get_opt(name).await
                && f(&p)
            {
                return p;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {name}: {what}: {:?}",
                self.pods()
                    .get_opt(name)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|p| p.status)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

fn restarts(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .map(|c| c.restart_count)
        .unwrap_or(0)
}

/// The body of `GET /` on `addr`; an error while the pod's server is not listening yet (a pod
/// without a readiness probe is Ready once its process started, maybe before it listens).
async fn http_get(addr: &str) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    Ok(out.split("\r\n\r\n").nth(1).unwrap_or("").to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_pods_env_logs_exec_termination() {
    let c = Cluster::start("127.100.41.0/24").await;
    // The agent registered its Node and Lease.
    let nodes: Api<Node> = Api::all(c.client.clone());
    let node = nodes.get("node-a").await.expect("node");
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("kubernetes.io/hostname").map(String::as_str),
        Some("node-a")
    );
    assert_eq!(
        labels
            .get("topology.kubernetes.io/zone")
            .map(String::as_str),
        Some("zone-1")
    );
    assert_eq!(
        labels
            .get("topology.kubernetes.io/region")
            .map(String::as_str),
        Some("region-1")
    );
    let st = node.status.clone().expect("status");
    assert!(
        st.conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    );
    assert!(st.allocatable.unwrap_or_default().contains_key("memory"));
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), "kube-node-lease");
    let deadline = Instant::now() + Duration::from_secs(10);
    while leases.get_opt("node-a").await.ok().flatten().is_none() {
        assert!(Instant::now() < deadline, "no lease");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // serve_hostname answers its name on podIP:9376.
    c.create_pod(json!({"metadata": {"name": "hostnames-a"},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/serve_hostname"}]}}))
        .await;
    let p = c
        .wait_pod("hostnames-a", "ready", |p| {
            phase(p) == "Running" && ready(p)
        })
        .await;
    let ip = p
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("podIP");
    assert!(ip.starts_with("127.100.41."), "{ip}");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let ok =
            tokio::time::timeout(Duration::from_secs(1), http_get(&format!("{ip}:9376"))).await;
        match ok {
            Ok(Ok(body)) => {
                assert_eq!(body, "hostnames-a");
                break;
            }
            Ok(Err(e)) => assert!(Instant::now() < deadline, "GET {ip}:9376: {e}"),
            Err(_) => assert!(Instant::now() < deadline, "GET {ip}:9376 timed out"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Environment: fieldRef, configMapKeyRef, secretKeyRef, service links.
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), "default");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
        "metadata": {"name": "cfg"}, "data": {"color": "blue"}}))
        .expect("cm"),
    )
    .await
    .expect("cm");
    let secrets: Api<Secret> = Api::namespaced(c.client.clone(), "default");
    secrets.create(&PostParams::default(), &serde_json::from_value(json!({
        "metadata": {"name": "sec"}, "stringData": {"pw": "hunter2"}, "data": {"pw": "aHVudGVyMg=="}})).expect("s")).await.expect("secret");
    c.create_pod(json!({"metadata": {"name": "envpod", "labels": {"app": "env"}},
        "spec": {"terminationGracePeriodSeconds": 10, "containers": [{"name": "main", "image": "busybox",
            "command": ["sh", "-c", "env | sort; echo started; trap 'echo got TERM; sleep 1; exit 0' TERM; while true; do sleep 0.1; done"],
            "env": [
                {"name": "MY_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "MY_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "MY_APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                {"name": "COLOR", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "color"}}},
                {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "pw"}}},
                {"name": "GREETING", "value": "hello $(MY_NAME)"}]}]}}))
        .await;
    let p = c
        .wait_pod("envpod", "ready", |p| phase(p) == "Running" && ready(p))
        .await;
    let pod_ip = p
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("ip");
    // kubectl logs equivalent through the API server.
    let deadline = Instant::now() + Duration::from_secs(10);
    let logs = loop {
        let l = c
            .pods()
            .logs("envpod", &LogParams::default())
            .await
            .unwrap_or_default();
        if l.contains("started") {
            break l;
        }
        assert!(Instant::now() < deadline, "logs: {l}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for want in [
        format!("MY_POD_IP={pod_ip}"),
        "MY_NAME=envpod".to_string(),
        "MY_APP=env".to_string(),
        "COLOR=blue".to_string(),
        "PW=hunter2".to_string(),
        "GREETING=hello envpod".to_string(),
    ] {
        assert!(logs.lines().any(|l| l == want), "missing {want} in\n{logs}");
    }
    let tail = c
        .pods()
        .logs(
            "envpod",
            &LogParams {
                tail_lines: Some(1),
                ..Default::default()
            },
        )
        .await
        .expect("tail");
    assert_eq!(tail, "started\n");

    // exec through the API server (kube-rs WebSocket client).
    let mut att = c
        .pods()
        .exec(
            "envpod",
            ["cat", "/etc/resolv.conf"],
            &AttachParams::default().stderr(false),
        )
        .await
        .expect("exec");
    let mut out = String::new();
    {
        use tokio::io::AsyncReadExt;
        att.stdout()
            .expect("stdout")
            .read_to_string(&mut out)
            .await
            .expect("read");
    }
    att.join().await.expect("join");
    let root = std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    if root {
        assert!(
            out.starts_with("nameserver 127.96.0.10\nsearch default.svc.cluster.local svc.cluster.local cluster.local"),
            "{out}"
        );
        assert!(out.contains("options ndots:5\n"), "{out}");
        // kubectl 1.32 (WebSocket v5) as well, with the exit code passed through.
        if std::process::Command::new("kubectl")
            .arg("version")
            .arg("--client")
            .output()
            .is_ok()
        {
            let o = std::process::Command::new("kubectl")
                .env("KUBECONFIG", &c.kubeconfig)
                .args(["exec", "envpod", "--", "cat", "/etc/resolv.conf"])
                .output()
                .expect("kubectl");
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            assert_eq!(String::from_utf8_lossy(&o.stdout), out);
            let o = std::process::Command::new("kubectl")
                .env("KUBECONFIG", &c.kubeconfig)
                .args(["exec", "envpod", "--", "sh", "-c", "hostname; exit 3"])
                .output()
                .expect("kubectl");
            assert_eq!(
                o.status.code(),
                Some(3),
                "{}",
                String::from_utf8_lossy(&o.stderr)
            );
            assert_eq!(String::from_utf8_lossy(&o.stdout), "envpod\n");
            let o = std::process::Command::new("kubectl")
                .env("KUBECONFIG", &c.kubeconfig)
                .args(["logs", "envpod", "--tail=1"])
                .output()
                .expect("kubectl");
            assert_eq!(
                String::from_utf8_lossy(&o.stdout),
                "started\n",
                "{}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }

    // Graceful termination: the pod stays (terminating; still Ready while its process runs, as
    // kubelet keeps it) while its process handles SIGTERM, then the agent removes it.
    c.pods()
        .delete("envpod", &DeleteParams::default())
        .await
        .expect("delete");
    let t0 = Instant::now();
    let p = c
        .wait_pod("envpod", "terminating", |p| {
            p.metadata.deletion_timestamp.is_some()
        })
        .await;
    assert!(p.metadata.deletion_timestamp.is_some());
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.pods().get_opt("envpod").await.expect("get").is_some() {
        assert!(Instant::now() < deadline, "pod not removed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        t0.elapsed() >= Duration::from_millis(900),
        "SIGTERM handler's sleep was cut short"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_restart_policy_and_failures() {
    let c = Cluster::start("127.100.42.0/24").await;
    let dir = tempfile::tempdir().expect("dir");
    let flag = dir.path().join("ready");
    // Readiness drives the Ready condition.
    c.create_pod(json!({"metadata": {"name": "probed"},
        "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["sleep", "60"],
            "readinessProbe": {"exec": {"command": ["test", "-f", flag.display().to_string()]},
                "periodSeconds": 1}}]}}))
        .await;
    let p = c
        .wait_pod("probed", "running", |p| phase(p) == "Running")
        .await;
    assert!(!ready(&p));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!ready(&c.pods().get("probed").await.expect("get")));
    std::fs::write(&flag, "").expect("flag");
    c.wait_pod("probed", "ready", ready).await;
    std::fs::remove_file(&flag).expect("rm");
    c.wait_pod("probed", "unready again", |p| !ready(p)).await;

    // Restart policies.
    for (name, policy, cmd) in [
        ("never-fail", "Never", "exit 1"),
        ("never-ok", "Never", "exit 0"),
        ("onfailure", "OnFailure", "exit 2"),
        ("always", "Always", "exit 0"),
    ] {
        c.create_pod(
            json!({"metadata": {"name": name}, "spec": {"restartPolicy": policy,
            "containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", cmd]}]}}),
        )
        .await;
    }
    c.wait_pod("never-fail", "Failed", |p| phase(p) == "Failed")
        .await;
    let p = c
        .wait_pod("never-ok", "Succeeded", |p| phase(p) == "Succeeded")
        .await;
    assert_eq!(restarts(&p), 0);
    c.wait_pod("onfailure", "restarted", |p| restarts(p) >= 2)
        .await;
    c.wait_pod("always", "restarted", |p| restarts(p) >= 2)
        .await;

    // No command for an unknown image: a clear reason and an Event.
    c.create_pod(json!({"metadata": {"name": "noimage"},
        "spec": {"containers": [{"name": "c", "image": "redis:7"}]}}))
        .await;
    let p = c
        .wait_pod("noimage", "CreateContainerError", |p| {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.first())
                .and_then(|c| c.state.as_ref())
                .and_then(|s| s.waiting.as_ref())
                .is_some_and(|w| w.reason.as_deref() == Some("CreateContainerError"))
        })
        .await;
    assert_eq!(phase(&p), "Pending");

    // An FQDN over 64 characters keeps the pod from starting, with an Event.
    c.create_pod(json!({"metadata": {"name": "longfqdn"},
        "spec": {"hostname": "a-rather-long-hostname-for-a-pod", "subdomain": "busybox-subdomain",
            "setHostnameAsFQDN": true,
            "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "60"]}]}}))
        .await;
    let events: Api<Event> = Api::namespaced(c.client.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let evs = events.list(&ListParams::default()).await.expect("events");
        let e = evs.items.iter().find(|e| {
            e.involved_object.name.as_deref() == Some("longfqdn")
                && e.reason.as_deref() == Some("FailedCreatePodSandBox")
        });
        if let Some(e) = e {
            assert!(
                e.message
                    .as_deref()
                    .unwrap_or("")
                    .contains("is too long (64 characters is the max"),
                "{e:?}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "no FailedCreatePodSandBox event");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        phase(&c.pods().get("longfqdn").await.expect("get")),
        "Pending"
    );
    c.shutdown().await;
}
