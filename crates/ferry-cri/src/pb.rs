//! CRI v1 (`runtime.v1`) messages, written by hand as prost structs so that no protoc runs.
//!
//! Field numbers follow `k8s.io/cri-api/pkg/apis/runtime/v1/api.proto`. Only what a kubelet-like
//! agent sends or reads is declared: prost skips unknown fields when decoding, so a newer
//! runtime's extra fields are harmless. Windows-only messages are left out.

use std::collections::HashMap;

type Labels = HashMap<String, String>;

// ---- Version ----

#[derive(Clone, PartialEq, prost::Message)]
pub struct VersionRequest {
    #[prost(string, tag = "1")]
    pub version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct VersionResponse {
    #[prost(string, tag = "1")]
    pub version: String,
    #[prost(string, tag = "2")]
    pub runtime_name: String,
    #[prost(string, tag = "3")]
    pub runtime_version: String,
    #[prost(string, tag = "4")]
    pub runtime_api_version: String,
}

// ---- Shared pieces ----

#[derive(Clone, PartialEq, prost::Message)]
pub struct DnsConfig {
    #[prost(string, repeated, tag = "1")]
    pub servers: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    pub searches: Vec<String>,
    #[prost(string, repeated, tag = "3")]
    pub options: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Protocol {
    Tcp = 0,
    Udp = 1,
    Sctp = 2,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PortMapping {
    #[prost(enumeration = "Protocol", tag = "1")]
    pub protocol: i32,
    #[prost(int32, tag = "2")]
    pub container_port: i32,
    #[prost(int32, tag = "3")]
    pub host_port: i32,
    #[prost(string, tag = "4")]
    pub host_ip: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum MountPropagation {
    PropagationPrivate = 0,
    PropagationHostToContainer = 1,
    PropagationBidirectional = 2,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Mount {
    #[prost(string, tag = "1")]
    pub container_path: String,
    #[prost(string, tag = "2")]
    pub host_path: String,
    #[prost(bool, tag = "3")]
    pub readonly: bool,
    #[prost(bool, tag = "4")]
    pub selinux_relabel: bool,
    #[prost(enumeration = "MountPropagation", tag = "5")]
    pub propagation: i32,
    #[prost(bool, tag = "8")]
    pub recursive_read_only: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum NamespaceMode {
    Pod = 0,
    Container = 1,
    Node = 2,
    Target = 3,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NamespaceOption {
    #[prost(enumeration = "NamespaceMode", tag = "1")]
    pub network: i32,
    #[prost(enumeration = "NamespaceMode", tag = "2")]
    pub pid: i32,
    #[prost(enumeration = "NamespaceMode", tag = "3")]
    pub ipc: i32,
    #[prost(string, tag = "4")]
    pub target_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Int64Value {
    #[prost(int64, tag = "1")]
    pub value: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct UInt64Value {
    #[prost(uint64, tag = "1")]
    pub value: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SecurityProfile {
    /// 0 RuntimeDefault, 1 Unconfined, 2 Localhost.
    #[prost(int32, tag = "1")]
    pub profile_type: i32,
    #[prost(string, tag = "2")]
    pub localhost_ref: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxSandboxSecurityContext {
    #[prost(message, optional, tag = "1")]
    pub namespace_options: Option<NamespaceOption>,
    #[prost(message, optional, tag = "3")]
    pub run_as_user: Option<Int64Value>,
    #[prost(bool, tag = "4")]
    pub readonly_rootfs: bool,
    #[prost(int64, repeated, tag = "5")]
    pub supplemental_groups: Vec<i64>,
    #[prost(bool, tag = "6")]
    pub privileged: bool,
    #[prost(message, optional, tag = "8")]
    pub run_as_group: Option<Int64Value>,
    #[prost(message, optional, tag = "9")]
    pub seccomp: Option<SecurityProfile>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxPodSandboxConfig {
    #[prost(string, tag = "1")]
    pub cgroup_parent: String,
    #[prost(message, optional, tag = "2")]
    pub security_context: Option<LinuxSandboxSecurityContext>,
    #[prost(map = "string, string", tag = "3")]
    pub sysctls: Labels,
    #[prost(message, optional, tag = "4")]
    pub overhead: Option<LinuxContainerResources>,
    #[prost(message, optional, tag = "5")]
    pub resources: Option<LinuxContainerResources>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub uid: String,
    #[prost(string, tag = "3")]
    pub namespace: String,
    #[prost(uint32, tag = "4")]
    pub attempt: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxConfig {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<PodSandboxMetadata>,
    #[prost(string, tag = "2")]
    pub hostname: String,
    #[prost(string, tag = "3")]
    pub log_directory: String,
    #[prost(message, optional, tag = "4")]
    pub dns_config: Option<DnsConfig>,
    #[prost(message, repeated, tag = "5")]
    pub port_mappings: Vec<PortMapping>,
    #[prost(map = "string, string", tag = "6")]
    pub labels: Labels,
    #[prost(map = "string, string", tag = "7")]
    pub annotations: Labels,
    #[prost(message, optional, tag = "8")]
    pub linux: Option<LinuxPodSandboxConfig>,
}

// ---- Sandboxes ----

#[derive(Clone, PartialEq, prost::Message)]
pub struct RunPodSandboxRequest {
    #[prost(message, optional, tag = "1")]
    pub config: Option<PodSandboxConfig>,
    #[prost(string, tag = "2")]
    pub runtime_handler: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RunPodSandboxResponse {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

/// Request of StopPodSandbox, RemovePodSandbox (both carry only the id).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxIdRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatusRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
    #[prost(bool, tag = "2")]
    pub verbose: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodIp {
    #[prost(string, tag = "1")]
    pub ip: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxNetworkStatus {
    #[prost(string, tag = "1")]
    pub ip: String,
    #[prost(message, repeated, tag = "2")]
    pub additional_ips: Vec<PodIp>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Namespace {
    #[prost(message, optional, tag = "2")]
    pub options: Option<NamespaceOption>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxPodSandboxStatus {
    #[prost(message, optional, tag = "1")]
    pub namespaces: Option<Namespace>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum PodSandboxState {
    SandboxReady = 0,
    SandboxNotready = 1,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatus {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<PodSandboxMetadata>,
    #[prost(enumeration = "PodSandboxState", tag = "3")]
    pub state: i32,
    #[prost(int64, tag = "4")]
    pub created_at: i64,
    #[prost(message, optional, tag = "5")]
    pub network: Option<PodSandboxNetworkStatus>,
    #[prost(message, optional, tag = "6")]
    pub linux: Option<LinuxPodSandboxStatus>,
    #[prost(map = "string, string", tag = "7")]
    pub labels: Labels,
    #[prost(map = "string, string", tag = "8")]
    pub annotations: Labels,
    #[prost(string, tag = "9")]
    pub runtime_handler: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatusResponse {
    #[prost(message, optional, tag = "1")]
    pub status: Option<PodSandboxStatus>,
    /// With `verbose`: JSON documents (containerd puts the netns path under "info").
    #[prost(map = "string, string", tag = "2")]
    pub info: Labels,
    #[prost(message, repeated, tag = "3")]
    pub containers_statuses: Vec<ContainerStatus>,
    #[prost(int64, tag = "4")]
    pub timestamp: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStateValue {
    #[prost(enumeration = "PodSandboxState", tag = "1")]
    pub state: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxFilter {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub state: Option<PodSandboxStateValue>,
    #[prost(map = "string, string", tag = "3")]
    pub label_selector: Labels,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodSandboxRequest {
    #[prost(message, optional, tag = "1")]
    pub filter: Option<PodSandboxFilter>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandbox {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<PodSandboxMetadata>,
    #[prost(enumeration = "PodSandboxState", tag = "3")]
    pub state: i32,
    #[prost(int64, tag = "4")]
    pub created_at: i64,
    #[prost(map = "string, string", tag = "5")]
    pub labels: Labels,
    #[prost(map = "string, string", tag = "6")]
    pub annotations: Labels,
    #[prost(string, tag = "7")]
    pub runtime_handler: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodSandboxResponse {
    #[prost(message, repeated, tag = "1")]
    pub items: Vec<PodSandbox>,
}

// ---- Images ----

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageSpec {
    #[prost(string, tag = "1")]
    pub image: String,
    #[prost(map = "string, string", tag = "2")]
    pub annotations: Labels,
    #[prost(string, tag = "18")]
    pub user_specified_image: String,
    #[prost(string, tag = "19")]
    pub runtime_handler: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxContainerResources {
    #[prost(int64, tag = "1")]
    pub cpu_period: i64,
    #[prost(int64, tag = "2")]
    pub cpu_quota: i64,
    #[prost(int64, tag = "3")]
    pub cpu_shares: i64,
    #[prost(int64, tag = "4")]
    pub memory_limit_in_bytes: i64,
    #[prost(int64, tag = "5")]
    pub oom_score_adj: i64,
    #[prost(string, tag = "6")]
    pub cpuset_cpus: String,
    #[prost(string, tag = "7")]
    pub cpuset_mems: String,
    #[prost(map = "string, string", tag = "9")]
    pub unified: Labels,
    #[prost(int64, tag = "10")]
    pub memory_swap_limit_in_bytes: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Capability {
    #[prost(string, repeated, tag = "1")]
    pub add_capabilities: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    pub drop_capabilities: Vec<String>,
    #[prost(string, repeated, tag = "3")]
    pub add_ambient_capabilities: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxContainerSecurityContext {
    #[prost(message, optional, tag = "1")]
    pub capabilities: Option<Capability>,
    #[prost(bool, tag = "2")]
    pub privileged: bool,
    #[prost(message, optional, tag = "3")]
    pub namespace_options: Option<NamespaceOption>,
    #[prost(message, optional, tag = "5")]
    pub run_as_user: Option<Int64Value>,
    #[prost(string, tag = "6")]
    pub run_as_username: String,
    #[prost(bool, tag = "7")]
    pub readonly_rootfs: bool,
    #[prost(int64, repeated, tag = "8")]
    pub supplemental_groups: Vec<i64>,
    #[prost(bool, tag = "11")]
    pub no_new_privs: bool,
    #[prost(message, optional, tag = "12")]
    pub run_as_group: Option<Int64Value>,
    #[prost(string, repeated, tag = "13")]
    pub masked_paths: Vec<String>,
    #[prost(string, repeated, tag = "14")]
    pub readonly_paths: Vec<String>,
    #[prost(message, optional, tag = "15")]
    pub seccomp: Option<SecurityProfile>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxContainerConfig {
    #[prost(message, optional, tag = "1")]
    pub resources: Option<LinuxContainerResources>,
    #[prost(message, optional, tag = "2")]
    pub security_context: Option<LinuxContainerSecurityContext>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(uint32, tag = "2")]
    pub attempt: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Device {
    #[prost(string, tag = "1")]
    pub container_path: String,
    #[prost(string, tag = "2")]
    pub host_path: String,
    #[prost(string, tag = "3")]
    pub permissions: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerConfig {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ContainerMetadata>,
    #[prost(message, optional, tag = "2")]
    pub image: Option<ImageSpec>,
    #[prost(string, repeated, tag = "3")]
    pub command: Vec<String>,
    #[prost(string, repeated, tag = "4")]
    pub args: Vec<String>,
    #[prost(string, tag = "5")]
    pub working_dir: String,
    #[prost(message, repeated, tag = "6")]
    pub envs: Vec<KeyValue>,
    #[prost(message, repeated, tag = "7")]
    pub mounts: Vec<Mount>,
    #[prost(message, repeated, tag = "8")]
    pub devices: Vec<Device>,
    #[prost(map = "string, string", tag = "9")]
    pub labels: Labels,
    #[prost(map = "string, string", tag = "10")]
    pub annotations: Labels,
    /// Relative to the sandbox's `log_directory`.
    #[prost(string, tag = "11")]
    pub log_path: String,
    #[prost(bool, tag = "12")]
    pub stdin: bool,
    #[prost(bool, tag = "13")]
    pub stdin_once: bool,
    #[prost(bool, tag = "14")]
    pub tty: bool,
    #[prost(message, optional, tag = "15")]
    pub linux: Option<LinuxContainerConfig>,
}

// ---- Containers ----

#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateContainerRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
    #[prost(message, optional, tag = "2")]
    pub config: Option<ContainerConfig>,
    #[prost(message, optional, tag = "3")]
    pub sandbox_config: Option<PodSandboxConfig>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateContainerResponse {
    #[prost(string, tag = "1")]
    pub container_id: String,
}

/// Request of StartContainer, RemoveContainer, ContainerStats (each carries only the id).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerIdRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StopContainerRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
    /// Seconds before the runtime kills the container.
    #[prost(int64, tag = "2")]
    pub timeout: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum ContainerState {
    ContainerCreated = 0,
    ContainerRunning = 1,
    ContainerExited = 2,
    ContainerUnknown = 3,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStateValue {
    #[prost(enumeration = "ContainerState", tag = "1")]
    pub state: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerFilter {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub state: Option<ContainerStateValue>,
    #[prost(string, tag = "3")]
    pub pod_sandbox_id: String,
    #[prost(map = "string, string", tag = "4")]
    pub label_selector: Labels,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListContainersRequest {
    #[prost(message, optional, tag = "1")]
    pub filter: Option<ContainerFilter>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Container {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub pod_sandbox_id: String,
    #[prost(message, optional, tag = "3")]
    pub metadata: Option<ContainerMetadata>,
    #[prost(message, optional, tag = "4")]
    pub image: Option<ImageSpec>,
    #[prost(string, tag = "5")]
    pub image_ref: String,
    #[prost(enumeration = "ContainerState", tag = "6")]
    pub state: i32,
    #[prost(int64, tag = "7")]
    pub created_at: i64,
    #[prost(map = "string, string", tag = "8")]
    pub labels: Labels,
    #[prost(map = "string, string", tag = "9")]
    pub annotations: Labels,
    #[prost(string, tag = "10")]
    pub image_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListContainersResponse {
    #[prost(message, repeated, tag = "1")]
    pub containers: Vec<Container>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatusRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
    #[prost(bool, tag = "2")]
    pub verbose: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerResources {
    #[prost(message, optional, tag = "1")]
    pub linux: Option<LinuxContainerResources>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatus {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<ContainerMetadata>,
    #[prost(enumeration = "ContainerState", tag = "3")]
    pub state: i32,
    #[prost(int64, tag = "4")]
    pub created_at: i64,
    #[prost(int64, tag = "5")]
    pub started_at: i64,
    #[prost(int64, tag = "6")]
    pub finished_at: i64,
    #[prost(int32, tag = "7")]
    pub exit_code: i32,
    #[prost(message, optional, tag = "8")]
    pub image: Option<ImageSpec>,
    #[prost(string, tag = "9")]
    pub image_ref: String,
    /// "OOMKilled", "Completed", "Error", …
    #[prost(string, tag = "10")]
    pub reason: String,
    #[prost(string, tag = "11")]
    pub message: String,
    #[prost(map = "string, string", tag = "12")]
    pub labels: Labels,
    #[prost(map = "string, string", tag = "13")]
    pub annotations: Labels,
    #[prost(message, repeated, tag = "14")]
    pub mounts: Vec<Mount>,
    #[prost(string, tag = "15")]
    pub log_path: String,
    #[prost(message, optional, tag = "16")]
    pub resources: Option<ContainerResources>,
    #[prost(string, tag = "17")]
    pub image_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatusResponse {
    #[prost(message, optional, tag = "1")]
    pub status: Option<ContainerStatus>,
    #[prost(map = "string, string", tag = "2")]
    pub info: Labels,
}

// ---- Exec / attach / port-forward ----

#[derive(Clone, PartialEq, prost::Message)]
pub struct ExecSyncRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
    #[prost(string, repeated, tag = "2")]
    pub cmd: Vec<String>,
    /// Seconds; 0 = no limit.
    #[prost(int64, tag = "3")]
    pub timeout: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ExecSyncResponse {
    #[prost(bytes = "vec", tag = "1")]
    pub stdout: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub stderr: Vec<u8>,
    #[prost(int32, tag = "3")]
    pub exit_code: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ExecRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
    #[prost(string, repeated, tag = "2")]
    pub cmd: Vec<String>,
    #[prost(bool, tag = "3")]
    pub tty: bool,
    #[prost(bool, tag = "4")]
    pub stdin: bool,
    #[prost(bool, tag = "5")]
    pub stdout: bool,
    #[prost(bool, tag = "6")]
    pub stderr: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AttachRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
    #[prost(bool, tag = "2")]
    pub stdin: bool,
    #[prost(bool, tag = "3")]
    pub tty: bool,
    #[prost(bool, tag = "4")]
    pub stdout: bool,
    #[prost(bool, tag = "5")]
    pub stderr: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PortForwardRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
    #[prost(int32, repeated, tag = "2")]
    pub port: Vec<i32>,
}

/// Response of Exec, Attach and PortForward: the streaming server's URL.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StreamUrlResponse {
    #[prost(string, tag = "1")]
    pub url: String,
}

// ---- Images ----

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageFilter {
    #[prost(message, optional, tag = "1")]
    pub image: Option<ImageSpec>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListImagesRequest {
    #[prost(message, optional, tag = "1")]
    pub filter: Option<ImageFilter>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Image {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, repeated, tag = "2")]
    pub repo_tags: Vec<String>,
    #[prost(string, repeated, tag = "3")]
    pub repo_digests: Vec<String>,
    #[prost(uint64, tag = "4")]
    pub size: u64,
    #[prost(message, optional, tag = "5")]
    pub uid: Option<Int64Value>,
    #[prost(string, tag = "6")]
    pub username: String,
    #[prost(message, optional, tag = "7")]
    pub spec: Option<ImageSpec>,
    #[prost(bool, tag = "8")]
    pub pinned: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListImagesResponse {
    #[prost(message, repeated, tag = "1")]
    pub images: Vec<Image>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageStatusRequest {
    #[prost(message, optional, tag = "1")]
    pub image: Option<ImageSpec>,
    #[prost(bool, tag = "2")]
    pub verbose: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageStatusResponse {
    /// None when the image is not present.
    #[prost(message, optional, tag = "1")]
    pub image: Option<Image>,
    #[prost(map = "string, string", tag = "2")]
    pub info: Labels,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AuthConfig {
    #[prost(string, tag = "1")]
    pub username: String,
    #[prost(string, tag = "2")]
    pub password: String,
    #[prost(string, tag = "3")]
    pub auth: String,
    #[prost(string, tag = "4")]
    pub server_address: String,
    #[prost(string, tag = "5")]
    pub identity_token: String,
    #[prost(string, tag = "6")]
    pub registry_token: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PullImageRequest {
    #[prost(message, optional, tag = "1")]
    pub image: Option<ImageSpec>,
    #[prost(message, optional, tag = "2")]
    pub auth: Option<AuthConfig>,
    #[prost(message, optional, tag = "3")]
    pub sandbox_config: Option<PodSandboxConfig>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PullImageResponse {
    #[prost(string, tag = "1")]
    pub image_ref: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RemoveImageRequest {
    #[prost(message, optional, tag = "1")]
    pub image: Option<ImageSpec>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct FilesystemIdentifier {
    #[prost(string, tag = "1")]
    pub mountpoint: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct FilesystemUsage {
    #[prost(int64, tag = "1")]
    pub timestamp: i64,
    #[prost(message, optional, tag = "2")]
    pub fs_id: Option<FilesystemIdentifier>,
    #[prost(message, optional, tag = "3")]
    pub used_bytes: Option<UInt64Value>,
    #[prost(message, optional, tag = "4")]
    pub inodes_used: Option<UInt64Value>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageFsInfoResponse {
    #[prost(message, repeated, tag = "1")]
    pub image_filesystems: Vec<FilesystemUsage>,
    #[prost(message, repeated, tag = "2")]
    pub container_filesystems: Vec<FilesystemUsage>,
}

// ---- Stats ----

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatsFilter {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub pod_sandbox_id: String,
    #[prost(map = "string, string", tag = "3")]
    pub label_selector: Labels,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListContainerStatsRequest {
    #[prost(message, optional, tag = "1")]
    pub filter: Option<ContainerStatsFilter>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerAttributes {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<ContainerMetadata>,
    #[prost(map = "string, string", tag = "3")]
    pub labels: Labels,
    #[prost(map = "string, string", tag = "4")]
    pub annotations: Labels,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CpuUsage {
    #[prost(int64, tag = "1")]
    pub timestamp: i64,
    #[prost(message, optional, tag = "2")]
    pub usage_core_nano_seconds: Option<UInt64Value>,
    #[prost(message, optional, tag = "3")]
    pub usage_nano_cores: Option<UInt64Value>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct MemoryUsage {
    #[prost(int64, tag = "1")]
    pub timestamp: i64,
    #[prost(message, optional, tag = "2")]
    pub working_set_bytes: Option<UInt64Value>,
    #[prost(message, optional, tag = "3")]
    pub available_bytes: Option<UInt64Value>,
    #[prost(message, optional, tag = "4")]
    pub usage_bytes: Option<UInt64Value>,
    #[prost(message, optional, tag = "5")]
    pub rss_bytes: Option<UInt64Value>,
    #[prost(message, optional, tag = "6")]
    pub page_faults: Option<UInt64Value>,
    #[prost(message, optional, tag = "7")]
    pub major_page_faults: Option<UInt64Value>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStats {
    #[prost(message, optional, tag = "1")]
    pub attributes: Option<ContainerAttributes>,
    #[prost(message, optional, tag = "2")]
    pub cpu: Option<CpuUsage>,
    #[prost(message, optional, tag = "3")]
    pub memory: Option<MemoryUsage>,
    #[prost(message, optional, tag = "4")]
    pub writable_layer: Option<FilesystemUsage>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatsResponse {
    #[prost(message, optional, tag = "1")]
    pub stats: Option<ContainerStats>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListContainerStatsResponse {
    #[prost(message, repeated, tag = "1")]
    pub stats: Vec<ContainerStats>,
}
