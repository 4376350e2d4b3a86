//! Typed CRI errors: which call failed, the gRPC code class, and the reason a kubelet would
//! report for it (`ErrImagePull`, `CreateContainerError`, …).

use std::fmt;

/// The CRI call that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Version,
    RunPodSandbox,
    StopPodSandbox,
    RemovePodSandbox,
    PodSandboxStatus,
    ListPodSandbox,
    CreateContainer,
    StartContainer,
    StopContainer,
    RemoveContainer,
    ListContainers,
    ContainerStatus,
    ExecSync,
    Exec,
    Attach,
    PortForward,
    ContainerStats,
    ListContainerStats,
    ListImages,
    ImageStatus,
    PullImage,
    RemoveImage,
    ImageFsInfo,
}

impl Op {
    /// The gRPC method path.
    pub fn path(self) -> &'static str {
        match self {
            Op::Version => "/runtime.v1.RuntimeService/Version",
            Op::RunPodSandbox => "/runtime.v1.RuntimeService/RunPodSandbox",
            Op::StopPodSandbox => "/runtime.v1.RuntimeService/StopPodSandbox",
            Op::RemovePodSandbox => "/runtime.v1.RuntimeService/RemovePodSandbox",
            Op::PodSandboxStatus => "/runtime.v1.RuntimeService/PodSandboxStatus",
            Op::ListPodSandbox => "/runtime.v1.RuntimeService/ListPodSandbox",
            Op::CreateContainer => "/runtime.v1.RuntimeService/CreateContainer",
            Op::StartContainer => "/runtime.v1.RuntimeService/StartContainer",
            Op::StopContainer => "/runtime.v1.RuntimeService/StopContainer",
            Op::RemoveContainer => "/runtime.v1.RuntimeService/RemoveContainer",
            Op::ListContainers => "/runtime.v1.RuntimeService/ListContainers",
            Op::ContainerStatus => "/runtime.v1.RuntimeService/ContainerStatus",
            Op::ExecSync => "/runtime.v1.RuntimeService/ExecSync",
            Op::Exec => "/runtime.v1.RuntimeService/Exec",
            Op::Attach => "/runtime.v1.RuntimeService/Attach",
            Op::PortForward => "/runtime.v1.RuntimeService/PortForward",
            Op::ContainerStats => "/runtime.v1.RuntimeService/ContainerStats",
            Op::ListContainerStats => "/runtime.v1.RuntimeService/ListContainerStats",
            Op::ListImages => "/runtime.v1.ImageService/ListImages",
            Op::ImageStatus => "/runtime.v1.ImageService/ImageStatus",
            Op::PullImage => "/runtime.v1.ImageService/PullImage",
            Op::RemoveImage => "/runtime.v1.ImageService/RemoveImage",
            Op::ImageFsInfo => "/runtime.v1.ImageService/ImageFsInfo",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// The class of a failure, from the gRPC status (or the transport).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The runtime could not be reached (socket missing, connection refused, runtime restarting).
    Unavailable,
    /// No answer within the client's deadline, or the runtime's own deadline passed.
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    InvalidArgument,
    /// Registry credentials missing or refused.
    Unauthorized,
    Unimplemented,
    /// Any other gRPC failure (Unknown, Internal, FailedPrecondition, …).
    Failed,
}

/// A failed CRI call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("CRI {op}: {message}")]
pub struct CriError {
    pub op: Op,
    pub kind: ErrorKind,
    pub code: tonic::Code,
    pub message: String,
}

impl CriError {
    pub fn from_status(op: Op, status: &tonic::Status) -> CriError {
        CriError {
            op,
            kind: classify(status.code(), status.message()),
            code: status.code(),
            message: status.message().to_string(),
        }
    }

    pub fn transport(op: Op, message: String) -> CriError {
        CriError {
            op,
            kind: ErrorKind::Unavailable,
            code: tonic::Code::Unavailable,
            message,
        }
    }

    pub fn timeout(op: Op, after: std::time::Duration) -> CriError {
        CriError {
            op,
            kind: ErrorKind::DeadlineExceeded,
            code: tonic::Code::DeadlineExceeded,
            message: format!("no answer within {after:?}"),
        }
    }

    pub fn is_not_found(&self) -> bool {
        self.kind == ErrorKind::NotFound
    }

    /// The reason a kubelet reports for this failure (container state `waiting.reason`, or the
    /// Event reason for sandbox failures).
    pub fn reason(&self) -> &'static str {
        reason(self.op, self.kind)
    }
}

