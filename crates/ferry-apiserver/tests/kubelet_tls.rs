//! Issue 14, finding 4: for `pods/log` and `pods/exec` the API server used to send its admin
//! bearer token over plain HTTP to whatever address a Node advertises. Now it speaks TLS only,
//! authenticates with its kubelet client certificate, verifies the agent's serving certificate
//! against the cluster CA, and never sends an Authorization header. Fake agents capture what
//! arrives.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// What a fake agent saw on one connection.
#[derive(Debug)]
enum Seen {
    /// A request head, and the client certificate (DER) presented.
    Request {
        head: String,
        client_cert: Option<Vec<u8>>,
    },
    /// The TLS handshake failed.
    Handshake(String),
    /// Raw bytes received by a plain TCP listener.
    Raw(Vec<u8>),
}

fn server_config(
    cert_pem: &str,
    key_pem: &str,
    client_ca: Option<&str>,
) -> Arc<rustls::ServerConfig> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .expect("certs");
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).expect("key");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let b = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("versions");
    let b = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
                roots.add(c.expect("ca")).expect("ca");
            }
            b.with_client_cert_verifier(
                rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .expect("verifier"),
            )
        }
        None => b.with_no_client_auth(),
    };
    Arc::new(b.with_single_cert(certs, key).expect("server config"))
}

async fn read_head<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> String {
    let mut buf = Vec::new();
    let mut b = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut b).await {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&b[..n]),
        }
    }
    String::from_utf8_lossy(&buf).to_string()
}

/// A fake agent over TLS: answers every request with `hello from the agent`.
async fn fake_tls_agent(
    cfg: Arc<rustls::ServerConfig>,
) -> (SocketAddr, mpsc::UnboundedReceiver<Seen>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    let (tx, rx) = mpsc::unbounded_channel();
    let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let tx = tx.clone();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let mut tls = match acceptor.accept(s).await {
                    Ok(t) => t,
                    Err(e) => {
                        let _ = tx.send(Seen::Handshake(e.to_string()));
                        return;
                    }
                };
                let client_cert = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .map(|c| c.to_vec());
                let head = read_head(&mut tls).await;
                let _ = tx.send(Seen::Request { head, client_cert });
                let body = "hello from the agent\n";
                let _ = tls
                    .write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
                             Connection: close\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (addr, rx)
}

/// A plain TCP listener (the old, plain-HTTP agent): records the first bytes and closes.
async fn fake_plain_agent() -> (SocketAddr, mpsc::UnboundedReceiver<Seen>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let mut buf = vec![0u8; 4096];
            let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or(0);
            buf.truncate(n);
            let _ = tx.send(Seen::Raw(buf));
        }
    });
    (addr, rx)
}

/// One HTTP/1.1 request to the (plain-HTTP) API server: (status code, body).
async fn call(
    api: SocketAddr,
    token: &str,
    method: &str,
    path: &str,
    ctype: &str,
    body: &str,
) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(api).await.expect("connect");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out))
        .await
        .expect("response in time")
        .expect("read");
    let text = String::from_utf8_lossy(&out).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    (code, body)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

