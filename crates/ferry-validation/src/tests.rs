//! Table tests: valid objects pass; each invalid case gives upstream's field path and message.
//! Objects go through defaulting first, as the API server does it.
#![allow(clippy::unwrap_used)]

use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use ferry_apimachinery::errors::ErrorList;
use ferry_defaults as defaults;

fn parse<T: DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("test object decodes")
}

fn lines(errs: &ErrorList) -> Vec<String> {
    errs.iter().map(|e| e.to_string()).collect()
}

/// Runs each case: `(name, object, expected error lines)`.
fn table<T: DeserializeOwned>(
    cases: &[(&str, Value, &[&str])],
    default: fn(&mut T),
    validate: fn(&T, Option<&T>) -> ErrorList,
) {
    for (name, obj, want) in cases {
        let mut o: T = parse(obj.clone());
        default(&mut o);
        let got = lines(&validate(&o, None));
        let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
        assert_eq!(got, want, "case {name}");
    }
}

fn service_base() -> Value {
    json!({
        "metadata": {"name": "my-service", "namespace": "default"},
        "spec": {"selector": {"app": "MyApp"}, "ports": [{"protocol": "TCP", "port": 80, "targetPort": 9376}]}
    })
}

fn with(mut base: Value, path: &[&str], value: Value) -> Value {
    let mut cur = &mut base;
    for (i, p) in path.iter().enumerate() {
        let next = match p.parse::<usize>() {
            Ok(n) => &mut cur[n],
            Err(_) => &mut cur[*p],
        };
        if i + 1 == path.len() {
            *next = value.clone();
            break;
        }
        cur = next;
    }
    base
}

const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1035_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";

#[test]
fn services() {
    let two_ports = json!([{"name": "http", "port": 80}, {"name": "http", "port": 81}]);
    let bad_name = format!("metadata.name: Invalid value: \"Bad_Name\": {DNS1035_MSG}");
    let cases: Vec<(&str, Value, Vec<String>)> = vec![
        ("seed my-service", service_base(), vec![]),
        (
            "port 0",
            with(service_base(), &["spec", "ports"], json!([{"port": 0, "targetPort": 9376}])),
            vec!["spec.ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive".into()],
        ),
        (
            "port 70000",
            with(service_base(), &["spec", "ports"], json!([{"port": 70000, "targetPort": 9376}])),
            vec!["spec.ports[0].port: Invalid value: 70000: must be between 1 and 65535, inclusive".into()],
        ),
        (
            "duplicate port names",
            with(service_base(), &["spec", "ports"], two_ports),
            vec!["spec.ports[1].name: Duplicate value: \"http\"".into()],
        ),
        (
            "names required with two ports",
            with(service_base(), &["spec", "ports"], json!([{"port": 80}, {"port": 81}])),
            vec!["spec.ports[0].name: Required value".into(), "spec.ports[1].name: Required value".into()],
        ),
        (
            "duplicate port+protocol",
            with(service_base(), &["spec", "ports"], json!([{"name": "a", "port": 80}, {"name": "b", "port": 80}])),
            vec!["spec.ports[1]: Duplicate value: core.ServicePort{Name:\"\", Protocol:\"TCP\", AppProtocol:(*string)(nil), Port:80, TargetPort:intstr.IntOrString{Type:0, IntVal:0, StrVal:\"\"}, NodePort:0}".into()],
        ),
        ("bad name", with(service_base(), &["metadata", "name"], json!("Bad_Name")), vec![bad_name]),
        (
            "unknown type",
            with(service_base(), &["spec", "type"], json!("Bogus")),
            vec!["spec.type: Unsupported value: \"Bogus\": supported values: \"ClusterIP\", \"ExternalName\", \"LoadBalancer\", \"NodePort\"".into()],
        ),
        (
            "headless NodePort",
            with(with(service_base(), &["spec", "type"], json!("NodePort")), &["spec", "clusterIP"], json!("None")),
            vec!["spec.clusterIPs[0]: Invalid value: \"None\": may not be set to 'None' for NodePort services".into()],
        ),
        (
            "headless LoadBalancer",
            with(with(service_base(), &["spec", "type"], json!("LoadBalancer")), &["spec", "clusterIP"], json!("None")),
            vec!["spec.clusterIPs[0]: Invalid value: \"None\": may not be set to 'None' for LoadBalancer services".into()],
        ),
        (
            "missing ports",
            with(service_base(), &["spec", "ports"], json!([])),
            vec!["spec.ports: Required value".into()],
        ),
        ("headless without ports", with(with(service_base(), &["spec", "ports"], json!([])), &["spec", "clusterIP"], json!("None")), vec![]),
        (
            "external name",
            json!({"metadata": {"name": "ext", "namespace": "default"}, "spec": {"type": "ExternalName", "externalName": "my.database.example.com"}}),
            vec![],
        ),
        (
            "external name missing",
            json!({"metadata": {"name": "ext", "namespace": "default"}, "spec": {"type": "ExternalName"}}),
            vec!["spec.externalName: Required value".into()],
        ),
        (
            "named target port",
            with(service_base(), &["spec", "ports"], json!([{"port": 80, "targetPort": "http-web"}])),
            vec![],
        ),
        (
            "bad target port name",
            with(service_base(), &["spec", "ports"], json!([{"port": 80, "targetPort": "Web_1"}])),
            vec![
                "spec.ports[0].targetPort: Invalid value: \"Web_1\": must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".into(),
            ],
        ),
        (
            "nodePort on ClusterIP",
            with(service_base(), &["spec", "ports"], json!([{"port": 80, "nodePort": 30080}])),
            vec!["spec.ports[0].nodePort: Forbidden: may not be used when `type` is 'ClusterIP'".into()],
        ),
        (
            "session affinity timeout",
            with(
                with(service_base(), &["spec", "sessionAffinity"], json!("ClientIP")),
                &["spec", "sessionAffinityConfig"],
                json!({"clientIP": {"timeoutSeconds": 90000}}),
            ),
            vec!["spec.sessionAffinityConfig.clientIP.timeoutSeconds: Invalid value: 90000: must be greater than 0 and less than 86400".into()],
        ),
        (
            "bad session affinity",
            with(service_base(), &["spec", "sessionAffinity"], json!("Sticky")),
            vec!["spec.sessionAffinity: Unsupported value: \"Sticky\": supported values: \"ClientIP\", \"None\"".into()],
        ),
        (
            "externalTrafficPolicy on ClusterIP",
            with(service_base(), &["spec", "externalTrafficPolicy"], json!("Local")),
            vec!["spec.externalTrafficPolicy: Invalid value: \"Local\": may only be set for externally-accessible services".into()],
        ),
        (
            "bad internalTrafficPolicy",
            with(service_base(), &["spec", "internalTrafficPolicy"], json!("Node")),
            vec!["spec.internalTrafficPolicy: Unsupported value: \"Node\": supported values: \"Cluster\", \"Local\"".into()],
        ),
        (
            "bad clusterIP",
            with(service_base(), &["spec", "clusterIP"], json!("10.0.0.300")),
            vec!["spec.clusterIPs[0]: Invalid value: \"10.0.0.300\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)".into()],
        ),
        (
            "clusterIPs[0] differs",
            with(with(service_base(), &["spec", "clusterIP"], json!("10.0.0.10")), &["spec", "clusterIPs"], json!(["10.0.0.11"])),
            vec!["spec.clusterIPs: Invalid value: []string{\"10.0.0.11\"}: first value must match `clusterIP`".into()],
        ),
        (
            "two IPv4 clusterIPs",
            with(with(service_base(), &["spec", "clusterIP"], json!("10.0.0.10")), &["spec", "clusterIPs"], json!(["10.0.0.10", "10.0.0.11"])),
            vec!["spec.clusterIPs: Invalid value: []string{\"10.0.0.10\", \"10.0.0.11\"}: may specify no more than one IP for each IP family".into()],
        ),
        (
            "family mismatch",
            with(with(service_base(), &["spec", "clusterIP"], json!("10.0.0.10")), &["spec", "ipFamilies"], json!(["IPv6"])),
            vec!["spec.clusterIPs[0]: Invalid value: \"10.0.0.10\": expected an IPv6 value as indicated by `ipFamilies[0]`".into()],
        ),
        (
            "external IP loopback",
            with(service_base(), &["spec", "externalIPs"], json!(["127.0.0.1"])),
            vec!["spec.externalIPs[0]: Invalid value: \"127.0.0.1\": may not be in the loopback range (127.0.0.0/8, ::1/128)".into()],
        ),
        (
            "source ranges",
            with(
                with(service_base(), &["spec", "type"], json!("LoadBalancer")),
                &["spec", "loadBalancerSourceRanges"],
                json!(["10.0.0.0/8", "bogus"]),
            ),
            vec!["spec.LoadBalancerSourceRanges[1]: Invalid value: \"bogus\": must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)".into()],
        ),
        (
            "appProtocol",
            with(service_base(), &["spec", "ports"], json!([{"port": 80, "appProtocol": "kubernetes.io/h2c"}])),
            vec![],
        ),
        (
            "bad selector value",
            with(service_base(), &["spec", "selector"], json!({"app": "-x"})),
            vec!["spec.selector: Invalid value: \"-x\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')".into()],
        ),
        (
            "port name label",
            with(service_base(), &["spec", "ports"], json!([{"name": "HTTP", "port": 80}])),
            vec![format!("spec.ports[0].name: Invalid value: \"HTTP\": {LABEL_MSG}")],
        ),
    ];
    for (name, obj, want) in cases {
        let mut svc: super::core::Service = parse(obj);
        defaults::service(&mut svc);
        assert_eq!(lines(&super::service(&svc, None)), want, "case {name}");
    }
}

