//! Issue 14, findings 3 and 4: the agent's exec/logs endpoint is HTTPS only and runs nothing for
//! a caller without a client certificate from the cluster CA that names an authorized user —
//! whatever credentials the agent's own kubeconfig uses (here a `tokenFile:`) and whatever
//! bearer token the caller sends (the admin token included). The API server's kubelet client
//! certificate is the identity that may exec; exec through the API server keeps working.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams, PostParams};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

/// A client certificate and key (PEM).
struct ClientCert {
    cert_pem: String,
    key_pem: String,
}

fn client_config(ca_pem: &str, client: Option<&ClientCert>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.expect("ca pem")).expect("ca");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let b = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots);
    let cfg = match client {
        Some(c) => b
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(c.cert_pem.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .expect("cert"),
                PrivateKeyDer::from_pem_slice(c.key_pem.as_bytes()).expect("key"),
            )
            .expect("client auth"),
        None => b.with_no_client_auth(),
    };
    Arc::new(cfg)
}

/// Sends `request` over TLS and returns the response head and body (up to Content-Length, or
/// for a 101 everything until the agent closes the stream), or the TLS/IO error.
async fn https(
    addr: std::net::SocketAddr,
    cfg: Arc<rustls::ClientConfig>,
    request: &str,
) -> Result<String, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from(addr.ip().to_string()).map_err(|e| e.to_string())?;
    let mut tls = tokio_rustls::TlsConnector::from(cfg)
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let read = async {
        loop {
            let n = match tls.read(&mut chunk).await {
                Ok(n) => n,
                // A stream the agent ended without TLS close_notify.
                Err(_) if buf.starts_with(b"HTTP/1.1 101") => 0,
                Err(e) => return Err(format!("read: {e}")),
            };
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf).to_string();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                if head.starts_with("HTTP/1.1 101") {
                    // An exec stream: read until the agent closes it (the command ended).
                    continue;
                }
                let len = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .and_then(|v| v.trim().parse::<usize>().ok())
                    })
                    .unwrap_or(0);
                if body.len() >= len {
                    break;
                }
            }
        }
        Ok::<_, String>(())
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .map_err(|_| "timed out".to_string())??;
    if buf.is_empty() {
        return Err("connection closed without a response".into());
    }
    Ok(String::from_utf8_lossy(&buf).to_string())
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A WebSocket exec request that creates `marker`, with an optional bearer token.
fn exec_request(marker: &Path, token: Option<&str>) -> String {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    format!(
        "GET /exec/default/victim/main?command=touch&command={}&stdout=true&stderr=true HTTP/1.1\r\n\
         Host: agent\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: v5.channel.k8s.io\r\n{auth}\r\n",
        encode(&marker.display().to_string())
    )
}

fn status_line(resp: &str) -> &str {
    resp.lines().next().unwrap_or("")
}

/// Waits a little for `marker`: a command refused must not run, even late.
async fn assert_not_run(marker: &Path, what: &str) {
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!marker.exists(), "{what}: the command ran");
}

