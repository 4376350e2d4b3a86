//! Pure container environment: service link variables in kubelet's `envvars` format, the
//! downward API (`fieldRef`), `$(VAR)` expansion, and the final ordered environment.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, Service};

/// `my-svc` -> `MY_SVC`.
fn env_name(s: &str) -> String {
    s.to_uppercase().replace('-', "_")
}

fn join_host_port(ip: &str, port: i32) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

/// Whether a Service gets variables: it has a cluster IP that is not `None`.
fn ip_set(s: &Service) -> Option<&str> {
    s.spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .filter(|ip| !ip.is_empty() && *ip != "None")
}

/// The variables of the given services, as kubelet's `envvars.FromServices`.
pub fn from_services(services: &[&Service]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for s in services {
        let Some(ip) = ip_set(s) else { continue };
        let name = env_name(s.metadata.name.as_deref().unwrap_or(""));
        let ports = s
            .spec
            .as_ref()
            .and_then(|s| s.ports.clone())
            .unwrap_or_default();
        out.push((format!("{name}_SERVICE_HOST"), ip.to_string()));
        if let Some(first) = ports.first() {
            out.push((format!("{name}_SERVICE_PORT"), first.port.to_string()));
        }
        for p in &ports {
            if let Some(pn) = p.name.as_deref().filter(|n| !n.is_empty()) {
                out.push((
                    format!("{name}_SERVICE_PORT_{}", env_name(pn)),
                    p.port.to_string(),
                ));
            }
        }
        // Docker-link-compatible variables.
        if let Some(first) = ports.first() {
            let proto = first.protocol.as_deref().unwrap_or("TCP").to_lowercase();
            out.push((
                format!("{name}_PORT"),
                format!("{proto}://{}", join_host_port(ip, first.port)),
            ));
        }
        for p in &ports {
            let proto_up = p.protocol.as_deref().unwrap_or("TCP").to_uppercase();
            let proto = proto_up.to_lowercase();
            let prefix = format!("{name}_PORT_{}_{proto_up}", p.port);
            out.push((
                prefix.clone(),
                format!("{proto}://{}", join_host_port(ip, p.port)),
            ));
            out.push((format!("{prefix}_PROTO"), proto));
            out.push((format!("{prefix}_PORT"), p.port.to_string()));
            out.push((format!("{prefix}_ADDR"), ip.to_string()));
        }
    }
    out
}

/// The services whose variables a pod in `ns` gets: its namespace's (unless service links are
/// disabled) and always the `kubernetes` master service of `default`, sorted by name.
pub fn service_env(pod: &Pod, services: &[Service]) -> Vec<(String, String)> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let links = pod
        .spec
        .as_ref()
        .and_then(|s| s.enable_service_links)
        .unwrap_or(true);
    let mut map: BTreeMap<String, &Service> = BTreeMap::new();
    for s in services {
        if ip_set(s).is_none() {
            continue;
        }
        let name = s.metadata.name.clone().unwrap_or_default();
        let sns = s.metadata.namespace.as_deref().unwrap_or("");
        if sns == "default" && name == "kubernetes" {
            map.entry(name).or_insert(s);
        } else if sns == ns && links {
            map.insert(name, s);
        }
    }
    let list: Vec<&Service> = map.into_values().collect();
    from_services(&list)
}

/// Expands `$(VAR)` references from `lookup`; `$$` escapes `$`; unknown references stay as
/// written (Kubernetes' `expansion.Expand`).
pub fn expand(input: &str, lookup: &dyn Fn(&str) -> Option<String>) -> String {
    let b = input.as_bytes();
    let mut out = String::with_capacity(input.len());
    let mut i = 0;
    let mut last = 0;
    while i < b.len() {
        if b[i] == b'$' && i + 1 < b.len() {
            match b[i + 1] {
                b'$' => {
                    out.push_str(&input[last..i]);
                    out.push('$');
                    i += 2;
                    last = i;
                    continue;
                }
                b'(' => {
                    if let Some(close) = input[i + 2..].find(')') {
                        let name = &input[i + 2..i + 2 + close];
                        out.push_str(&input[last..i]);
                        match lookup(name) {
                            Some(v) => out.push_str(&v),
                            None => out.push_str(&input[i..i + 3 + close]),
                        }
                        i += 3 + close;
                        last = i;
                        continue;
                    }
                }
                _ => {}
            }
        }
        i += 1;
    }
    out.push_str(&input[last..]);
    out
}