async fn node_and_pod(api: SocketAddr, token: &str, node: &str, agent: SocketAddr) {
    let (code, body) = call(
        api,
        token,
        "POST",
        "/api/v1/nodes",
        "application/json",
        &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}).to_string(),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let status = json!({"status": {
        "addresses": [{"type": "InternalIP", "address": agent.ip().to_string()}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": agent.port()}}}});
    let (code, body) = call(
        api,
        token,
        "PATCH",
        &format!("/api/v1/nodes/{node}/status"),
        "application/merge-patch+json",
        &status.to_string(),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": format!("pod-{node}")},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}});
    let (code, body) = call(
        api,
        token,
        "POST",
        "/api/v1/namespaces/default/pods",
        "application/json",
        &pod.to_string(),
    )
    .await;
    assert_eq!(code, 201, "{body}");
}

fn der_of(pem_file: &Path) -> Vec<u8> {
    let pem = std::fs::read(pem_file).expect("pem");
    CertificateDer::pem_slice_iter(&pem)
        .next()
        .expect("one certificate")
        .expect("pem")
        .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_go_to_agents_over_verified_tls_with_the_client_certificate_and_no_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(
        ferry_store::redb_store::RedbStore::open(&dir.path().join("store.redb")).expect("store"),
    );
    let stop = CancellationToken::new();
    let data = dir.path().join("api");
    let running = ferry_apiserver::start(
        ferry_apiserver::Config {
            data_dir: data.clone(),
            plain_http: true,
            ..Default::default()
        },
        store,
        stop.clone(),
    )
    .await
    .expect("apiserver");
    let api = running.addr;
    let token = std::fs::read_to_string(data.join("pki/admin.token"))
        .expect("token")
        .trim()
        .to_string();
    let ca_pem = std::fs::read_to_string(data.join("pki/ca.crt")).expect("ca");

    // A genuine agent: serving certificate from the cluster CA, client certificates required.
    let tls = ferry_apiserver::pki::issue_agent_serving(
        &data,
        "good",
        &["127.0.0.1".parse().expect("ip")],
    )
    .expect("agent certificate");
    let good_cfg = server_config(
        &std::fs::read_to_string(&tls.cert_file).expect("crt"),
        &std::fs::read_to_string(&tls.key_file).expect("key"),
        Some(&ca_pem),
    );
    let (good, mut good_seen) = fake_tls_agent(good_cfg).await;
    node_and_pod(api, &token, "good", good).await;
    let (code, body) = call(
        api,
        &token,
        "GET",
        "/api/v1/namespaces/default/pods/pod-good/log?tailLines=5",
        "application/json",
        "",
    )
    .await;
    assert_eq!((code, body.as_str()), (200, "hello from the agent\n"));
    let Some(Seen::Request { head, client_cert }) = good_seen.recv().await else {
        panic!("the agent saw no request");
    };
    assert!(
        head.starts_with("GET /containerLogs/default/pod-good/c?tailLines=5 HTTP/1.1\r\n"),
        "{head}"
    );
    assert!(
        !head.to_ascii_lowercase().contains("authorization"),
        "the API server sent credentials to the agent:\n{head}"
    );
    assert!(!head.contains(&token), "the admin token reached the agent");
    assert_eq!(
        client_cert.as_deref(),
        Some(der_of(&data.join("pki/apiserver-kubelet-client.crt")).as_slice()),
        "the API server must authenticate with its kubelet client certificate"
    );

    // An impostor: a Node advertising an agent whose certificate the cluster CA did not issue.
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .expect("params")
        .self_signed(&key)
        .expect("self-signed");
    let (bad, mut bad_seen) =
        fake_tls_agent(server_config(&cert.pem(), &key.serialize_pem(), None)).await;
    node_and_pod(api, &token, "bad", bad).await;
    let (code, body) = call(
        api,
        &token,
        "GET",
        "/api/v1/namespaces/default/pods/pod-bad/log",
        "application/json",
        "",
    )
    .await;
    assert!(code >= 500, "{code} {body}");
    assert!(body.contains("certificate"), "{body}");
    match bad_seen.recv().await {
        Some(Seen::Handshake(e)) => eprintln!("impostor's handshake failed as it should: {e}"),
        other => panic!("the impostor got past the handshake: {other:?}"),
    }

    // The old plain-HTTP agent: what arrives is a TLS ClientHello, never a token.
    let (plain, mut plain_seen) = fake_plain_agent().await;
    node_and_pod(api, &token, "plain", plain).await;
    let (code, body) = call(
        api,
        &token,
        "GET",
        "/api/v1/namespaces/default/pods/pod-plain/exec?command=id&stdout=true",
        "application/json",
        "",
    )
    .await;
    assert!(code >= 400, "{code} {body}");
    let Some(Seen::Raw(bytes)) = plain_seen.recv().await else {
        panic!("nothing reached the plain listener");
    };
    assert_eq!(bytes.first(), Some(&0x16), "not a TLS handshake: {bytes:?}");
    let text = String::from_utf8_lossy(&bytes);
    assert!(!text.contains(&token) && !text.to_ascii_lowercase().contains("authorization"));

    stop.cancel();
}