#[test]
fn service_errors_are_422_shaped() {
    let mut svc: super::core::Service = parse(with(
        service_base(),
        &["spec", "ports"],
        json!([{"port": 0, "targetPort": 9376}]),
    ));
    defaults::service(&mut svc);
    let errs = super::service(&svc, None);
    assert_eq!(errs[0].field, "spec.ports[0].port");
    assert_eq!(errs[0].kind.reason(), "FieldValueInvalid");
    assert_eq!(
        errs[0].body(),
        "Invalid value: 0: must be between 1 and 65535, inclusive"
    );
}

#[test]
fn service_updates() {
    let mut old: super::core::Service = parse(with(
        with(service_base(), &["spec", "clusterIP"], json!("10.96.0.10")),
        &["metadata", "resourceVersion"],
        json!("5"),
    ));
    defaults::service(&mut old);
    let mut new = old.clone();
    new.spec.as_mut().unwrap().cluster_ip = Some("10.96.0.11".into());
    new.spec.as_mut().unwrap().cluster_ips = Some(vec!["10.96.0.11".into()]);
    assert_eq!(
        lines(&super::service(&new, Some(&old))),
        vec![
            "spec.clusterIPs[0]: Invalid value: []string{\"10.96.0.11\"}: may not change once set"
        ]
    );
    // To ExternalName, clusterIP must be dropped, and may be.
    let mut ext = old.clone();
    let spec = ext.spec.as_mut().unwrap();
    spec.type_ = Some("ExternalName".into());
    spec.external_name = Some("example.com".into());
    spec.cluster_ip = None;
    spec.cluster_ips = None;
    spec.internal_traffic_policy = None;
    assert_eq!(
        lines(&super::service(&ext, Some(&old))),
        Vec::<String>::new()
    );
    let mut no_rv = old.clone();
    no_rv.metadata.resource_version = None;
    assert_eq!(
        lines(&super::service(&no_rv, Some(&old))),
        vec!["metadata.resourceVersion: Invalid value: \"\": must be specified for an update"]
    );
}

#[test]
fn service_status() {
    let mut old: super::core::Service = parse(with(
        with(service_base(), &["spec", "type"], json!("LoadBalancer")),
        &["metadata", "resourceVersion"],
        json!("1"),
    ));
    defaults::service(&mut old);
    let mut new = old.clone();
    new.status = Some(parse(
        json!({"loadBalancer": {"ingress": [{"ip": "not-an-ip", "ipMode": "VIP"}]}}),
    ));
    assert_eq!(
        lines(&super::service_status(&new, &old)),
        vec![
            "status.loadBalancer.ingress[0].ip: Invalid value: \"not-an-ip\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"
        ]
    );
    new.status = Some(parse(
        json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.10", "ipMode": "VIP"}]}}),
    ));
    assert!(super::service_status(&new, &old).is_empty());
}

fn pod_base() -> Value {
    json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"containers": [{"name": "nginx", "image": "nginx:1.25", "ports": [{"containerPort": 80, "name": "http"}]}]}
    })
}

