//! The gRPC client with failover: one lazily connected channel per endpoint, requests on the
//! current one, and which failures move on to the next endpoint ([`Failure`]).

use super::*;

/// How a failed request is treated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Failure {
    /// etcd answered with an error that does not depend on the endpoint.
    Final(StoreError),
    /// The endpoint failed; the request may have been applied.
    Endpoint(String),
    /// The endpoint failed before the request could be applied; safe to retry elsewhere.
    NotSent(String),
}

pub(super) fn classify(status: &tonic::Status) -> Failure {
    use tonic::Code;
    let msg = status.message();
    let lower = msg.to_ascii_lowercase();
    if lower.contains("required revision has been compacted") {
        return Failure::Final(StoreError::Compacted {
            requested: 0,
            compacted: 0,
        });
    }
    if lower.contains("future revision") {
        return Failure::Final(StoreError::FutureRevision(0));
    }
    if lower.contains("request is too large") {
        return Failure::Final(StoreError::TooLarge {
            size: 0,
            limit: crate::MAX_VALUE_BYTES,
        });
    }
    if lower.contains("database space exceeded") {
        // etcd's NOSPACE alarm: nothing was written and no other member takes the write
        // either; answered as kube-apiserver does (500 with etcd's text).
        return Failure::Final(StoreError::WritesRefused(msg.to_string()));
    }
    let not_sent = lower.contains("connect")
        || lower.contains("connection refused")
        || lower.contains("no leader");
    match status.code() {
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Cancelled
        | Code::Unknown
        | Code::ResourceExhausted
        | Code::Aborted => {
            let what = format!("etcd: {:?}: {msg}", status.code());
            if not_sent {
                Failure::NotSent(what)
            } else {
                Failure::Endpoint(what)
            }
        }
        code => Failure::Final(StoreError::Internal(format!("etcd: {code:?}: {msg}"))),
    }
}

pub(super) struct Client {
    pub(super) channels: Vec<Channel>,
    pub(super) urls: Vec<String>,
    pub(super) current: AtomicUsize,
    pub(super) timeout: Duration,
}

impl Client {
    pub(super) fn new(endpoints: &[String], timeout: Duration) -> Result<Client> {
        if endpoints.is_empty() {
            return Err(StoreError::Internal("no etcd endpoints given".into()));
        }
        let mut channels = Vec::new();
        let mut urls = Vec::new();
        for e in endpoints {
            let url = normalize_endpoint(e)?;
            let ep = Endpoint::from_shared(url.clone())
                .map_err(|err| StoreError::Internal(format!("etcd endpoint {e}: {err}")))?
                .connect_timeout(Duration::from_secs(2))
                .tcp_nodelay(true)
                .http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_timeout(Duration::from_secs(5));
            channels.push(ep.connect_lazy());
            urls.push(url);
        }
        Ok(Client {
            channels,
            urls,
            current: AtomicUsize::new(0),
            timeout,
        })
    }

    pub(super) fn pick(&self) -> (usize, Channel) {
        let i = self.current.load(Ordering::Relaxed) % self.channels.len();
        (i, self.channels[i].clone())
    }

    /// Moves on from endpoint `i` (if no one else did already).
    pub(super) fn failed(&self, i: usize, why: &str) {
        let next = (i + 1) % self.channels.len();
        if self
            .current
            .compare_exchange(i, next, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
            && self.channels.len() > 1
        {
            tracing::warn!(
                failed = %self.urls[i],
                next = %self.urls[next],
                "etcd endpoint failed ({why}); switching"
            );
        }
    }

    pub(super) async fn call_on<Req, Resp>(
        &self,
        channel: Channel,
        path: &'static str,
        req: Req,
    ) -> std::result::Result<Resp, Failure>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let fut = async move {
            let mut grpc = tonic::client::Grpc::new(channel);
            grpc.ready().await.map_err(|e| {
                Failure::NotSent(format!("etcd: connecting: {e}{}", source_chain(&e)))
            })?;
            let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
            grpc.unary(
                tonic::Request::new(req),
                PathAndQuery::from_static(path),
                codec,
            )
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| classify(&s))
        };
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(Failure::Endpoint(format!(
                "etcd: no answer within {:?}",
                self.timeout
            ))),
        }
    }

    /// One request with failover. `idempotent` requests are retried on every endpoint failure;
    /// others only when they were not sent.
    pub(super) async fn call<Req, Resp>(
        &self,
        path: &'static str,
        req: Req,
        idempotent: bool,
    ) -> Result<Resp>
    where
        Req: prost::Message + Clone + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let attempts = 2 * self.channels.len() + 1;
        let mut last = String::new();
        for attempt in 0..attempts {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(50 * attempt as u64)).await;
            }
            let (i, ch) = self.pick();
            match self.call_on::<Req, Resp>(ch, path, req.clone()).await {
                Ok(r) => return Ok(r),
                Err(Failure::Final(e)) => return Err(e),
                Err(Failure::NotSent(why)) => {
                    self.failed(i, &why);
                    last = why;
                }
                Err(Failure::Endpoint(why)) => {
                    self.failed(i, &why);
                    if !idempotent {
                        return Err(StoreError::Unavailable(why));
                    }
                    last = why;
                }
            }
        }
        Err(StoreError::Unavailable(last))
    }
}

pub(super) fn source_chain(e: &dyn std::error::Error) -> String {
    let mut out = String::new();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

pub(super) fn normalize_endpoint(e: &str) -> Result<String> {
    let e = e.trim();
    if e.starts_with("https://") {
        return Err(StoreError::Internal(format!(
            "etcd endpoint {e}: TLS is not supported yet; use http:// on a trusted network"
        )));
    }
    if e.starts_with("http://") {
        Ok(e.trim_end_matches('/').to_string())
    } else {
        Ok(format!("http://{}", e.trim_end_matches('/')))
    }
}