async fn wait_for(marker: &Path, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !marker.exists() {
        assert!(Instant::now() < deadline, "{what}: the command did not run");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_exec_is_refused_and_runs_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store =
        Arc::new(ferry_store::RedbStore::open(&dir.path().join("store.redb")).expect("store"));
    let stop = CancellationToken::new();
    let api_dir = dir.path().join("api");
    let running = ferry_apiserver::start(
        ferry_apiserver::Config {
            data_dir: api_dir.clone(),
            ..Default::default()
        },
        store,
        stop.clone(),
    )
    .await
    .expect("apiserver");
    let admin_token = std::fs::read_to_string(api_dir.join("pki/admin.token"))
        .expect("token")
        .trim()
        .to_string();
    let ca_pem = std::fs::read_to_string(api_dir.join("pki/ca.crt")).expect("ca");

    // The agent's kubeconfig reads its token from a file (`tokenFile:`): before the fix such an
    // agent had no endpoint token at all and served exec to anyone.
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, &admin_token).expect("token file");
    let kubeconfig = dir.path().join("agent.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    \
             certificate-authority: {}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\n\
             current-context: c\nusers:\n- name: u\n  user:\n    tokenFile: {}\n",
            running.url,
            api_dir.join("pki/ca.crt").display(),
            token_file.display()
        ),
    )
    .expect("kubeconfig");

    let mut args = ferry_node::AgentArgs::defaults();
    args.kubeconfig = Some(kubeconfig.clone());
    args.node_name = Some("node-sec".into());
    args.port = 0;
    args.state_dir = dir.path().join("agent");
    args.pod_cidr = "127.103.0.0/24".parse().expect("cidr");
    args.builtin_command = Some(env!("CARGO_BIN_EXE_ferry-node-builtin").to_string());
    args.heartbeat_seconds = 1;

    // Without a client CA the agent refuses to start.
    let err = match ferry_node::start(args.clone(), stop.clone()).await {
        Ok(_) => panic!("an agent without client authentication started"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains("--client-ca-file") && err.contains("--insecure-allow-unauthenticated"),
        "{err}"
    );

    let tls = ferry_apiserver::pki::issue_agent_serving(&api_dir, "node-sec", &[args.node_ip])
        .expect("agent certificate");
    args.tls_cert_file = Some(tls.cert_file);
    args.tls_private_key_file = Some(tls.key_file);
    args.client_ca_file = Some(tls.ca_file);
    let (agent, done) = ferry_node::start(args, stop.clone()).await.expect("agent");
    let ep = agent.endpoint;

    let client = ferry_kubeclient::client(Some(&kubeconfig))
        .await
        .expect("client");
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "victim"},
        "spec": {"nodeName": "node-sec", "containers": [{"name": "main", "image": "busybox",
            "command": ["sleep", "3600"]}]}
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let phase = pods
            .get_opt("victim")
            .await
            .ok()
            .flatten()
            .and_then(|p| p.status)
            .and_then(|s| s.phase);
        if phase.as_deref() == Some("Running") {
            break;
        }
        assert!(Instant::now() < deadline, "pod not running: {phase:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let markers = tempfile::tempdir().expect("markers");
    let marker = |n: &str| -> PathBuf { markers.path().join(n) };

    // 1. Plain HTTP (what the API server used to send, with the admin token): refused.
    {
        let mut s = tokio::net::TcpStream::connect(ep).await.expect("connect");
        s.write_all(exec_request(&marker("plain"), Some(&admin_token)).as_bytes())
            .await
            .expect("write");
        let mut out = String::new();
        let _ = tokio::time::timeout(Duration::from_secs(20), s.read_to_string(&mut out)).await;
        assert!(
            out.starts_with("HTTP/1.0 400") && out.contains("HTTP request to an HTTPS server"),
            "{out}"
        );
        assert_not_run(&marker("plain"), "plain HTTP").await;
    }

    // 2. HTTPS without a client certificate, with the admin bearer token: 401.
    let anonymous = client_config(&ca_pem, None);
    let resp = https(
        ep,
        anonymous.clone(),
        &exec_request(&marker("token"), Some(&admin_token)),
    )
    .await
    .expect("response");
    assert_eq!(status_line(&resp), "HTTP/1.1 401 Unauthorized", "{resp}");
    assert_not_run(&marker("token"), "admin bearer token").await;
    // And logs too.
    let resp = https(
        ep,
        anonymous,
        "GET /containerLogs/default/victim/main HTTP/1.1\r\nHost: agent\r\n\r\n",
    )
    .await
    .expect("response");
    assert_eq!(status_line(&resp), "HTTP/1.1 401 Unauthorized", "{resp}");

    // 3. A client certificate from another CA, naming the API server's user: the handshake is
    // refused.
    let other_ca = {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "other-ca");
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        rcgen::Issuer::new(p, key)
    };
    let forged = {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        p.distinguished_name.push(
            rcgen::DnType::CommonName,
            ferry_apiserver::pki::KUBELET_CLIENT_USER,
        );
        p.distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:masters");
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = p.signed_by(&key, &other_ca).expect("forged");
        ClientCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    };
    let r = https(
        ep,
        client_config(&ca_pem, Some(&forged)),
        &exec_request(&marker("forged"), None),
    )
    .await;
    assert!(
        r.is_err(),
        "a certificate from another CA got an HTTP answer: {r:?}"
    );
    assert_not_run(&marker("forged"), "certificate from another CA").await;

    // 4. A cluster-CA certificate of another identity (a node): 403 with kubelet's message.
    let ca = ferry_apiserver::pki::Ca::load(&api_dir).expect("ca");
    let (cert_pem, key_pem) = ca
        .issue(&ferry_apiserver::pki::Leaf::Client {
            user: "system:node:node-sec".into(),
            groups: vec!["system:nodes".into()],
        })
        .expect("node cert");
    let node_cert = ClientCert { cert_pem, key_pem };
    let resp = https(
        ep,
        client_config(&ca_pem, Some(&node_cert)),
        &exec_request(&marker("node"), Some(&admin_token)),
    )
    .await
    .expect("response");
    assert_eq!(status_line(&resp), "HTTP/1.1 403 Forbidden", "{resp}");
    assert!(
        resp.contains(
            "Forbidden (user=system:node:node-sec, verb=get, resource=nodes, subresource(s)=[proxy])"
        ),
        "{resp}"
    );
    assert_not_run(&marker("node"), "node certificate").await;

    // Positive controls: the API server's kubelet client certificate may exec directly...
    let apiserver_cert = ClientCert {
        cert_pem: std::fs::read_to_string(api_dir.join("pki/apiserver-kubelet-client.crt"))
            .expect("cert"),
        key_pem: std::fs::read_to_string(api_dir.join("pki/apiserver-kubelet-client.key"))
            .expect("key"),
    };
    let resp = https(
        ep,
        client_config(&ca_pem, Some(&apiserver_cert)),
        &exec_request(&marker("apiserver"), None),
    )
    .await
    .expect("response");
    assert!(resp.starts_with("HTTP/1.1 101"), "{resp}");
    wait_for(&marker("apiserver"), "API server certificate").await;

    // ...and exec through the API server (which authenticates with it) works.
    let via_api = marker("via-api");
    let mut att = pods
        .exec(
            "victim",
            ["touch", via_api.to_str().expect("utf8")],
            &AttachParams::default().stderr(false),
        )
        .await
        .expect("exec through the API server");
    let status = att.take_status().expect("status channel");
    let mut out = String::new();
    att.stdout()
        .expect("stdout")
        .read_to_string(&mut out)
        .await
        .expect("read");
    let status = status.await.expect("exec status");
    assert_eq!(status.status.as_deref(), Some("Success"), "{status:?}");
    att.join().await.expect("join");
    wait_for(&via_api, "exec through the API server").await;

    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(5), done).await;
}