#[test]
fn pods() {
    let long_searches: Vec<String> = (0..33).map(|i| format!("s{i}.example.com")).collect();
    let cases: Vec<(&str, Value, Vec<String>)> = vec![
        ("valid", pod_base(), vec![]),
        ("no containers", with(pod_base(), &["spec", "containers"], json!([])), vec!["spec.containers: Required value".into()]),
        (
            "duplicate names, no image",
            with(pod_base(), &["spec", "containers"], json!([{"name": "a", "image": "x"}, {"name": "a"}])),
            vec!["spec.containers[1].name: Duplicate value: \"a\"".into(), "spec.containers[1].image: Required value".into()],
        ),
        (
            "bad container port",
            with(pod_base(), &["spec", "containers"], json!([{"name": "a", "image": "x", "ports": [{"containerPort": 70000}]}])),
            vec!["spec.containers[0].ports[0].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive".into()],
        ),
        (
            "env name",
            with(pod_base(), &["spec", "containers"], json!([{"name": "a", "image": "x", "env": [{"name": "A=B", "value": "1"}]}])),
            vec!["spec.containers[0].env[0].name: Invalid value: \"A=B\": a valid environment variable name must consist only of printable ASCII characters other than '='".into()],
        ),
        (
            "restart policy",
            with(pod_base(), &["spec", "restartPolicy"], json!("Sometimes")),
            vec!["spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"OnFailure\", \"Never\"".into()],
        ),
        (
            "dns policy",
            with(pod_base(), &["spec", "dnsPolicy"], json!("Custom")),
            vec!["spec.dnsPolicy: Unsupported value: \"Custom\": supported values: \"ClusterFirstWithHostNet\", \"ClusterFirst\", \"Default\", \"None\"".into()],
        ),
        (
            "dns None without nameservers",
            with(with(pod_base(), &["spec", "dnsPolicy"], json!("None")), &["spec", "dnsConfig"], json!({"searches": ["a.b"]})),
            vec!["spec.dnsConfig.nameservers: Required value: must provide at least one DNS nameserver when `dnsPolicy` is None".into()],
        ),
        (
            "four nameservers",
            with(pod_base(), &["spec", "dnsConfig"], json!({"nameservers": ["1.1.1.1", "1.0.0.1", "8.8.8.8", "8.8.4.4"]})),
            vec!["spec.dnsConfig.nameservers: Invalid value: []string{\"1.1.1.1\", \"1.0.0.1\", \"8.8.8.8\", \"8.8.4.4\"}: must not have more than 3 nameservers".into()],
        ),
        (
            "too many searches",
            with(pod_base(), &["spec", "dnsConfig"], json!({"searches": long_searches})),
            vec![format!(
                "spec.dnsConfig.searches: Invalid value: []string{{{}}}: must not have more than 32 search paths",
                long_searches.iter().map(|s| format!("\"{s}\"")).collect::<Vec<_>>().join(", ")
            )],
        ),
        (
            "hostname and subdomain",
            with(with(pod_base(), &["spec", "hostname"], json!("Host")), &["spec", "subdomain"], json!("sub.domain")),
            vec![
                format!("spec.hostname: Invalid value: \"Host\": {LABEL_MSG}"),
                "spec.subdomain: Invalid value: \"sub.domain\": must not contain dots".into(),
            ],
        ),
        (
            "toleration",
            with(pod_base(), &["spec", "tolerations"], json!([{"operator": "Equal", "value": "x"}])),
            vec!["spec.tolerations[0].operator: Invalid value: \"Equal\": operator must be Exists when `key` is empty, which means \"match all values and all keys\"".into()],
        ),
        (
            "unknown volume mount",
            with(pod_base(), &["spec", "containers"], json!([{"name": "a", "image": "x", "volumeMounts": [{"name": "data", "mountPath": "/d"}]}])),
            vec!["spec.containers[0].volumeMounts[0].name: Not found: \"data\"".into()],
        ),
        (
            "bad name",
            with(pod_base(), &["metadata", "name"], json!("Web")),
            vec!["metadata.name: Invalid value: \"Web\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".into()],
        ),
        (
            "no namespace",
            with(pod_base(), &["metadata"], json!({"name": "web"})),
            vec!["metadata.namespace: Required value".into()],
        ),
    ];
    for (name, obj, want) in cases {
        let mut p: super::core::Pod = parse(obj);
        defaults::pod(&mut p);
        assert_eq!(lines(&super::pod(&p, None)), want, "case {name}");
    }
}

#[test]
fn pod_updates_and_status() {
    let mut old: super::core::Pod = parse(with(
        pod_base(),
        &["metadata", "resourceVersion"],
        json!("3"),
    ));
    defaults::pod(&mut old);
    let mut new = old.clone();
    new.spec.as_mut().unwrap().containers[0].image = Some("nginx:1.26".into());
    assert!(super::pod(&new, Some(&old)).is_empty());
    new.spec.as_mut().unwrap().restart_policy = Some("Never".into());
    let errs = super::pod(&new, Some(&old));
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].field, "spec");
    assert!(
        errs[0]
            .detail
            .starts_with("pod updates may not change fields other than `spec.containers[*].image`")
    );

    let mut st = old.clone();
    st.status = Some(parse(
        json!({"podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}, {"ip": "fd00::5"}]}),
    ));
    assert!(super::pod_status(&st, &old).is_empty());
    st.status = Some(parse(
        json!({"podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.6"}]}),
    ));
    assert_eq!(
        lines(&super::pod_status(&st, &old)),
        vec!["status.podIPs[0].ip: Invalid value: \"10.0.0.6\": must match `podIP`"]
    );
    st.status = Some(parse(json!({"podIPs": [{"ip": "bogus"}]})));
    assert_eq!(
        lines(&super::pod_status(&st, &old)),
        vec![
            "status.podIPs[0]: Invalid value: \"bogus\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"
        ]
    );
}

fn deployment_base() -> Value {
    json!({
        "metadata": {"name": "hostnames", "namespace": "default", "labels": {"app": "hostnames"}},
        "spec": {
            "selector": {"matchLabels": {"app": "hostnames"}},
            "replicas": 3,
            "template": {
                "metadata": {"labels": {"app": "hostnames"}},
                "spec": {"containers": [{"name": "hostnames", "image": "registry.k8s.io/serve_hostname"}]}
            }
        }
    })
}

#[test]
fn deployments() {
    let cases: Vec<(&str, Value, Vec<String>)> = vec![
        ("seed hostnames", deployment_base(), vec![]),
        (
            "selector mismatch",
            with(deployment_base(), &["spec", "selector"], json!({"matchLabels": {"app": "other"}})),
            vec!["spec.template.metadata.labels: Invalid value: map[string]string{\"app\":\"hostnames\"}: `selector` does not match template `labels`".into()],
        ),
        (
            "empty selector",
            with(deployment_base(), &["spec", "selector"], json!({})),
            vec!["spec.selector: Invalid value: v1.LabelSelector{MatchLabels:map[string]string(nil), MatchExpressions:[]v1.LabelSelectorRequirement(nil)}: empty selector is invalid for deployment".into()],
        ),
        (
            "negative replicas",
            with(deployment_base(), &["spec", "replicas"], json!(-1)),
            vec!["spec.replicas: Invalid value: -1: must be greater than or equal to 0".into()],
        ),
        (
            "both zero",
            with(deployment_base(), &["spec", "strategy"], json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 0}})),
            vec!["spec.strategy.rollingUpdate.maxUnavailable: Invalid value: intstr.IntOrString{Type:0, IntVal:0, StrVal:\"\"}: may not be 0 when `maxSurge` is 0".into()],
        ),
        (
            "bad percent",
            with(deployment_base(), &["spec", "strategy"], json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "x%", "maxUnavailable": 1}})),
            vec!["spec.strategy.rollingUpdate.maxSurge: Invalid value: intstr.IntOrString{Type:1, IntVal:0, StrVal:\"x%\"}: a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')".into()],
        ),
        (
            "recreate with rollingUpdate",
            with(deployment_base(), &["spec", "strategy"], json!({"type": "Recreate", "rollingUpdate": {}})),
            vec!["spec.strategy.rollingUpdate: Forbidden: may not be specified when strategy `type` is 'Recreate'".into()],
        ),
        (
            "restart policy",
            with(deployment_base(), &["spec", "template", "spec", "restartPolicy"], json!("Never")),
            vec!["spec.template.spec.restartPolicy: Unsupported value: \"Never\": supported values: \"Always\"".into()],
        ),
        (
            "progress deadline",
            with(with(deployment_base(), &["spec", "progressDeadlineSeconds"], json!(10)), &["spec", "minReadySeconds"], json!(10)),
            vec!["spec.progressDeadlineSeconds: Invalid value: 10: must be greater than minReadySeconds".into()],
        ),
    ];
    for (name, obj, want) in cases {
        let mut d: super::apps_v1::Deployment = parse(obj);
        defaults::deployment(&mut d);
        assert_eq!(lines(&super::deployment(&d, None)), want, "case {name}");
    }

    let mut old: super::apps_v1::Deployment = parse(with(
        deployment_base(),
        &["metadata", "resourceVersion"],
        json!("1"),
    ));
    defaults::deployment(&mut old);
    let mut new = old.clone();
    new.spec
        .selector
        .match_labels
        .as_mut()
        .unwrap()
        .insert("tier".into(), "web".into());
    new.spec
        .template
        .metadata
        .as_mut()
        .unwrap()
        .labels
        .as_mut()
        .unwrap()
        .insert("tier".into(), "web".into());
    assert_eq!(
        lines(&super::deployment(&new, Some(&old))),
        vec![
            "spec.selector: Invalid value: v1.LabelSelector{MatchLabels:map[string]string{\"app\":\"hostnames\", \"tier\":\"web\"}, MatchExpressions:[]v1.LabelSelectorRequirement(nil)}: field is immutable"
        ]
    );

    let mut st = old.clone();
    st.status = Some(parse(
        json!({"replicas": 1, "readyReplicas": 2, "availableReplicas": -1}),
    ));
    assert_eq!(
        lines(&super::deployment_status(&st, &old)),
        vec![
            "status.availableReplicas: Invalid value: -1: must be greater than or equal to 0",
            "status.readyReplicas: Invalid value: 2: cannot be greater than status.replicas",
        ]
    );
}

