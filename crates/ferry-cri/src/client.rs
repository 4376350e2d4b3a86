//! The CRI v1 client: RuntimeService and ImageService over a unix socket, with tonic's generic
//! client and a prost codec (no generated stubs).

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::uri::PathAndQuery;
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::error::{CriError, Op};
use crate::pb;

/// The CRI API version a kubelet announces in `Version`.
pub const CRI_API_VERSION: &str = "v1";

/// Dials the runtime's unix socket for every connection tonic opens.
#[derive(Clone)]
struct UnixConnector(PathBuf);

impl tower_service::Service<Uri> for UnixConnector {
    type Response = TokioIo<tokio::net::UnixStream>;
    type Error = std::io::Error;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let path = self.0.clone();
        Box::pin(async move {
            let s = tokio::net::UnixStream::connect(path).await?;
            Ok(TokioIo::new(s))
        })
    }
}

/// Parses `unix:///run/x.sock` or a bare path.
pub fn socket_path(endpoint: &str) -> PathBuf {
    PathBuf::from(endpoint.strip_prefix("unix://").unwrap_or(endpoint))
}

/// A CRI client. Cheap to clone; connects lazily and reconnects after the runtime restarts.
#[derive(Clone)]
pub struct CriClient {
    channel: Channel,
    socket: PathBuf,
    /// Deadline of ordinary calls (not PullImage or ExecSync, which have their own).
    pub timeout: Duration,
    /// Deadline of PullImage.
    pub pull_timeout: Duration,
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

impl CriClient {
    /// A client for the runtime at `endpoint` (`unix:///path` or a path).
    pub fn new(endpoint: &str) -> CriClient {
        let socket = socket_path(endpoint);
        // The URI is not dialled: the connector opens the socket.
        let channel = Endpoint::from_static("http://localhost")
            .connect_timeout(Duration::from_secs(5))
            .connect_with_connector_lazy(UnixConnector(socket.clone()));
        CriClient {
            channel,
            socket,
            timeout: Duration::from_secs(120),
            pull_timeout: Duration::from_secs(600),
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    async fn call<Req, Resp>(&self, op: Op, req: Req, timeout: Duration) -> Result<Resp, CriError>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let fut = async {
            let mut grpc = tonic::client::Grpc::new(self.channel.clone());
            grpc.ready()
                .await
                .map_err(|e| CriError::transport(op, source_chain(&e)))?;
            let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
            grpc.unary(
                tonic::Request::new(req),
                PathAndQuery::from_static(op.path()),
                codec,
            )
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| CriError::from_status(op, &s))
        };
        match tokio::time::timeout(timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(CriError::timeout(op, timeout)),
        }
    }

    // ---- RuntimeService ----

    pub async fn version(&self) -> Result<pb::VersionResponse, CriError> {
        let req = pb::VersionRequest {
            version: CRI_API_VERSION.into(),
        };
        self.call(Op::Version, req, self.timeout).await
    }

    /// Polls `Version` until it answers or `deadline` passes (the last error is returned).
    pub async fn wait_ready(&self, deadline: Duration) -> Result<pb::VersionResponse, CriError> {
        let end = tokio::time::Instant::now() + deadline;
        let mut delay = Duration::from_millis(20);
        loop {
            let attempt = tokio::time::timeout(Duration::from_secs(5), self.version()).await;
            let err = match attempt {
                Ok(Ok(v)) => return Ok(v),
                // The socket answers but has no CRI: the plugin failed to load; retrying won't help.
                Ok(Err(e)) if e.kind == crate::ErrorKind::Unimplemented => return Err(e),
                Ok(Err(e)) => e,
                Err(_) => CriError::timeout(Op::Version, Duration::from_secs(5)),
            };
            if tokio::time::Instant::now() + delay >= end {
                return Err(err);
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(500));
        }
    }

    pub async fn run_pod_sandbox(
        &self,
        config: pb::PodSandboxConfig,
        runtime_handler: &str,
    ) -> Result<String, CriError> {
        let req = pb::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: runtime_handler.into(),
        };
        let resp: pb::RunPodSandboxResponse =
            self.call(Op::RunPodSandbox, req, self.timeout).await?;
        Ok(resp.pod_sandbox_id)
    }

