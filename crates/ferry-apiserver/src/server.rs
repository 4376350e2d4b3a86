//! The HTTP(S) front: TLS, authentication, routing to discovery, OpenAPI and the REST handlers.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use futures::StreamExt;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::api::{Api, Reply};
use crate::request::{Query, negotiate, parse_resource_path};
use crate::status::ApiError;
use crate::{discovery, watch};

pub type Body = BoxBody<Bytes, Infallible>;

/// Everything a request handler needs.
pub struct Server {
    pub api: Api,
    /// Rebuilt when the served custom kinds change ([`Server::set_openapi`]).
    pub openapi: std::sync::RwLock<Arc<ferry_openapi::OpenApi>>,
    pub token: Option<String>,
    pub ready: AtomicBool,
    /// Readiness checks besides `ready` (`ferry up` adds one per component).
    pub checks: crate::readyz::Checks,
    pub advertise: String,
    /// Authentication, authorization, ServiceAccount tokens, audit.
    pub auth: crate::auth::Auth,
    /// TLS towards node agents (`pods/log`, `pods/exec`): the API server's client certificate
    /// and the CA that agents' serving certificates must chain to.
    pub kubelet_tls: Arc<rustls::ClientConfig>,
    /// How the `proxy` subresources reach pods ([`crate::resourceproxy::PodNetwork`]).
    pub pod_network: std::sync::RwLock<Arc<dyn crate::resourceproxy::PodNetwork>>,
}

fn full(code: u16, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, content_type)
        .body(Full::new(body.into()).boxed())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
}

fn json_response(code: u16, v: &Value) -> Response<Body> {
    full(
        code,
        "application/json",
        serde_json::to_vec(v).unwrap_or_default(),
    )
}

/// An error `Status`, ending in a newline as upstream's serializer writes it
/// (`json.NewEncoder(w).Encode`).
pub fn error_response(e: &ApiError) -> Response<Body> {
    let mut body = serde_json::to_vec(&e.to_status()).unwrap_or_default();
    body.push(b'\n');
    full(e.code, "application/json", body)
}

fn reply_response(r: Reply) -> Response<Body> {
    match r {
        Reply::Json {
            code,
            body,
            content_type,
            warnings,
        } => {
            let mut resp = full(code, content_type, body);
            for w in warnings {
                let text = format!("299 - {}", serde_json::to_string(&w).unwrap_or_default());
                if let Ok(v) = header::HeaderValue::from_str(&text) {
                    resp.headers_mut().append("Warning", v);
                }
            }
            resp
        }
        Reply::Stream { content_type, rx } => {
            let stream = tokio_stream::wrappers::ReceiverStream::new(rx)
                .map(|b| Ok::<_, Infallible>(Frame::data(b)));
            Response::builder()
                .status(StatusCode::OK)
                .header(header::CONTENT_TYPE, content_type)
                .header("Transfer-Encoding", "chunked")
                .body(BodyExt::boxed(StreamBody::new(stream)))
                .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
        }
    }
}

impl Server {
    /// The OpenAPI documents now served.
    pub fn openapi(&self) -> Arc<ferry_openapi::OpenApi> {
        self.openapi
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn pod_network(&self) -> Arc<dyn crate::resourceproxy::PodNetwork> {
        self.pod_network
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Sets how pods are reached (`ferry up` once its pod network exists).
    pub fn set_pod_network(&self, n: Arc<dyn crate::resourceproxy::PodNetwork>) {
        *self.pod_network.write().unwrap_or_else(|e| e.into_inner()) = n;
    }

    pub fn set_openapi(&self, o: ferry_openapi::OpenApi) {
        *self.openapi.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(o);
    }

    pub(crate) fn authorized<B>(&self, req: &Request<B>) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        req.headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|t| crate::secret::token_eq(t.trim().as_bytes(), token.as_bytes()))
    }