#[test]
fn replica_sets() {
    let rs = json!({
        "metadata": {"name": "frontend", "namespace": "default"},
        "spec": {
            "replicas": 3,
            "selector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["frontend"]}]},
            "template": {"metadata": {"labels": {"tier": "frontend"}}, "spec": {"containers": [{"name": "php", "image": "php:8"}]}}
        }
    });
    let cases: &[(&str, Value, &[&str])] = &[
        ("valid", rs.clone(), &[]),
        (
            "bad operator",
            with(
                rs.clone(),
                &["spec", "selector"],
                json!({"matchExpressions": [{"key": "tier", "operator": "Maybe"}]}),
            ),
            &[
                "spec.selector.matchExpressions[0].operator: Invalid value: \"Maybe\": not a valid selector operator",
                "spec.selector: Invalid value: v1.LabelSelector{MatchLabels:map[string]string(nil), MatchExpressions:[]v1.LabelSelectorRequirement{v1.LabelSelectorRequirement{Key:\"tier\", Operator:\"Maybe\", Values:[]string(nil)}}}: invalid label selector",
            ],
        ),
    ];
    table(cases, defaults::replica_set, super::replica_set);
}

/// The pod template every workload below carries (labels `app: web`, fields defaulted).
fn workload_template(labels: Value, container: &str, restart: &str) -> Value {
    json!({"metadata": {"labels": labels}, "spec": {"restartPolicy": restart, "dnsPolicy": "ClusterFirst",
        "terminationGracePeriodSeconds": 30, "schedulerName": "default-scheduler",
        "containers": [{"name": container, "image": "nginx", "imagePullPolicy": "Always",
            "terminationMessagePolicy": "File", "terminationMessagePath": "/dev/termination-log"}]}})
}

/// Runs one workload kind's validation (create) on a `spec.selector` and a pod template.
fn workload_errors(
    kind: &str,
    selector: &Value,
    template_labels: &Value,
    container: &str,
) -> Vec<String> {
    let tpl = |restart: &str| workload_template(template_labels.clone(), container, restart);
    match kind {
        "Deployment" => {
            let mut o: super::apps_v1::Deployment = parse(json!({
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"replicas": 1, "selector": selector, "template": tpl("Always")}}));
            defaults::deployment(&mut o);
            lines(&super::deployment(&o, None))
        }
        "ReplicaSet" => {
            let mut o: super::apps_v1::ReplicaSet = parse(json!({
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"replicas": 1, "selector": selector, "template": tpl("Always")}}));
            defaults::replica_set(&mut o);
            lines(&super::replica_set(&o, None))
        }
        "StatefulSet" => {
            let o: super::apps_v1::StatefulSet = parse(json!({
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"replicas": 1, "serviceName": "web", "podManagementPolicy": "OrderedReady",
                    "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
                    "revisionHistoryLimit": 10, "selector": selector, "template": tpl("Always")}}));
            lines(&super::workloads::stateful_set(&o, None))
        }
        "DaemonSet" => {
            let o: super::apps_v1::DaemonSet = parse(json!({
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
                    "revisionHistoryLimit": 10, "selector": selector, "template": tpl("Always")}}));
            lines(&super::workloads::daemon_set(&o, None))
        }
        "Job" => {
            // As the Job strategy leaves it for a generated selector (no manualSelector): the
            // selector also selects the Job's uid, the template carries the generated labels.
            let mut selector = selector.clone();
            selector["matchLabels"][super::workloads::CONTROLLER_UID_LABEL] = json!("u-1");
            let mut labels = template_labels.clone();
            for (k, v) in [
                ("batch.kubernetes.io/controller-uid", "u-1"),
                ("batch.kubernetes.io/job-name", "web"),
                ("controller-uid", "u-1"),
                ("job-name", "web"),
            ] {
                labels[k] = json!(v);
            }
            let o: k8s_openapi::api::batch::v1::Job = parse(json!({
                "metadata": {"name": "web", "namespace": "default", "uid": "u-1"},
                "spec": {"parallelism": 1, "completions": 1, "backoffLimit": 6, "completionMode": "NonIndexed",
                    "suspend": false, "podReplacementPolicy": "TerminatingOrFailed",
                    "selector": selector,
                    "template": workload_template(labels, container, "Never")}}));
            lines(&super::workloads::job(&o, None))
        }
        other => panic!("no such kind {other}"),
    }
}