    pub async fn stop_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let req = pb::PodSandboxIdRequest {
            pod_sandbox_id: id.into(),
        };
        let _: pb::Empty = self.call(Op::StopPodSandbox, req, self.timeout).await?;
        Ok(())
    }

    pub async fn remove_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let req = pb::PodSandboxIdRequest {
            pod_sandbox_id: id.into(),
        };
        let _: pb::Empty = self.call(Op::RemovePodSandbox, req, self.timeout).await?;
        Ok(())
    }

    pub async fn pod_sandbox_status(
        &self,
        id: &str,
        verbose: bool,
    ) -> Result<pb::PodSandboxStatusResponse, CriError> {
        let req = pb::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose,
        };
        self.call(Op::PodSandboxStatus, req, self.timeout).await
    }

    pub async fn list_pod_sandbox(
        &self,
        filter: Option<pb::PodSandboxFilter>,
    ) -> Result<Vec<pb::PodSandbox>, CriError> {
        let req = pb::ListPodSandboxRequest { filter };
        let resp: pb::ListPodSandboxResponse =
            self.call(Op::ListPodSandbox, req, self.timeout).await?;
        Ok(resp.items)
    }

    pub async fn create_container(
        &self,
        pod_sandbox_id: &str,
        config: pb::ContainerConfig,
        sandbox_config: pb::PodSandboxConfig,
    ) -> Result<String, CriError> {
        let req = pb::CreateContainerRequest {
            pod_sandbox_id: pod_sandbox_id.into(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        let resp: pb::CreateContainerResponse =
            self.call(Op::CreateContainer, req, self.timeout).await?;
        Ok(resp.container_id)
    }

    pub async fn start_container(&self, id: &str) -> Result<(), CriError> {
        let req = pb::ContainerIdRequest {
            container_id: id.into(),
        };
        let _: pb::Empty = self.call(Op::StartContainer, req, self.timeout).await?;
        Ok(())
    }

    /// Stops with `grace` before the runtime kills (CRI's timeout is whole seconds).
    pub async fn stop_container(&self, id: &str, grace: Duration) -> Result<(), CriError> {
        let req = pb::StopContainerRequest {
            container_id: id.into(),
            timeout: i64::try_from(grace.as_secs()).unwrap_or(i64::MAX),
        };
        let _: pb::Empty = self
            .call(Op::StopContainer, req, self.timeout + grace)
            .await?;
        Ok(())
    }

    pub async fn remove_container(&self, id: &str) -> Result<(), CriError> {
        let req = pb::ContainerIdRequest {
            container_id: id.into(),
        };
        let _: pb::Empty = self.call(Op::RemoveContainer, req, self.timeout).await?;
        Ok(())
    }

    pub async fn list_containers(
        &self,
        filter: Option<pb::ContainerFilter>,
    ) -> Result<Vec<pb::Container>, CriError> {
        let req = pb::ListContainersRequest { filter };
        let resp: pb::ListContainersResponse =
            self.call(Op::ListContainers, req, self.timeout).await?;
        Ok(resp.containers)
    }

    pub async fn container_status(
        &self,
        id: &str,
        verbose: bool,
    ) -> Result<pb::ContainerStatusResponse, CriError> {
        let req = pb::ContainerStatusRequest {
            container_id: id.into(),
            verbose,
        };
        self.call(Op::ContainerStatus, req, self.timeout).await
    }

    /// Polls `ContainerStatus` every `interval` until the container has exited (what a PLEG
    /// relist does; containerd 1.6 has no `GetContainerEvents`). Returns the final status:
    /// `exit_code`, `reason` ("OOMKilled", "Completed", "Error"), `finished_at`.
    pub async fn wait_container_exit(
        &self,
        id: &str,
        interval: Duration,
    ) -> Result<pb::ContainerStatus, CriError> {
        loop {
            let st = self
                .container_status(id, false)
                .await?
                .status
                .unwrap_or_default();
            if st.state == pb::ContainerState::ContainerExited as i32 {
                return Ok(st);
            }
            tokio::time::sleep(interval).await;
        }
    }

    /// Runs `cmd` in the container; `timeout` zero means no limit (CRI semantics).
    pub async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<pb::ExecSyncResponse, CriError> {
        let secs = timeout.as_secs().max(u64::from(!timeout.is_zero()));
        let req = pb::ExecSyncRequest {
            container_id: id.into(),
            cmd,
            timeout: i64::try_from(secs).unwrap_or(i64::MAX),
        };
        let deadline = if timeout.is_zero() {
            Duration::from_secs(24 * 3600)
        } else {
            timeout + self.timeout
        };
        self.call(Op::ExecSync, req, deadline).await
    }

    /// Prepares an exec session; returns the streaming server's URL.
    pub async fn exec(&self, req: pb::ExecRequest) -> Result<String, CriError> {
        let resp: pb::StreamUrlResponse = self.call(Op::Exec, req, self.timeout).await?;
        Ok(resp.url)
    }

    /// Prepares an attach session; returns the streaming server's URL.
    pub async fn attach(&self, req: pb::AttachRequest) -> Result<String, CriError> {
        let resp: pb::StreamUrlResponse = self.call(Op::Attach, req, self.timeout).await?;
        Ok(resp.url)
    }

    /// Prepares a port-forward session; returns the streaming server's URL.
    pub async fn port_forward(&self, sandbox_id: &str, ports: &[u16]) -> Result<String, CriError> {
        let req = pb::PortForwardRequest {
            pod_sandbox_id: sandbox_id.into(),
            port: ports.iter().map(|p| i32::from(*p)).collect(),
        };
        let resp: pb::StreamUrlResponse = self.call(Op::PortForward, req, self.timeout).await?;
        Ok(resp.url)
    }

    pub async fn container_stats(&self, id: &str) -> Result<pb::ContainerStats, CriError> {
        let req = pb::ContainerIdRequest {
            container_id: id.into(),
        };
        let resp: pb::ContainerStatsResponse =
            self.call(Op::ContainerStats, req, self.timeout).await?;
        Ok(resp.stats.unwrap_or_default())
    }

    pub async fn list_container_stats(
        &self,
        filter: Option<pb::ContainerStatsFilter>,
    ) -> Result<Vec<pb::ContainerStats>, CriError> {
        let req = pb::ListContainerStatsRequest { filter };
        let resp: pb::ListContainerStatsResponse =
            self.call(Op::ListContainerStats, req, self.timeout).await?;
        Ok(resp.stats)
    }

    // ---- ImageService ----

    pub async fn list_images(&self) -> Result<Vec<pb::Image>, CriError> {
        let req = pb::ListImagesRequest { filter: None };
        let resp: pb::ListImagesResponse = self.call(Op::ListImages, req, self.timeout).await?;
        Ok(resp.images)
    }

    /// The image, or None when the runtime does not have it.
    pub async fn image_status(&self, image: &str) -> Result<Option<pb::Image>, CriError> {
        let req = pb::ImageStatusRequest {
            image: Some(image_spec(image)),
            verbose: false,
        };
        let resp: pb::ImageStatusResponse = self.call(Op::ImageStatus, req, self.timeout).await?;
        Ok(resp.image)
    }

    /// Pulls `image`; returns the image reference (its id) the runtime reports.
    pub async fn pull_image(
        &self,
        image: &str,
        auth: Option<pb::AuthConfig>,
        sandbox_config: Option<pb::PodSandboxConfig>,
    ) -> Result<String, CriError> {
        let req = pb::PullImageRequest {
            image: Some(image_spec(image)),
            auth,
            sandbox_config,
        };
        let resp: pb::PullImageResponse = self.call(Op::PullImage, req, self.pull_timeout).await?;
        Ok(resp.image_ref)
    }

    pub async fn remove_image(&self, image: &str) -> Result<(), CriError> {
        let req = pb::RemoveImageRequest {
            image: Some(image_spec(image)),
        };
        let _: pb::Empty = self.call(Op::RemoveImage, req, self.timeout).await?;
        Ok(())
    }

    pub async fn image_fs_info(&self) -> Result<pb::ImageFsInfoResponse, CriError> {
        self.call(Op::ImageFsInfo, pb::Empty {}, self.timeout).await
    }
}

/// An `ImageSpec` naming `image` (a reference or an image id).
pub fn image_spec(image: &str) -> pb::ImageSpec {
    pb::ImageSpec {
        image: image.into(),
        user_specified_image: image.into(),
        ..Default::default()
    }
}

/// A CRI `AuthConfig` with a user name and password (what kubelet builds from a
/// `kubernetes.io/dockerconfigjson` pull secret). `server` is the registry as pull secrets
/// name it (`host[:port]`, optionally with a scheme and path).
pub fn basic_auth(server: &str, username: &str, password: &str) -> pb::AuthConfig {
    pb::AuthConfig {
        username: username.into(),
        password: password.into(),
        server_address: auth_server_address(server),
        ..Default::default()
    }
}

/// containerd matches `AuthConfig.server_address` by parsing it as a URL and comparing its
/// host with the registry's: a bare `host:port` does not parse as a URL, so a scheme is added
/// (the scheme itself is not compared). Empty stays empty (credentials for any registry).
pub fn auth_server_address(server: &str) -> String {
    let s = server.trim();
    if s.is_empty() || s.contains("://") {
        s.to_string()
    } else {
        format!("https://{s}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn socket_paths() {
        assert_eq!(
            socket_path("unix:///run/ferry/containerd.sock"),
            PathBuf::from("/run/ferry/containerd.sock")
        );
        assert_eq!(socket_path("/tmp/x.sock"), PathBuf::from("/tmp/x.sock"));
    }

    /// Field numbers and wire types, checked against protobuf encodings worked out by hand.
    #[test]
    fn wire_layout() {
        let req = pb::ExecSyncRequest {
            container_id: "c".into(),
            cmd: vec!["ls".into()],
            timeout: 3,
        };
        assert_eq!(req.encode_to_vec(), b"\x0a\x01c\x12\x02ls\x18\x03".to_vec());
        let st = pb::ContainerStatus {
            reason: "OOMKilled".into(),
            exit_code: 137,
            ..Default::default()
        };
        let bytes = st.encode_to_vec();
        // exit_code = 7 (varint), reason = 10 (length-delimited).
        assert_eq!(&bytes[..3], b"\x38\x89\x01");
        assert_eq!(&bytes[3..5], b"\x52\x09");
        let auth = basic_auth("http://r:5", "u", "p");
        assert_eq!(
            auth.encode_to_vec(),
            b"\x0a\x01u\x12\x01p\x22\x0ahttp://r:5".to_vec()
        );
    }

    #[test]
    fn auth_server_addresses() {
        let cases = [
            ("127.0.0.1:5001", "https://127.0.0.1:5001"),
            ("http://127.0.0.1:5001", "http://127.0.0.1:5001"),
            ("https://index.docker.io/v1/", "https://index.docker.io/v1/"),
            ("", ""),
        ];
        for (input, want) in cases {
            assert_eq!(auth_server_address(input), want, "{input}");
        }
    }
}