    /// Serves one request and records it in the API server's metrics (`/metrics`).
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let content_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let info = crate::metrics::classify(
            req.method().as_str(),
            req.uri().path(),
            req.uri().query(),
            content_type,
            |rp| {
                self.api
                    .resource(&rp.group, &rp.version, &rp.resource)
                    .is_some()
            },
        );
        let metrics = crate::metrics::global();
        let _inflight = metrics.start(&info);
        let long_running = metrics.long_running(&info);
        let started = std::time::Instant::now();
        let resp = self.handle_request(req).await;
        metrics.observe(&info, resp.status().as_u16(), started.elapsed());
        match long_running {
            Some(guard) => resp.map(|b| crate::metrics::Guarded::new(b, guard).boxed()),
            None => resp,
        }
    }

    async fn handle_request(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path().to_string();
        let method = req.method().clone();
        let query = default_field_manager(Query::parse(req.uri().query()), &method, req.headers());
        // Health and version are public, as upstream's system:public-info-viewer allows.
        match path.as_str() {
            "/healthz" | "/livez" => return full(200, "text/plain; charset=utf-8", "ok"),
            p if p == "/readyz" || p.starts_with("/readyz/") => {
                let mut results = vec![("ping".to_string(), Ok(()))];
                results.push((
                    "ferry-ready".to_string(),
                    if self.ready.load(Ordering::SeqCst) {
                        Ok(())
                    } else {
                        Err(crate::readyz::NotReady("not ready".into()))
                    },
                ));
                results.extend(self.checks.run());
                let only = p.strip_prefix("/readyz/").filter(|n| !n.is_empty());
                let (code, body) = crate::readyz::render(&results, only, req.uri().query());
                return full(code, "text/plain; charset=utf-8", body);
            }
            "/version" => return json_response(200, &discovery::version()),
            _ => {}
        }
        let req = match crate::auth::admit(&self, req).await {
            Ok(req) => req,
            Err(resp) => return resp,
        };
        let accept = req
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let content_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json")
            .to_string();
        match (method.clone(), path.as_str()) {
            (Method::GET, "/metrics") => {
                return full(
                    200,
                    "text/plain; version=0.0.4; charset=utf-8",
                    crate::metrics::with_families(
                        crate::metrics::global().render(),
                        &crate::metrics::render_cache(&self.api.cache),
                    ),
                );
            }
            (Method::GET, "/api" | "/api/") => {
                return match discovery::aggregated_version(&accept) {
                    Some(v) => full(
                        200,
                        &format!(
                            "application/json;g=apidiscovery.k8s.io;v={v};as=APIGroupDiscoveryList"
                        ),
                        serde_json::to_vec(&discovery::aggregated(true, v)).unwrap_or_default(),
                    ),
                    None => json_response(200, &discovery::api_versions(&self.advertise)),
                };
            }
            (Method::GET, "/apis" | "/apis/") => {
                return match discovery::aggregated_version(&accept) {
                    Some(v) => full(
                        200,
                        &format!(
                            "application/json;g=apidiscovery.k8s.io;v={v};as=APIGroupDiscoveryList"
                        ),
                        serde_json::to_vec(&discovery::aggregated(false, v)).unwrap_or_default(),
                    ),
                    None => json_response(200, &discovery::api_group_list()),
                };
            }
            (Method::GET, "/api/v1") => {
                return json_response(200, &discovery::api_resource_list("", "v1"));
            }
            (Method::GET, "/openapi/v3") | (Method::GET, "/openapi/v3/") => {
                return full(
                    200,
                    "application/json",
                    Bytes::copy_from_slice(self.openapi().v3_index()),
                );
            }
            (Method::GET, "/openapi/v2") | (Method::GET, "/swagger-2.0.0.pb-v1") => {
                let openapi = self.openapi();
                let mut resp = if accept.contains("protobuf") || path.ends_with("pb-v1") {
                    full(
                        200,
                        "application/octet-stream",
                        Bytes::copy_from_slice(openapi.v2_protobuf()),
                    )
                } else {
                    full(
                        200,
                        "application/json",
                        Bytes::copy_from_slice(openapi.v2_json()),
                    )
                };
                if let Ok(v) = header::HeaderValue::from_str(&format!("\"{}\"", openapi.v2_etag()))
                {
                    resp.headers_mut().insert(header::ETAG, v);
                }
                return resp;
            }
            _ => {}
        }
        if method == Method::GET
            && let Some(gv) = path.strip_prefix("/openapi/v3/")
        {
            let openapi = self.openapi();
            return match openapi.v3_document(gv) {
                Some((doc, hash)) => {
                    let mut resp = full(200, "application/json", Bytes::copy_from_slice(doc));
                    let immutable = query.get("hash") == Some(hash);
                    let cc = if immutable {
                        "public, immutable"
                    } else {
                        "no-cache, private"
                    };
                    resp.headers_mut()
                        .insert(header::CACHE_CONTROL, header::HeaderValue::from_static(cc));
                    if let Ok(v) = header::HeaderValue::from_str(&format!("\"{hash}\"")) {
                        resp.headers_mut().insert(header::ETAG, v);
                    }
                    resp
                }
                None => error_response(&ApiError::not_found_path()),
            };
        }
        // /apis/<group> and /apis/<group>/<version>
        if method == Method::GET {
            let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
            match segs.as_slice() {
                ["apis", g] => {
                    return if discovery::has_group(g) {
                        json_response(200, &discovery::api_group(g))
                    } else {
                        error_response(&ApiError::not_found_path())
                    };
                }
                ["apis", g, v] => {
                    return if discovery::has_group_version(g, v) {
                        json_response(200, &discovery::api_resource_list(g, v))
                    } else {
                        error_response(&ApiError::not_found_path())
                    };
                }
                _ => {}
            }
        }
        // pods/proxy, services/proxy, nodes/proxy: any method, any path below `proxy`.
        if let Some(pp) = crate::resourceproxy::location::ProxyPath::parse(&path) {
            return crate::resourceproxy::handle(self.clone(), req, &pp).await;
        }
        let Some(rp) = parse_resource_path(&path) else {
            return error_response(&ApiError::not_found_path());
        };
        let Some(res) = self
            .api
            .resource(&rp.group, &rp.version, &rp.resource)
            .cloned()
            .or_else(|| self.api.crds.resource(&rp.group, &rp.version, &rp.resource))
        else {
            return error_response(&ApiError::not_found_path());
        };
        if rp.namespace.is_some() && !res.info().namespaced {
            return error_response(&ApiError::not_found_path());
        }
        // pods/log, exec, attach and portforward are proxied to the pod's node agent.
        if rp.group.is_empty()
            && rp.resource == "pods"
            && rp.name.is_some()
            && matches!(
                rp.subresource.as_deref(),
                Some("log" | "exec" | "attach" | "portforward")
            )
        {
            return crate::podproxy::handle(self.clone(), req, &rp).await;
        }
        let want = match negotiate(&accept) {
            Ok(w) => w,
            Err(e) => return error_response(&e),
        };
        let who = crate::auth::escalation::Who::of(&req);
        // Read the body for writes.
        let body_bytes = if matches!(
            method,
            Method::POST | Method::PUT | Method::PATCH | Method::DELETE
        ) {
            let declared = crate::body::content_length(req.headers());
            match crate::body::read_limited(req.into_body(), declared).await {
                Ok(b) => b,
                Err(e) => return error_response(&e),
            }
        } else {
            Bytes::new()
        };
        if let Err(e) = crate::auth::escalation::check(
            &self,
            &who,
            &res,
            &rp,
            &method,
            &content_type,
            &body_bytes,
        )
        .await
        {
            return error_response(&e);
        }
        if let Err(e) = crate::admission::node_restriction(
            &self.api,
            &who,
            &res,
            &rp,
            &method,
            &content_type,
            &body_bytes,
        )
        .await
        {
            return error_response(&e);
        }
        // Lists and watches encode PartialObjectMetadata themselves; every single-object
        // answer (get, create, update, patch, delete, subresources) is cut here.
        let single = rp.name.is_some() || method == Method::POST;
        let info = res.info();
        let result = self
            .dispatch(res, rp, &query, want, &method, &content_type, body_bytes)
            .await
            .and_then(|r| {
                if single {
                    crate::metadata::object_reply(r, want, info.group, info.kind)
                } else {
                    Ok(r)
                }
            });
        match result {
            Ok(r) => reply_response(r),
            Err(e) => error_response(&e),
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn dispatch(
        &self,
        res: Arc<crate::api::Resource>,
        rp: crate::request::ResourcePath,
        q: &Query,
        want: crate::request::Want,
        method: &Method,
        content_type: &str,
        body: Bytes,
    ) -> Result<Reply, ApiError> {
        let api = &self.api;
        let sub = rp.subresource.as_deref();
        if let Some(s) = sub
            && !(s == "status" && res.info().status_subresource
                || s == "scale" && res.info().scale_subresource
                || res.rest().subresources().contains(&s))
        {
            return Err(ApiError::not_found_path());
        }
        match (method, rp.name.is_some()) {
            (&Method::GET, false) => {
                if q.flag("watch") {
                    watch::watch(api, res, &rp, q, want).await
                } else {
                    api.list(&res, &rp, q, want).await
                }
            }
            (&Method::GET, true) if !matches!(sub, Some("binding" | "eviction")) => {
                api.get(&res, &rp, q, want).await
            }
            (&Method::POST, true) if sub == Some("eviction") => {
                let v = crate::body::decode(content_type, &body)?;
                crate::eviction::evict(api, &rp, q, v).await
            }
            (&Method::POST, true) if sub == Some("binding") => {
                let v = crate::body::decode(content_type, &body)?;
                api.bind_pod(&res, &rp, q, v).await
            }
            (&Method::POST, false) if api.crds.is_terminating(&res) => {
                Err(crate::crd::Registry::terminating_error())
            }
            (&Method::POST, false) => {
                let dups = crate::api::duplicate_fields(&res, q, content_type, &body)?;
                let v = crate::body::decode(content_type, &body)?;
                Ok(api.create(&res, &rp, q, v).await?.add_warnings(dups))
            }
            (&Method::PUT, true) => {
                let dups = crate::api::duplicate_fields(&res, q, content_type, &body)?;
                let v = crate::body::decode(content_type, &body)?;
                match sub {
                    Some("scale") => api.update_scale(&res, &rp, q, v).await,
                    Some("finalize") => api.finalize_namespace(&res, &rp, q, v).await,
                    _ => Ok(api.update(&res, &rp, q, v).await?.add_warnings(dups)),
                }
            }
            (&Method::PATCH, true) => api.patch(&res, &rp, q, content_type, &body).await,
            (&Method::DELETE, true) => {
                let v = delete_body(content_type, &body)?;
                api.delete(&res, &rp, q, v).await
            }
            (&Method::DELETE, false) => {
                let v = delete_body(content_type, &body)?;
                api.delete_collection(&res, &rp, q, v).await
            }
            _ => Err(ApiError::method_not_allowed()),
        }
    }
}

/// A write without `fieldManager` is recorded under the User-Agent's first segment, as upstream
/// does (`OpenAPI-Generator` for the Python client, `kubectl` for an old kubectl): printable
/// characters only, at most 128. Apply patches must still name their manager.
fn default_field_manager(mut q: Query, method: &Method, headers: &http::HeaderMap) -> Query {
    if !matches!(*method, Method::POST | Method::PUT | Method::PATCH)
        || q.get("fieldManager").is_some_and(|m| !m.is_empty())
    {
        return q;
    }
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if ct.starts_with("application/apply-patch") {
        return q;
    }
    let ua = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let manager: String = ua
        .split('/')
        .next()
        .unwrap_or("")
        .chars()
        .filter(|c| !c.is_control())
        .take(128)
        .collect();
    if !manager.is_empty() {
        q.set("fieldManager", &manager);
    }
    q
}

fn delete_body(content_type: &str, body: &[u8]) -> Result<Option<Value>, ApiError> {
    if body.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(None);
    }
    crate::body::decode(content_type, body).map(Some)
}