/// A workload selector that does not parse (upstream `metav1.LabelSelectorAsSelector` fails) is
/// reported as upstream does, per kind: the selector's own field errors; then for Deployment and
/// ReplicaSet one "invalid label selector" error and none of the template's checks; for
/// StatefulSet one `spec.selector` error with no detail and none of the template's checks; for
/// DaemonSet and Job nothing more, the template-labels check skipped, the pod template checked.
#[test]
fn unparsable_workload_selectors() {
    const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
    // (case, selector, the selector's own errors, Go's %#v of the selector)
    let cases: Vec<(&str, Value, Vec<String>, &str)> = vec![
        (
            "operator Foo",
            json!({"matchExpressions": [{"key": "app", "operator": "Foo", "values": ["web"]}]}),
            vec!["spec.selector.matchExpressions[0].operator: Invalid value: \"Foo\": not a valid selector operator".into()],
            r#"v1.LabelSelector{MatchLabels:map[string]string(nil), MatchExpressions:[]v1.LabelSelectorRequirement{v1.LabelSelectorRequirement{Key:"app", Operator:"Foo", Values:[]string{"web"}}}}"#,
        ),
        (
            "In without values",
            json!({"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "In"}]}),
            vec!["spec.selector.matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'".into()],
            r#"v1.LabelSelector{MatchLabels:map[string]string{"app":"web"}, MatchExpressions:[]v1.LabelSelectorRequirement{v1.LabelSelectorRequirement{Key:"tier", Operator:"In", Values:[]string(nil)}}}"#,
        ),
        (
            "In with an empty values list",
            json!({"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": []}]}),
            vec!["spec.selector.matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'".into()],
            r#"v1.LabelSelector{MatchLabels:map[string]string{"app":"web"}, MatchExpressions:[]v1.LabelSelectorRequirement{v1.LabelSelectorRequirement{Key:"tier", Operator:"In", Values:[]string{}}}}"#,
        ),
        (
            "Exists with values",
            json!({"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["web"]}]}),
            vec!["spec.selector.matchExpressions[0].values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'".into()],
            r#"v1.LabelSelector{MatchLabels:map[string]string(nil), MatchExpressions:[]v1.LabelSelectorRequirement{v1.LabelSelectorRequirement{Key:"app", Operator:"Exists", Values:[]string{"web"}}}}"#,
        ),
        (
            "invalid label value",
            json!({"matchLabels": {"app": "-web-"}}),
            vec![format!("spec.selector.matchLabels: Invalid value: \"-web-\": {LABEL_VALUE_MSG}")],
            r#"v1.LabelSelector{MatchLabels:map[string]string{"app":"-web-"}, MatchExpressions:[]v1.LabelSelectorRequirement(nil)}"#,
        ),
        (
            "matchLabels before matchExpressions",
            json!({"matchLabels": {"app": "-web-"}, "matchExpressions": [{"key": "tier", "operator": "Foo"}]}),
            vec![
                format!("spec.selector.matchLabels: Invalid value: \"-web-\": {LABEL_VALUE_MSG}"),
                "spec.selector.matchExpressions[0].operator: Invalid value: \"Foo\": not a valid selector operator".into(),
            ],
            r#"v1.LabelSelector{MatchLabels:map[string]string{"app":"-web-"}, MatchExpressions:[]v1.LabelSelectorRequirement{v1.LabelSelectorRequirement{Key:"tier", Operator:"Foo", Values:[]string(nil)}}}"#,
        ),
    ];
    let labels = json!({"app": "web"});
    for (case, selector, own, go) in &cases {
        for kind in [
            "Deployment",
            "ReplicaSet",
            "StatefulSet",
            "DaemonSet",
            "Job",
        ] {
            let mut want = own.clone();
            match kind {
                "Deployment" | "ReplicaSet" => want.push(format!(
                    "spec.selector: Invalid value: {go}: invalid label selector"
                )),
                "StatefulSet" => want.push(format!("spec.selector: Invalid value: {go}")),
                _ => {}
            }
            let got = workload_errors(kind, selector, &labels, "web");
            assert_eq!(got, want, "{kind}, {case}");
        }
    }

    // The template's own problems (labels the selector does not select, a bad container name):
    // the kinds that skip the template with an unparsable selector do not report them; DaemonSet
    // and Job skip only the labels check.
    let bad = json!({"matchExpressions": [{"key": "app", "operator": "Foo", "values": ["web"]}]});
    let own = "spec.selector.matchExpressions[0].operator: Invalid value: \"Foo\": not a valid selector operator";
    let go = cases[0].3;
    let name_err =
        format!("spec.template.spec.containers[0].name: Invalid value: \"Bad_Name\": {LABEL_MSG}");
    let other = json!({"tier": "x"});
    for (kind, want) in [
        (
            "Deployment",
            vec![
                own.to_string(),
                format!("spec.selector: Invalid value: {go}: invalid label selector"),
            ],
        ),
        (
            "ReplicaSet",
            vec![
                own.to_string(),
                format!("spec.selector: Invalid value: {go}: invalid label selector"),
            ],
        ),
        (
            "StatefulSet",
            vec![
                own.to_string(),
                format!("spec.selector: Invalid value: {go}"),
            ],
        ),
        ("DaemonSet", vec![own.to_string(), name_err.clone()]),
        ("Job", vec![name_err.clone(), own.to_string()]),
    ] {
        assert_eq!(
            workload_errors(kind, &bad, &other, "Bad_Name"),
            want,
            "{kind}"
        );
    }

    // A selector that parses: valid objects pass; a template it does not select is reported.
    let good = json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]});
    for kind in [
        "Deployment",
        "ReplicaSet",
        "StatefulSet",
        "DaemonSet",
        "Job",
    ] {
        let want: Vec<String> = if kind == "Job" {
            // Without manualSelector a Job's selector must select only what the generated labels
            // give its pods (upstream validateGeneratedSelector): `app` is more than that.
            vec![format!(
                "spec.selector: Invalid value: v1.LabelSelector{{MatchLabels:map[string]string{{\"batch.kubernetes.io/controller-uid\":\"u-1\"}}, MatchExpressions:[]v1.LabelSelectorRequirement{{v1.LabelSelectorRequirement{{Key:\"app\", Operator:\"In\", Values:[]string{{\"web\"}}}}}}}}: `selector` not auto-generated"
            )]
        } else {
            Vec::new()
        };
        assert_eq!(workload_errors(kind, &good, &labels, "web"), want, "{kind}");
        let got = workload_errors(
            kind,
            &json!({"matchLabels": {"app": "api"}}),
            &labels,
            "web",
        );
        assert!(
            got.iter().any(|l| l
                .starts_with("spec.template.metadata.labels: Invalid value: map[string]string{")
                && l.ends_with(": `selector` does not match template `labels`")),
            "{kind}: {got:?}"
        );
    }
}

fn job_object(spec_extra: Value, restart: &str) -> k8s_openapi::api::batch::v1::Job {
    let labels = json!({"batch.kubernetes.io/controller-uid": "u-1", "batch.kubernetes.io/job-name": "pi",
        "controller-uid": "u-1", "job-name": "pi"});
    let mut spec = json!({"parallelism": 1, "completions": 1, "backoffLimit": 6, "completionMode": "NonIndexed",
        "suspend": false, "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "u-1"}},
        "template": workload_template(labels, "pi", restart)});
    if let (Some(s), Some(extra)) = (spec.as_object_mut(), spec_extra.as_object()) {
        for (k, v) in extra {
            s.insert(k.clone(), v.clone());
        }
    }
    parse(
        json!({"metadata": {"name": "pi", "namespace": "default", "uid": "u-1", "resourceVersion": "1"}, "spec": spec}),
    )
}