/// Maps a gRPC status to an [`ErrorKind`]. containerd reports some registry failures with
/// `Unknown` and the registry's words in the message, so the message is read as well.
pub fn classify(code: tonic::Code, message: &str) -> ErrorKind {
    use tonic::Code;
    let lower = message.to_ascii_lowercase();
    match code {
        Code::Unavailable => ErrorKind::Unavailable,
        Code::DeadlineExceeded => ErrorKind::DeadlineExceeded,
        Code::NotFound => ErrorKind::NotFound,
        Code::AlreadyExists => ErrorKind::AlreadyExists,
        Code::InvalidArgument => ErrorKind::InvalidArgument,
        Code::Unauthenticated | Code::PermissionDenied => ErrorKind::Unauthorized,
        Code::Unimplemented => ErrorKind::Unimplemented,
        _ if lower.contains("401 unauthorized")
            || lower.contains("403 forbidden")
            || lower.contains("authorization failed")
            || lower.contains("failed to authorize") =>
        {
            ErrorKind::Unauthorized
        }
        _ if lower.contains("invalid reference format") => ErrorKind::InvalidArgument,
        _ if lower.contains(": not found") || lower.ends_with("not found") => ErrorKind::NotFound,
        _ => ErrorKind::Failed,
    }
}

/// kubelet's reasons (pkg/kubelet/images and kuberuntime) per failing call.
pub fn reason(op: Op, kind: ErrorKind) -> &'static str {
    match (op, kind) {
        (Op::PullImage, ErrorKind::InvalidArgument) => "InvalidImageName",
        (Op::PullImage | Op::ImageStatus, _) => "ErrImagePull",
        (Op::RunPodSandbox, _) => "CreatePodSandboxError",
        (Op::StopPodSandbox, _) => "KillPodSandboxError",
        (Op::CreateContainer, _) => "CreateContainerError",
        (Op::StartContainer, _) => "RunContainerError",
        (Op::StopContainer, _) => "KillContainerError",
        (_, ErrorKind::Unavailable | ErrorKind::DeadlineExceeded) => "RuntimeUnavailable",
        _ => "RuntimeError",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn classify_table() {
        let cases = [
            (
                Code::Unavailable,
                "connection refused",
                ErrorKind::Unavailable,
            ),
            (
                Code::NotFound,
                "container \"x\" in namespace \"k8s.io\": not found",
                ErrorKind::NotFound,
            ),
            (
                Code::Unknown,
                "failed to pull and unpack image: 401 Unauthorized",
                ErrorKind::Unauthorized,
            ),
            (
                Code::Unknown,
                "pulling from host 127.0.0.1:5000 failed: failed to authorize",
                ErrorKind::Unauthorized,
            ),
            (
                Code::Unknown,
                "failed to resolve reference \"x\": 127.0.0.1:1/a:b: not found",
                ErrorKind::NotFound,
            ),
            (
                Code::InvalidArgument,
                "invalid reference format",
                ErrorKind::InvalidArgument,
            ),
            (Code::Internal, "boom", ErrorKind::Failed),
            (Code::Unauthenticated, "", ErrorKind::Unauthorized),
        ];
        for (code, msg, want) in cases {
            assert_eq!(classify(code, msg), want, "{code:?} {msg}");
        }
    }

    #[test]
    fn reason_table() {
        let cases = [
            (
                Op::PullImage,
                ErrorKind::InvalidArgument,
                "InvalidImageName",
            ),
            (Op::PullImage, ErrorKind::Unauthorized, "ErrImagePull"),
            (Op::PullImage, ErrorKind::NotFound, "ErrImagePull"),
            (
                Op::CreateContainer,
                ErrorKind::Failed,
                "CreateContainerError",
            ),
            (Op::StartContainer, ErrorKind::Failed, "RunContainerError"),
            (
                Op::RunPodSandbox,
                ErrorKind::Failed,
                "CreatePodSandboxError",
            ),
            (
                Op::StopContainer,
                ErrorKind::DeadlineExceeded,
                "KillContainerError",
            ),
            (
                Op::ListContainers,
                ErrorKind::Unavailable,
                "RuntimeUnavailable",
            ),
            (Op::ContainerStatus, ErrorKind::NotFound, "RuntimeError"),
        ];
        for (op, kind, want) in cases {
            assert_eq!(reason(op, kind), want, "{op} {kind:?}");
        }
    }

    #[test]
    fn paths_name_the_service() {
        assert_eq!(Op::PullImage.path(), "/runtime.v1.ImageService/PullImage");
        assert_eq!(Op::ExecSync.path(), "/runtime.v1.RuntimeService/ExecSync");
    }
}