/// Serves connections on `listener` until `shutdown` is cancelled.
pub async fn serve(
    server: Arc<Server>,
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    limit: ferry_limits::ConnLimiter,
    shutdown: CancellationToken,
) {
    static FULL: ferry_limits::LogLimiter =
        ferry_limits::LogLimiter::new(3, std::time::Duration::from_secs(10));
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut accept = ferry_limits::Acceptor::new("apiserver");
    loop {
        // A connection slot first: at the cap, clients wait in the listen queue.
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            p = limit.acquire(|l| if let Some(suppressed) = FULL.check() {
                tracing::warn!(cap = l.capacity(), suppressed,
                    "API server connection limit reached; new connections wait");
            }) => p,
        };
        // Accept errors (out of descriptors) back off instead of spinning.
        let (stream, peer): (tokio::net::TcpStream, SocketAddr) = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = accept.accept(&listener) => r,
        };
        let _ = stream.set_nodelay(true);
        let server = server.clone();
        let acceptor = acceptor.clone();
        let peer_user = Arc::new(std::sync::OnceLock::<crate::auth::PeerUser>::new());
        let conn_user = peer_user.clone();
        let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
            let server = server.clone();
            req.extensions_mut().insert(crate::auth::PeerAddr(peer));
            if let Some(u) = conn_user.get() {
                req.extensions_mut().insert(u.clone());
            }
            async move { Ok::<_, Infallible>(server.handle(req).await) }
        });
        let builder =
            hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
        match acceptor {
            Some(acceptor) => {
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    let _permit = permit;
                    let tls = match acceptor.accept(stream).await {
                        Ok(t) => t,
                        Err(e) => {
                            tracing::debug!("TLS handshake with {peer} failed: {e}");
                            return;
                        }
                    };
                    if let Some(u) = crate::auth::certs::peer_user(&tls) {
                        let _ = peer_user.set(u);
                    }
                    let conn = builder
                        .serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(tls), svc)
                        .into_owned();
                    let _ = watcher.watch(conn).await;
                });
            }
            None => {
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    let _permit = permit;
                    let conn = builder
                        .serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(stream), svc)
                        .into_owned();
                    let _ = watcher.watch(conn).await;
                });
            }
        }
    }
    // Give in-flight requests a moment; watches are cut.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), graceful.shutdown()).await;
}