/// Job rules around the selector and the restart policy, with upstream's messages.
#[test]
fn job_selector_and_restart_policy() {
    let job = |extra: Value, restart: &str| {
        lines(&super::workloads::job(&job_object(extra, restart), None))
    };
    let labels = r#"map[string]string{"batch.kubernetes.io/controller-uid":"u-1", "batch.kubernetes.io/job-name":"pi", "controller-uid":"u-1", "job-name":"pi"}"#;
    let cases: Vec<(&str, Value, &str, Vec<String>)> = vec![
        ("generated selector", json!({}), "Never", vec![]),
        (
            "Always",
            json!({}),
            "Always",
            vec!["spec.template.spec.restartPolicy: Required value: valid values: \"OnFailure\", \"Never\"".into()],
        ),
        (
            "pod failure policy with OnFailure",
            json!({"podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [1]}}]}}),
            "OnFailure",
            vec!["spec.template.spec.restartPolicy: Invalid value: \"OnFailure\": only \"Never\" is supported when podFailurePolicy is specified".into()],
        ),
        (
            "pod failure policy with Always: one error",
            json!({"podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [1]}}]}}),
            "Always",
            vec!["spec.template.spec.restartPolicy: Required value: valid values: \"OnFailure\", \"Never\"".into()],
        ),
        (
            "manual selector missing: required, and nothing matches it",
            json!({"manualSelector": true, "selector": null}),
            "Never",
            vec![
                "spec.selector: Required value".into(),
                format!("spec.template.metadata.labels: Invalid value: {labels}: `selector` does not match template `labels`"),
            ],
        ),
        (
            "manual selector other than the generated one",
            json!({"manualSelector": true, "selector": {"matchLabels": {"job-name": "pi"}}}),
            "Never",
            vec![],
        ),
        (
            "generated selector that selects more",
            json!({"selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "u-1", "tier": "batch"}}}),
            "Never",
            vec![
                r#"spec.selector: Invalid value: v1.LabelSelector{MatchLabels:map[string]string{"batch.kubernetes.io/controller-uid":"u-1", "tier":"batch"}, MatchExpressions:[]v1.LabelSelectorRequirement(nil)}: `selector` not auto-generated"#.into(),
                format!("spec.template.metadata.labels: Invalid value: {labels}: `selector` does not match template `labels`"),
            ],
        ),
    ];
    for (case, extra, restart, want) in cases {
        assert_eq!(job(extra, restart), want, "{case}");
    }
    // The generated-selector rule is a create rule: an update of a Job whose selector is not
    // the generated one (say, from before the prefixed labels) does not trip it.
    let old = job_object(
        json!({"selector": {"matchLabels": {"controller-uid": "u-1", "tier": "batch"}}, "template": workload_template(json!({"controller-uid": "u-1", "tier": "batch"}), "pi", "Never")}),
        "Never",
    );
    let mut new = old.clone();
    new.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
    assert_eq!(
        lines(&super::workloads::job(&new, Some(&old))),
        Vec::<String>::new()
    );

    // A CronJob's job template never carries a selector, nor asks for a manual one.
    let cron = |job_spec: Value| {
        let o: k8s_openapi::api::batch::v1::CronJob = parse(json!({
            "metadata": {"name": "cj", "namespace": "default"},
            "spec": {"schedule": "*/1 * * * *", "concurrencyPolicy": "Allow", "jobTemplate": {"spec": job_spec}}}));
        lines(&super::workloads::cron_job(&o, None))
    };
    let tpl = workload_template(json!({"app": "cj"}), "cj", "OnFailure");
    assert_eq!(cron(json!({"template": tpl})), Vec::<String>::new());
    assert_eq!(
        cron(
            json!({"template": tpl, "selector": {"matchLabels": {"app": "cj"}}, "manualSelector": true})
        ),
        vec![
            r#"spec.jobTemplate.spec.selector: Invalid value: v1.LabelSelector{MatchLabels:map[string]string{"app":"cj"}, MatchExpressions:[]v1.LabelSelectorRequirement(nil)}: `selector` will be auto-generated"#,
            r#"spec.jobTemplate.spec.manualSelector: Unsupported value: true: supported values: "nil", "false""#,
        ]
    );
    assert_eq!(
        cron(json!({"template": workload_template(json!({"app": "cj"}), "cj", "Always")})),
        vec![
            "spec.jobTemplate.spec.template.spec.restartPolicy: Required value: valid values: \"OnFailure\", \"Never\""
        ]
    );
}

#[test]
fn endpoint_slices() {
    let base = json!({
        "metadata": {"name": "example-abc", "namespace": "default", "labels": {"kubernetes.io/service-name": "example"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "protocol": "TCP", "port": 80}],
        "endpoints": [{"addresses": ["10.1.2.3"], "conditions": {"ready": true}, "hostname": "pod-1", "nodeName": "node-1", "zone": "us-west2-a"}]
    });
    let many: Vec<Value> = (0..101)
        .map(|i| json!({"port": 1000 + i, "name": format!("p{i}")}))
        .collect();
    let cases: &[(&str, Value, &[&str])] = &[
        ("valid", base.clone(), &[]),
        (
            "address type",
            with(base.clone(), &["addressType"], json!("IPv5")),
            &[
                "addressType: Unsupported value: \"IPv5\": supported values: \"FQDN\", \"IPv4\", \"IPv6\"",
            ],
        ),
        (
            "v6 in v4 slice",
            with(
                base.clone(),
                &["endpoints"],
                json!([{"addresses": ["fd00::1"]}]),
            ),
            &[
                "endpoints[0].addresses[0]: Invalid value: \"fd00::1\": must be a valid IPv4 address",
            ],
        ),
        (
            "no addresses",
            with(base.clone(), &["endpoints"], json!([{"addresses": []}])),
            &["endpoints[0].addresses: Required value: must contain at least 1 address"],
        ),
        (
            "too many ports",
            with(base.clone(), &["ports"], json!(many)),
            &["ports: Too many: 101: must have at most 100 items"],
        ),
        (
            "duplicate port names",
            with(
                base.clone(),
                &["ports"],
                json!([{"name": "a", "port": 1}, {"name": "a", "port": 2}]),
            ),
            &["ports[1].name: Duplicate value: \"a\""],
        ),
        (
            "fqdn",
            with(
                with(base.clone(), &["addressType"], json!("FQDN")),
                &["endpoints"],
                json!([{"addresses": ["example.com"]}, {"addresses": ["localhost"]}]),
            ),
            &[
                "endpoints[1].addresses[0]: Invalid value: \"localhost\": should be a domain with at least two segments separated by dots",
            ],
        ),
    ];
    table(cases, defaults::endpoint_slice, super::endpoint_slice);

    let mut old: super::discovery::EndpointSlice =
        parse(with(base, &["metadata", "resourceVersion"], json!("1")));
    defaults::endpoint_slice(&mut old);
    let mut new = old.clone();
    new.address_type = "IPv6".into();
    new.endpoints = Some(vec![]);
    assert_eq!(
        lines(&super::endpoint_slice(&new, Some(&old))),
        vec!["addressType: Invalid value: \"IPv6\": field is immutable"]
    );
}

fn ingress_base() -> Value {
    json!({
        "metadata": {"name": "minimal-ingress", "namespace": "default", "annotations": {"nginx.ingress.kubernetes.io/rewrite-target": "/"}},
        "spec": {
            "ingressClassName": "nginx-example",
            "rules": [{"http": {"paths": [{"path": "/testpath", "pathType": "Prefix", "backend": {"service": {"name": "test", "port": {"number": 80}}}}]}}]
        }
    })
}

#[test]
fn ingresses() {
    let cases: &[(&str, Value, &[&str])] = &[
        ("seed minimal", ingress_base(), &[]),
        (
            "seed wildcard hosts",
            json!({"metadata": {"name": "ingress-wildcard-host", "namespace": "default"}, "spec": {"rules": [
                {"host": "foo.bar.com", "http": {"paths": [{"pathType": "Prefix", "path": "/bar", "backend": {"service": {"name": "service1", "port": {"number": 80}}}}]}},
                {"host": "*.foo.com", "http": {"paths": [{"pathType": "Exact", "path": "/foo", "backend": {"service": {"name": "service2", "port": {"name": "http"}}}}]}},
                {"http": {"paths": [{"pathType": "ImplementationSpecific", "backend": {"resource": {"apiGroup": "k8s.example.com", "kind": "StorageBucket", "name": "static-assets"}}}]}}
            ], "tls": [{"hosts": ["https-example.foo.com"], "secretName": "testsecret-tls"}]}}),
            &[],
        ),
        (
            "default backend only",
            json!({"metadata": {"name": "d", "namespace": "default"}, "spec": {"defaultBackend": {"service": {"name": "test", "port": {"number": 80}}}}}),
            &[],
        ),
        (
            "no rules no backend",
            json!({"metadata": {"name": "d", "namespace": "default"}, "spec": {}}),
            &[
                "spec.rules: Invalid value: []networking.IngressRule(nil): either `defaultBackend` or `rules` must be specified",
            ],
        ),
        (
            "relative path",
            with(
                ingress_base(),
                &["spec", "rules", "0", "http", "paths", "0", "path"],
                json!("testpath"),
            ),
            &[
                "spec.rules[0].http.paths[0].path: Invalid value: \"testpath\": must be an absolute path",
            ],
        ),
        (
            "unknown path type",
            with(
                ingress_base(),
                &["spec", "rules", "0", "http", "paths", "0", "pathType"],
                json!("Regex"),
            ),
            &[
                "spec.rules[0].http.paths[0].pathType: Unsupported value: \"Regex\": supported values: \"Exact\", \"ImplementationSpecific\", \"Prefix\"",
            ],
        ),
        (
            "both port name and number",
            with(
                ingress_base(),
                &["spec", "rules", "0", "http", "paths", "0", "backend"],
                json!({"service": {"name": "test", "port": {"number": 80, "name": "http"}}}),
            ),
            &[
                "spec.rules[0].http.paths[0].backend: Invalid value: \"\": cannot set both port name & port number",
            ],
        ),
        (
            "service and resource",
            with(
                ingress_base(),
                &["spec", "rules", "0", "http", "paths", "0", "backend"],
                json!({"service": {"name": "test", "port": {"number": 80}}, "resource": {"kind": "A", "name": "b"}}),
            ),
            &[
                "spec.rules[0].http.paths[0].backend: Invalid value: \"\": cannot set both resource and service backends",
            ],
        ),
        (
            "bad wildcard host",
            with(
                ingress_base(),
                &["spec", "rules", "0", "host"],
                json!("*.*.foo.com"),
            ),
            &[
                "spec.rules[0].host: Invalid value: \"*.*.foo.com\": a wildcard DNS-1123 subdomain must start with '*.', followed by a valid DNS subdomain, which must consist of lower case alphanumeric characters, '-' or '.' and end with an alphanumeric character (e.g. '*.example.com', regex used for validation is '\\*\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
            ],
        ),
        (
            "ip host",
            with(
                ingress_base(),
                &["spec", "rules", "0", "host"],
                json!("1.2.3.4"),
            ),
            &[
                "spec.rules[0].host: Invalid value: \"1.2.3.4\": must be a DNS name, not an IP address",
            ],
        ),
    ];
    table(cases, defaults::ingress, super::ingress);
}

#[test]
fn ingress_classes() {
    let base = json!({"metadata": {"name": "nginx-example"}, "spec": {"controller": "k8s.io/ingress-nginx"}});
    let cases: &[(&str, Value, &[&str])] = &[
        ("valid", base.clone(), &[]),
        (
            "missing controller",
            json!({"metadata": {"name": "x"}, "spec": {}}),
            &["spec.controller: Required value"],
        ),
        (
            "controller not domain-prefixed",
            json!({"metadata": {"name": "x"}, "spec": {"controller": "nginx"}}),
            &[
                "spec.controller: Invalid value: \"nginx\": must be a domain-prefixed path (such as \"acme.io/foo\")",
            ],
        ),
        (
            "namespaced",
            with(base.clone(), &["metadata", "namespace"], json!("default")),
            &["metadata.namespace: Forbidden: not allowed on this type"],
        ),
        (
            // seed 004's `external-lb`: no scope, defaulted to Cluster (as upstream).
            "parameters without scope",
            with(
                base.clone(),
                &["spec", "parameters"],
                json!({"apiGroup": "k8s.example.com", "kind": "IngressParameters", "name": "external-lb"}),
            ),
            &[],
        ),
        (
            "parameters without scope but with a namespace",
            with(
                base.clone(),
                &["spec", "parameters"],
                json!({"kind": "IngressParameters", "name": "p", "namespace": "x"}),
            ),
            &["spec.parameters.namespace: Forbidden: `parameters.scope` is set to 'Cluster'"],
        ),
        (
            "namespace scope without namespace",
            with(
                base.clone(),
                &["spec", "parameters"],
                json!({"kind": "IngressParameter", "name": "p", "scope": "Namespace"}),
            ),
            &[
                "spec.parameters.namespace: Required value: `parameters.scope` is set to 'Namespace'",
            ],
        ),
    ];
    table(cases, defaults::ingress_class, super::ingress_class);
    let mut old: super::networking_v1::IngressClass =
        parse(with(base, &["metadata", "resourceVersion"], json!("1")));
    defaults::ingress_class(&mut old);
    let mut new = old.clone();
    new.spec.as_mut().unwrap().controller = Some("example.com/other".into());
    assert_eq!(
        lines(&super::ingress_class(&new, Some(&old))),
        vec!["spec.controller: Invalid value: \"example.com/other\": field is immutable"]
    );
}

fn netpol_base() -> Value {
    json!({
        "metadata": {"name": "test-network-policy", "namespace": "default"},
        "spec": {
            "podSelector": {"matchLabels": {"role": "db"}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{
                "from": [
                    {"ipBlock": {"cidr": "172.17.0.0/16", "except": ["172.17.1.0/24"]}},
                    {"namespaceSelector": {"matchLabels": {"project": "myproject"}}},
                    {"podSelector": {"matchLabels": {"role": "frontend"}}}
                ],
                "ports": [{"protocol": "TCP", "port": 6379}]
            }],
            "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/24"}}], "ports": [{"protocol": "TCP", "port": 32000, "endPort": 32768}]}]
        }
    })
}

#[test]
fn network_policies() {
    let cases: &[(&str, Value, &[&str])] = &[
        ("seed test-network-policy", netpol_base(), &[]),
        (
            "except outside cidr",
            with(
                netpol_base(),
                &["spec", "ingress", "0", "from", "0", "ipBlock", "except"],
                json!(["10.0.0.0/24"]),
            ),
            &[
                "spec.ingress[0].from[0].ipBlock.except[0]: Invalid value: \"10.0.0.0/24\": must be a strict subset of `cidr`",
            ],
        ),
        (
            "bad cidr",
            with(
                netpol_base(),
                &["spec", "ingress", "0", "from", "0", "ipBlock"],
                json!({"cidr": "172.17.0.0"}),
            ),
            &[
                "spec.ingress[0].from[0].ipBlock.cidr: Invalid value: \"172.17.0.0\": must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)",
            ],
        ),
        (
            "endPort below port",
            with(
                netpol_base(),
                &["spec", "egress", "0", "ports"],
                json!([{"port": 32000, "endPort": 100}]),
            ),
            &[
                "spec.egress[0].ports[0].endPort: Invalid value: 32000: must be greater than or equal to `port`",
            ],
        ),
        (
            "bad policy type",
            with(netpol_base(), &["spec", "policyTypes"], json!(["Sideways"])),
            &[
                "spec.policyTypes[0]: Unsupported value: \"Sideways\": supported values: \"Ingress\", \"Egress\"",
            ],
        ),
        (
            "empty peer",
            with(
                netpol_base(),
                &["spec", "ingress", "0", "from"],
                json!([{}]),
            ),
            &["spec.ingress[0].from[0]: Required value: must specify a peer"],
        ),
        (
            "ipBlock and selector",
            with(
                netpol_base(),
                &["spec", "ingress", "0", "from"],
                json!([{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]),
            ),
            &["spec.ingress[0].from[0]: Forbidden: may not specify both ipBlock and another peer"],
        ),
    ];
    table(cases, defaults::network_policy, super::network_policy);
}

#[test]
fn core_small_kinds() {
    table::<super::core::Namespace>(
        &[
            ("valid", json!({"metadata": {"name": "team-a"}}), &[]),
            (
                "dots",
                json!({"metadata": {"name": "team.a"}}),
                &["metadata.name: Invalid value: \"team.a\": must not contain dots"],
            ),
            (
                "no name",
                json!({"metadata": {}}),
                &["metadata.name: Required value: name or generateName is required"],
            ),
        ],
        defaults::namespace,
        super::namespace,
    );
    table::<super::core::ConfigMap>(
        &[
            (
                "valid",
                json!({"metadata": {"name": "cfg", "namespace": "default"}, "data": {"game.properties": "x", "ui_key": "y"}}),
                &[],
            ),
            (
                "bad key",
                json!({"metadata": {"name": "cfg", "namespace": "default"}, "data": {"a/b": "x"}}),
                &[
                    "data[a/b]: Invalid value: \"a/b\": a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')",
                ],
            ),
            (
                "too big",
                json!({"metadata": {"name": "cfg", "namespace": "default"}, "data": {"a": "x".repeat(1024 * 1024 + 1)}}),
                &[": Too long: may not be more than 1048576 bytes"],
            ),
        ],
        defaults::config_map,
        super::config_map,
    );
    table::<super::core::Secret>(
        &[
            (
                "valid",
                json!({"metadata": {"name": "s", "namespace": "default"}, "stringData": {"password": "x"}}),
                &[],
            ),
            (
                "tls without key",
                json!({"metadata": {"name": "s", "namespace": "default"}, "type": "kubernetes.io/tls", "data": {"tls.crt": "eA=="}}),
                &["data[tls.key]: Required value"],
            ),
        ],
        defaults::secret,
        super::secret,
    );
    table::<super::core::Endpoints>(
        &[
            (
                "valid",
                json!({"metadata": {"name": "my-service", "namespace": "default"}, "subsets": [{"addresses": [{"ip": "192.0.2.42"}], "ports": [{"port": 9376}]}]}),
                &[],
            ),
            (
                "loopback",
                json!({"metadata": {"name": "my-service", "namespace": "default"}, "subsets": [{"addresses": [{"ip": "127.0.0.1"}]}]}),
                &[
                    "subsets[0].addresses[0].ip: Invalid value: \"127.0.0.1\": may not be in the loopback range (127.0.0.0/8, ::1/128)",
                ],
            ),
        ],
        defaults::endpoints,
        super::endpoints,
    );
    table::<super::coordination::Lease>(
        &[
            (
                "valid",
                json!({"metadata": {"name": "l", "namespace": "kube-node-lease"}, "spec": {"holderIdentity": "node-1", "leaseDurationSeconds": 40}}),
                &[],
            ),
            (
                "zero duration",
                json!({"metadata": {"name": "l", "namespace": "kube-node-lease"}, "spec": {"leaseDurationSeconds": 0}}),
                &["spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0"],
            ),
        ],
        defaults::lease,
        super::lease,
    );
    table::<super::core::Node>(
        &[
            (
                "valid",
                json!({"metadata": {"name": "node-1"}, "spec": {"podCIDRs": ["10.244.0.0/24", "fd00::/64"]}}),
                &[],
            ),
            (
                "two v4 cidrs",
                json!({"metadata": {"name": "node-1"}, "spec": {"podCIDRs": ["10.244.0.0/24", "10.245.0.0/24"]}}),
                &[
                    "spec.podCIDRs: Invalid value: []string{\"10.244.0.0/24\", \"10.245.0.0/24\"}: may specify no more than one CIDR for each IP family",
                ],
            ),
        ],
        defaults::node,
        super::node,
    );
    table::<super::core::ServiceAccount>(
        &[(
            "valid",
            json!({"metadata": {"name": "default", "namespace": "default"}}),
            &[],
        )],
        defaults::service_account,
        super::service_account,
    );
    table::<super::core::Event>(
        &[
            (
                "valid legacy",
                json!({"metadata": {"name": "e.1", "namespace": "default"}, "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"}, "reason": "Started"}),
                &[],
            ),
            (
                "namespace mismatch",
                json!({"metadata": {"name": "e.1", "namespace": "default"}, "involvedObject": {"kind": "Pod", "name": "p", "namespace": "other"}}),
                &[
                    "involvedObject.namespace: Invalid value: \"other\": does not match event.namespace",
                ],
            ),
        ],
        defaults::core_event,
        super::core_event,
    );
    table::<super::events::Event>(
        &[
            (
                "valid",
                json!({"metadata": {"name": "e.1", "namespace": "default"}, "eventTime": "2024-01-01T00:00:00.000000Z", "type": "Normal",
                       "reportingController": "example.com/ctl", "reportingInstance": "ctl-1", "action": "Sync", "reason": "Synced",
                       "regarding": {"kind": "Pod", "name": "p", "namespace": "default"}}),
                &[],
            ),
            (
                "missing fields",
                json!({"metadata": {"name": "e.1", "namespace": "default"}, "eventTime": "2024-01-01T00:00:00.000000Z", "type": "Odd",
                       "regarding": {"kind": "Pod", "name": "p", "namespace": "default"}}),
                &[
                    "reportingController: Required value",
                    "reportingController: Invalid value: \"\": name part must be non-empty",
                    "reportingController: Invalid value: \"\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
                    "reportingInstance: Required value",
                    "action: Required value",
                    "reason: Required value",
                    "type: Invalid value: \"\": has invalid value: Odd",
                ],
            ),
        ],
        defaults::events_event,
        super::events_event,
    );
}

#[test]
fn metadata_rules() {
    let base = json!({"metadata": {"name": "sa", "namespace": "default"}});
    table::<super::core::ServiceAccount>(
        &[
            (
                "bad label key",
                with(base.clone(), &["metadata", "labels"], json!({"a/b/c": "x"})),
                &[
                    "metadata.labels: Invalid value: \"a/b/c\": a valid label key must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                ],
            ),
            (
                "annotation key case-insensitive",
                with(
                    base.clone(),
                    &["metadata", "annotations"],
                    json!({"Example.com/Key": "x"}),
                ),
                &[],
            ),
            (
                "annotations too large",
                with(
                    base.clone(),
                    &["metadata", "annotations"],
                    json!({"a": "x".repeat(256 * 1024)}),
                ),
                &["metadata.annotations: Too long: may not be more than 262144 bytes"],
            ),
            (
                "finalizer without prefix",
                with(base.clone(), &["metadata", "finalizers"], json!(["custom"])),
                &[
                    "metadata.finalizers[0]: Invalid value: \"custom\": name is neither a standard finalizer name nor is it fully qualified",
                ],
            ),
            (
                "qualified finalizer",
                with(
                    base.clone(),
                    &["metadata", "finalizers"],
                    json!(["example.com/cleanup"]),
                ),
                &[],
            ),
            (
                "owner references",
                with(
                    base.clone(),
                    &["metadata", "ownerReferences"],
                    json!([
                        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "a", "uid": "1", "controller": true},
                        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "b", "uid": "", "controller": true}
                    ]),
                ),
                &[
                    "metadata.ownerReferences.uid: Invalid value: \"\": must not be empty",
                    "metadata.ownerReferences: Invalid value: []v1.OwnerReference{...}: Only one reference can have Controller set to true. Found \"true\" in references for ReplicaSet/a and ReplicaSet/b",
                ],
            ),
            (
                "generateName only",
                json!({"metadata": {"generateName": "sa-", "namespace": "default"}}),
                &["metadata.name: Required value: name or generateName is required"],
            ),
        ],
        defaults::service_account,
        super::service_account,
    );

    let mut old: super::core::ServiceAccount = parse(
        json!({"metadata": {"name": "sa", "namespace": "default", "uid": "u1", "resourceVersion": "1"}}),
    );
    defaults::service_account(&mut old);
    let mut new = old.clone();
    new.metadata.uid = Some("u2".into());
    assert_eq!(
        lines(&super::service_account(&new, Some(&old))),
        vec!["metadata.uid: Invalid value: \"u2\": field is immutable"]
    );
}