/// Pod facts the downward API exposes.
#[derive(Debug, Clone, Default)]
pub struct PodFacts {
    pub pod_ips: Vec<String>,
    pub host_ips: Vec<String>,
}

/// Why a container's environment cannot be built; the texts are kubelet's
/// (`CreateContainerConfigError` messages).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    #[error("unsupported fieldPath {0:?}")]
    UnsupportedFieldPath(String),
    #[error("configmap \"{0}\" not found")]
    ConfigMapNotFound(String),
    #[error("secret \"{0}\" not found")]
    SecretNotFound(String),
    #[error("couldn't find key {key} in ConfigMap {name}")]
    ConfigMapKeyNotFound { key: String, name: String },
    #[error("couldn't find key {key} in Secret {name}")]
    SecretKeyNotFound { key: String, name: String },
}

/// A downward API field of `pod` (`fieldRef.fieldPath`).
pub fn field_ref(pod: &Pod, facts: &PodFacts, path: &str) -> Result<String, EnvError> {
    let m = &pod.metadata;
    let spec = pod.spec.as_ref();
    let from_map = |map: &Option<BTreeMap<String, String>>, key: &str| {
        map.as_ref()
            .and_then(|m| m.get(key))
            .cloned()
            .unwrap_or_default()
    };
    let key_of = |p: &str, prefix: &str| -> Option<String> {
        p.strip_prefix(prefix)?
            .strip_suffix("']")
            .map(str::to_string)
    };
    Ok(match path {
        "metadata.name" => m.name.clone().unwrap_or_default(),
        "metadata.namespace" => m.namespace.clone().unwrap_or_default(),
        "metadata.uid" => m.uid.clone().unwrap_or_default(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.hostIP" => facts.host_ips.first().cloned().unwrap_or_default(),
        "status.hostIPs" => facts.host_ips.join(","),
        "status.podIP" => facts.pod_ips.first().cloned().unwrap_or_default(),
        "status.podIPs" => facts.pod_ips.join(","),
        p => {
            if let Some(k) = key_of(p, "metadata.labels['") {
                from_map(&m.labels, &k)
            } else if let Some(k) = key_of(p, "metadata.annotations['") {
                from_map(&m.annotations, &k)
            } else {
                return Err(EnvError::UnsupportedFieldPath(p.to_string()));
            }
        }
    })
}

/// What resolving `configMapKeyRef`/`secretKeyRef`/`envFrom` needs from the cluster.
pub trait EnvSource {
    /// The value of `key` in a ConfigMap of the pod's namespace; `Ok(None)` when missing.
    fn config_map(&self, name: &str) -> Option<BTreeMap<String, String>>;
    /// The decoded data of a Secret of the pod's namespace.
    fn secret(&self, name: &str) -> Option<BTreeMap<String, String>>;
}

/// The complete environment of `container`: container `env` (with `valueFrom` and `$(VAR)`
/// expansion against earlier variables and service variables), `envFrom`, then service
/// variables not already defined. Errors name the missing reference, as kubelet's
/// `CreateContainerConfigError` does.
pub fn container_env(
    pod: &Pod,
    container: &Container,
    facts: &PodFacts,
    service_vars: &[(String, String)],
    src: &dyn EnvSource,
) -> Result<Vec<(String, String)>, EnvError> {
    let mut out: Vec<(String, String)> = Vec::new();
    fn set(out: &mut Vec<(String, String)>, k: String, v: String) {
        if let Some(e) = out.iter_mut().find(|(n, _)| *n == k) {
            e.1 = v;
        } else {
            out.push((k, v));
        }
    }
    for ef in container.env_from.clone().unwrap_or_default() {
        let prefix = ef.prefix.unwrap_or_default();
        if let Some(cm) = ef.config_map_ref {
            match src.config_map(&cm.name) {
                Some(data) => {
                    for (k, v) in data {
                        set(&mut out, format!("{prefix}{k}"), v);
                    }
                }
                None if cm.optional == Some(true) => {}
                None => return Err(EnvError::ConfigMapNotFound(cm.name)),
            }
        }
        if let Some(sr) = ef.secret_ref {
            match src.secret(&sr.name) {
                Some(data) => {
                    for (k, v) in data {
                        set(&mut out, format!("{prefix}{k}"), v);
                    }
                }
                None if sr.optional == Some(true) => {}
                None => return Err(EnvError::SecretNotFound(sr.name)),
            }
        }
    }
    for e in container.env.clone().unwrap_or_default() {
        let value = if let Some(from) = e.value_from {
            if let Some(f) = from.field_ref {
                Some(field_ref(pod, facts, &f.field_path)?)
            } else if let Some(c) = from.config_map_key_ref {
                match src.config_map(&c.name) {
                    Some(d) => match d.get(&c.key) {
                        Some(v) => Some(v.clone()),
                        None if c.optional == Some(true) => None,
                        None => {
                            return Err(EnvError::ConfigMapKeyNotFound {
                                key: c.key,
                                name: c.name,
                            });
                        }
                    },
                    None if c.optional == Some(true) => None,
                    None => return Err(EnvError::ConfigMapNotFound(c.name)),
                }
            } else if let Some(s) = from.secret_key_ref {
                match src.secret(&s.name) {
                    Some(d) => match d.get(&s.key) {
                        Some(v) => Some(v.clone()),
                        None if s.optional == Some(true) => None,
                        None => {
                            return Err(EnvError::SecretKeyNotFound {
                                key: s.key,
                                name: s.name,
                            });
                        }
                    },
                    None if s.optional == Some(true) => None,
                    None => return Err(EnvError::SecretNotFound(s.name)),
                }
            } else if let Some(r) = from.resource_field_ref {
                Some(resource_field(container, &r.resource))
            } else {
                None
            }
        } else {
            let raw = e.value.unwrap_or_default();
            let snapshot = out.clone();
            Some(expand(&raw, &|n| {
                snapshot
                    .iter()
                    .find(|(k, _)| k == n)
                    .or_else(|| service_vars.iter().find(|(k, _)| k == n))
                    .map(|(_, v)| v.clone())
            }))
        };
        if let Some(v) = value {
            set(&mut out, e.name, v);
        }
    }
    for (k, v) in service_vars {
        if !out.iter().any(|(n, _)| n == k) {
            out.push((k.clone(), v.clone()));
        }
    }
    Ok(out)
}

/// `resourceFieldRef` with divisor 1: the container's limit, else its request, else "0".
fn resource_field(c: &Container, resource: &str) -> String {
    let (kind, name) = resource.split_once('.').unwrap_or(("limits", resource));
    let res = c.resources.as_ref();
    let q = match kind {
        "requests" => res.and_then(|r| r.requests.as_ref()),
        _ => res.and_then(|r| r.limits.as_ref()),
    }
    .and_then(|m| m.get(name))
    .map(|q| q.0.clone());
    q.unwrap_or_else(|| "0".to_string())
}

/// `command`/`args` with `$(VAR)` expanded against the final environment.
pub fn expand_args(args: &[String], env: &[(String, String)]) -> Vec<String> {
    args.iter()
        .map(|a| {
            expand(a, &|n| {
                env.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone())
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ConfigMapKeySelector, EnvVar, EnvVarSource, ObjectFieldSelector, SecretKeySelector,
        ServicePort, ServiceSpec,
    };

    fn svc(ns: &str, name: &str, ip: &str, ports: &[(Option<&str>, i32, &str)]) -> Service {
        let mut s = Service {
            spec: Some(ServiceSpec {
                cluster_ip: Some(ip.into()),
                ports: Some(
                    ports
                        .iter()
                        .map(|(n, p, proto)| ServicePort {
                            name: n.map(str::to_string),
                            port: *p,
                            protocol: Some(proto.to_string()),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        s.metadata.name = Some(name.into());
        s.metadata.namespace = Some(ns.into());
        s
    }

    #[test]
    fn service_variables_match_kubelet() {
        let s = svc(
            "default",
            "redis-primary",
            "10.0.0.11",
            &[
                (Some("redis"), 6379, "TCP"),
                (Some("metrics-x"), 9121, "UDP"),
            ],
        );
        let got = from_services(&[&s]);
        let want: Vec<(&str, &str)> = vec![
            ("REDIS_PRIMARY_SERVICE_HOST", "10.0.0.11"),
            ("REDIS_PRIMARY_SERVICE_PORT", "6379"),
            ("REDIS_PRIMARY_SERVICE_PORT_REDIS", "6379"),
            ("REDIS_PRIMARY_SERVICE_PORT_METRICS_X", "9121"),
            ("REDIS_PRIMARY_PORT", "tcp://10.0.0.11:6379"),
            ("REDIS_PRIMARY_PORT_6379_TCP", "tcp://10.0.0.11:6379"),
            ("REDIS_PRIMARY_PORT_6379_TCP_PROTO", "tcp"),
            ("REDIS_PRIMARY_PORT_6379_TCP_PORT", "6379"),
            ("REDIS_PRIMARY_PORT_6379_TCP_ADDR", "10.0.0.11"),
            ("REDIS_PRIMARY_PORT_9121_UDP", "udp://10.0.0.11:9121"),
            ("REDIS_PRIMARY_PORT_9121_UDP_PROTO", "udp"),
            ("REDIS_PRIMARY_PORT_9121_UDP_PORT", "9121"),
            ("REDIS_PRIMARY_PORT_9121_UDP_ADDR", "10.0.0.11"),
        ];
        let got: Vec<(&str, &str)> = got.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        assert_eq!(got, want);
        let v6 = from_services(&[&svc("d", "x", "fd00::1", &[(None, 80, "TCP")])]);
        assert!(v6.contains(&("X_PORT".into(), "tcp://[fd00::1]:80".into())));
    }

    #[test]
    fn which_services() {
        let all = vec![
            svc(
                "default",
                "kubernetes",
                "10.0.0.1",
                &[(Some("https"), 443, "TCP")],
            ),
            svc("app", "web", "10.0.0.5", &[(None, 80, "TCP")]),
            svc("app", "headless", "None", &[(None, 80, "TCP")]),
            svc("other", "db", "10.0.0.6", &[(None, 5432, "TCP")]),
        ];
        let mut p = Pod::default();
        p.metadata.namespace = Some("app".into());
        let names: Vec<String> = service_env(&p, &all).into_iter().map(|(k, _)| k).collect();
        assert!(names.contains(&"KUBERNETES_SERVICE_HOST".to_string()));
        assert!(names.contains(&"WEB_SERVICE_HOST".to_string()));
        assert!(
            !names
                .iter()
                .any(|n| n.starts_with("HEADLESS") || n.starts_with("DB_"))
        );
        p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            enable_service_links: Some(false),
            ..Default::default()
        });
        let names: Vec<String> = service_env(&p, &all).into_iter().map(|(k, _)| k).collect();
        assert!(names.contains(&"KUBERNETES_SERVICE_HOST".to_string()));
        assert!(!names.iter().any(|n| n.starts_with("WEB_")));
    }

    #[test]
    fn expansion_table() {
        let lookup = |n: &str| match n {
            "A" => Some("1".to_string()),
            "B" => Some("two".to_string()),
            _ => None,
        };
        let cases = [
            ("plain", "plain"),
            ("$(A)", "1"),
            ("x$(A)y$(B)z", "x1ytwoz"),
            ("$(UNKNOWN)", "$(UNKNOWN)"),
            ("$$(A)", "$(A)"),
            ("$$$(A)", "$1"),
            ("$(A", "$(A"),
            ("$", "$"),
            ("a$b", "a$b"),
        ];
        for (input, want) in cases {
            assert_eq!(expand(input, &lookup), want, "{input}");
        }
    }

    struct Src;
    impl EnvSource for Src {
        fn config_map(&self, name: &str) -> Option<BTreeMap<String, String>> {
            (name == "cm").then(|| BTreeMap::from([("color".to_string(), "blue".to_string())]))
        }
        fn secret(&self, name: &str) -> Option<BTreeMap<String, String>> {
            (name == "sec").then(|| BTreeMap::from([("pw".to_string(), "hunter2".to_string())]))
        }
    }

    fn var(name: &str, value: Option<&str>, from: Option<EnvVarSource>) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: value.map(str::to_string),
            value_from: from,
        }
    }

    #[test]
    fn container_environment() {
        let mut p = Pod::default();
        p.metadata.name = Some("web-1".into());
        p.metadata.namespace = Some("app".into());
        p.metadata.labels = Some(BTreeMap::from([("tier".into(), "front".into())]));
        let c = Container {
            name: "c".into(),
            env: Some(vec![
                var(
                    "POD_IP",
                    None,
                    Some(EnvVarSource {
                        field_ref: Some(ObjectFieldSelector {
                            field_path: "status.podIP".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                ),
                var(
                    "TIER",
                    None,
                    Some(EnvVarSource {
                        field_ref: Some(ObjectFieldSelector {
                            field_path: "metadata.labels['tier']".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                ),
                var(
                    "COLOR",
                    None,
                    Some(EnvVarSource {
                        config_map_key_ref: Some(ConfigMapKeySelector {
                            name: "cm".into(),
                            key: "color".into(),
                            optional: None,
                        }),
                        ..Default::default()
                    }),
                ),
                var(
                    "PW",
                    None,
                    Some(EnvVarSource {
                        secret_key_ref: Some(SecretKeySelector {
                            name: "sec".into(),
                            key: "pw".into(),
                            optional: None,
                        }),
                        ..Default::default()
                    }),
                ),
                var("URL", Some("http://$(POD_IP):$(WEB_SERVICE_PORT)/"), None),
                var("WEB_SERVICE_PORT", Some("override"), None),
            ]),
            ..Default::default()
        };
        let facts = PodFacts {
            pod_ips: vec!["127.100.0.7".into()],
            host_ips: vec!["127.0.0.1".into()],
        };
        let svc_vars = vec![
            ("WEB_SERVICE_HOST".to_string(), "10.0.0.5".to_string()),
            ("WEB_SERVICE_PORT".to_string(), "80".to_string()),
        ];
        let env = container_env(&p, &c, &facts, &svc_vars, &Src).expect("env");
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("POD_IP"), Some("127.100.0.7"));
        assert_eq!(get("TIER"), Some("front"));
        assert_eq!(get("COLOR"), Some("blue"));
        assert_eq!(get("PW"), Some("hunter2"));
        assert_eq!(get("URL"), Some("http://127.100.0.7:80/"));
        assert_eq!(get("WEB_SERVICE_PORT"), Some("override"));
        assert_eq!(get("WEB_SERVICE_HOST"), Some("10.0.0.5"));

        let missing = Container {
            name: "c".into(),
            env: Some(vec![var(
                "X",
                None,
                Some(EnvVarSource {
                    config_map_key_ref: Some(ConfigMapKeySelector {
                        name: "nope".into(),
                        key: "k".into(),
                        optional: None,
                    }),
                    ..Default::default()
                }),
            )]),
            ..Default::default()
        };
        assert_eq!(
            container_env(&p, &missing, &facts, &[], &Src).map_err(|e| e.to_string()),
            Err("configmap \"nope\" not found".to_string())
        );
    }
}
