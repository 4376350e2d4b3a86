use proptest::prelude::*;
use serde_json::{Value, json};

use super::wire::{put_bytes_field, put_varint_field};
use super::*;

/// Realistic objects of every served kind, in the exact form Go's JSON encoder prints them.
fn samples() -> Vec<Value> {
    let meta =
        |name: &str| json!({"name": name, "namespace": "default", "creationTimestamp": null});
    vec![
        json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "demo", "labels": {"kubernetes.io/metadata.name": "demo"}, "creationTimestamp": null},
            "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}),
        json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "node-1", "uid": "5f1c", "resourceVersion": "12", "creationTimestamp": "2024-03-01T10:00:00Z"},
            "spec": {"podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24"], "taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {"capacity": {"cpu": "4", "memory": "8Gi"}, "allocatable": {"cpu": "3800m", "memory": "7Gi"},
                "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2024-03-01T10:05:00Z",
                    "lastTransitionTime": "2024-03-01T10:00:00Z", "reason": "KubeletReady"}],
                "addresses": [{"type": "InternalIP", "address": "192.168.1.10"}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "6.1",
                    "osImage": "Debian", "containerRuntimeVersion": "containerd://1.7", "kubeletVersion": "v1.32.0",
                    "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"}}}),
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-0", "namespace": "default", "labels": {"run": "web"}, "creationTimestamp": null,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc", "uid": "u1",
                    "controller": true, "blockOwnerDeletion": true}]},
            "spec": {"volumes": [{"name": "cfg", "configMap": {"name": "web-config", "defaultMode": 420}}],
                "containers": [{"name": "web", "image": "nginx:1.27", "args": ["-g", "daemon off;"],
                    "ports": [{"name": "http", "containerPort": 80, "protocol": "TCP"}],
                    "env": [{"name": "MODE", "value": "prod"},
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}}],
                    "resources": {"limits": {"memory": "128Mi"}, "requests": {"cpu": "100m", "memory": "64Mi"}},
                    "volumeMounts": [{"name": "cfg", "readOnly": true, "mountPath": "/etc/web"}],
                    "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http", "scheme": "HTTP"},
                        "periodSeconds": 5, "failureThreshold": 3},
                    "terminationMessagePath": "/dev/termination-log", "imagePullPolicy": "IfNotPresent"}],
                "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
                "enableServiceLinks": false, "automountServiceAccountToken": false},
            "status": {"phase": "Running", "podIP": "10.244.0.7", "podIPs": [{"ip": "10.244.0.7"}],
                "startTime": "2024-03-01T10:00:03Z"}}),
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}, "creationTimestamp": null},
            "spec": {"ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080},
                    {"name": "metrics", "protocol": "TCP", "appProtocol": "http", "port": 9090, "targetPort": "metrics",
                        "nodePort": 30090}],
                "selector": {"app": "web", "tier": "front"}, "clusterIP": "10.96.0.10",
                "clusterIPs": ["10.96.0.10", "fd00::10"], "type": "NodePort", "sessionAffinity": "None",
                "externalTrafficPolicy": "Cluster", "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "PreferDualStack",
                "allocateLoadBalancerNodePorts": true, "internalTrafficPolicy": "Cluster"},
            "status": {"loadBalancer": {}}}),
        json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": meta("web"),
            "subsets": [{"addresses": [{"ip": "10.244.0.7", "nodeName": "node-1",
                    "targetRef": {"kind": "Pod", "namespace": "default", "name": "web-0", "uid": "u2"}}],
                "notReadyAddresses": [{"ip": "10.244.0.8"}],
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}]}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("web-config"),
            "data": {"app.properties": "a=1\nb=2\n", "empty": ""}, "binaryData": {"blob": "AAEC/w=="}, "immutable": false}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta("creds"),
            "data": {"password": "cGFzc3dvcmQ=", "binary": "AP8Q", "none": ""}, "type": "Opaque"}),
        json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "web-0.17f", "namespace": "default", "creationTimestamp": "2024-03-01T10:00:00Z"},
            "involvedObject": {"kind": "Pod", "namespace": "default", "name": "web-0", "apiVersion": "v1"},
            "reason": "Started", "message": "Started container web", "source": {"component": "kubelet", "host": "node-1"},
            "firstTimestamp": "2024-03-01T10:00:00Z", "lastTimestamp": "2024-03-01T10:00:09Z", "count": 2,
            "type": "Normal", "eventTime": null, "reportingComponent": "kubelet", "reportingInstance": "node-1"}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta("builder"),
            "secrets": [{"name": "builder-token"}], "imagePullSecrets": [{"name": "registry"}],
            "automountServiceAccountToken": false}),
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default", "generation": 3, "labels": {"app": "web"},
                "annotations": {"deployment.kubernetes.io/revision": "2"}, "creationTimestamp": null},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"},
                    "matchExpressions": [{"key": "tier", "operator": "In", "values": ["front", "edge"]}]},
                "template": {"metadata": {"labels": {"app": "web"}, "creationTimestamp": null},
                    "spec": {"containers": [{"name": "nginx", "image": "nginx",
                        "env": [{"name": "A", "value": "1"}, {"name": "EMPTY"}],
                        "resources": {"limits": {"cpu": "500m", "memory": "1Gi"}, "requests": {"cpu": "250m"}}}]}},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": "25%"}},
                "revisionHistoryLimit": 10, "progressDeadlineSeconds": 600},
            "status": {"observedGeneration": 3, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1,
                "availableReplicas": 1, "conditions": [{"type": "Available", "status": "True",
                    "lastUpdateTime": "2024-03-01T10:00:00Z", "lastTransitionTime": "2024-03-01T10:00:00Z",
                    "reason": "MinimumReplicasAvailable", "message": "ok"}]}}),
        json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": meta("web-abc"),
            "spec": {"replicas": 2, "minReadySeconds": 5, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}, "creationTimestamp": null},
                    "spec": {"containers": [{"name": "nginx", "image": "nginx"}]}}},
            "status": {"replicas": 2, "fullyLabeledReplicas": 2, "observedGeneration": 1}}),
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-x1", "namespace": "default",
                "labels": {"kubernetes.io/service-name": "web"}, "creationTimestamp": null},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.244.0.7"], "conditions": {"ready": true, "serving": true, "terminating": false},
                    "targetRef": {"kind": "Pod", "namespace": "default", "name": "web-0"}, "nodeName": "node-1",
                    "zone": "z1", "hints": {"forZones": [{"name": "z1"}]}},
                {"addresses": ["10.244.0.8"], "conditions": {"ready": false}}],
            "ports": [{"name": "http", "protocol": "TCP", "port": 8080, "appProtocol": "http"}, {"name": "", "port": 0}]}),
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": meta("web"),
            "spec": {"ingressClassName": "nginx",
                "defaultBackend": {"service": {"name": "fallback", "port": {"number": 80}}},
                "tls": [{"hosts": ["web.example.com"], "secretName": "web-tls"}],
                "rules": [{"host": "web.example.com", "http": {"paths": [
                    {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "web", "port": {"name": "http"}}}},
                    {"path": "/api", "pathType": "Exact", "backend": {"service": {"name": "api", "port": {"number": 8080}}}}]}}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1", "ports": [{"port": 443, "protocol": "TCP"}]}]}}}),
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
            "metadata": {"name": "nginx", "annotations": {"ingressclass.kubernetes.io/is-default-class": "true"},
                "creationTimestamp": null},
            "spec": {"controller": "k8s.io/ingress-nginx",
                "parameters": {"apiGroup": "k8s.example.com", "kind": "Params", "name": "p", "scope": "Namespace",
                    "namespace": "ingress"}}}),
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta("deny"),
            "spec": {"podSelector": {"matchLabels": {"app": "db"}},
                "ingress": [{"ports": [{"protocol": "TCP", "port": 5432}, {"port": "metrics", "endPort": 9100}],
                    "from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16", "10.2.0.0/16"]}},
                        {"namespaceSelector": {"matchLabels": {"team": "a"}}, "podSelector": {}}]}],
                "egress": [{}], "policyTypes": ["Ingress", "Egress"]}}),
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "node-1", "namespace": "kube-node-lease", "creationTimestamp": null},
            "spec": {"holderIdentity": "node-1", "leaseDurationSeconds": 40,
                "acquireTime": "2024-03-01T10:00:00.000000Z", "renewTime": "2024-03-01T10:00:30.123456Z",
                "leaseTransitions": 0}}),
        json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "web-0.17f", "namespace": "default", "creationTimestamp": null},
            "eventTime": "2024-03-01T10:00:00.250000Z", "series": {"count": 3, "lastObservedTime": "2024-03-01T10:01:00.000001Z"},
            "reportingController": "kubelet", "reportingInstance": "node-1", "action": "Started", "reason": "Started",
            "regarding": {"kind": "Pod", "namespace": "default", "name": "web-0"}, "note": "Started container",
            "type": "Normal", "deprecatedSource": {}, "deprecatedFirstTimestamp": null,
            "deprecatedLastTimestamp": null}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "view", "creationTimestamp": null, "labels": {"rbac.authorization.k8s.io/aggregate-to-edit": "true"}},
            "rules": [{"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods", "pods/log"], "resourceNames": ["a"]},
                      {"verbs": ["get"], "nonResourceURLs": ["/healthz"]}],
            "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}}]}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta("pod-reader"),
            "rules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "cluster-admin", "creationTimestamp": null},
            "subjects": [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "system:masters"}],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta("reader-view"),
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "team-a"}],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"}}),
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "metadata": {"creationTimestamp": null},
            "spec": {"audiences": ["https://kubernetes.default.svc.cluster.local"], "expirationSeconds": 3600,
                "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "p", "uid": "u"}},
            "status": {"token": "", "expirationTimestamp": null}}),
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "metadata": {"creationTimestamp": null},
            "spec": {"token": "t", "audiences": ["a"]}, "status": {"user": {}}}),
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview", "metadata": {"creationTimestamp": null},
            "status": {"userInfo": {"username": "admin", "groups": ["system:masters"]}}}),
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "metadata": {"creationTimestamp": null},
            "spec": {"resourceAttributes": {"namespace": "team-a", "verb": "list", "resource": "pods", "subresource": "log"}},
            "status": {"allowed": false}}),
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "metadata": {"creationTimestamp": null},
            "spec": {"nonResourceAttributes": {"path": "/api", "verb": "get"}, "user": "jane", "groups": ["g"]},
            "status": {"allowed": true, "reason": "r"}}),
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "LocalSubjectAccessReview", "metadata": meta("x"),
            "spec": {"resourceAttributes": {"namespace": "default", "verb": "get", "resource": "pods"}, "user": "jane"},
            "status": {"allowed": false}}),
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview", "metadata": {"creationTimestamp": null},
            "spec": {"namespace": "default"},
            "status": {"resourceRules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}],
                "nonResourceRules": [{"verbs": ["get"], "nonResourceURLs": ["/api"]}], "incomplete": false}}),
        // Issue 16 workload kinds.
        json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta("web"),
            "spec": {"replicas": 3, "serviceName": "nginx", "podManagementPolicy": "OrderedReady",
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}, "creationTimestamp": null},
                    "spec": {"containers": [{"name": "nginx", "image": "nginx"}]}},
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 1}}},
            "status": {"replicas": 3, "readyReplicas": 2, "currentRevision": "web-1", "updateRevision": "web-2"}}),
        json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": meta("agent"),
            "spec": {"selector": {"matchLabels": {"app": "agent"}},
                "template": {"metadata": {"labels": {"app": "agent"}, "creationTimestamp": null},
                    "spec": {"containers": [{"name": "a", "image": "busybox"}]}},
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": "10%"}}},
            "status": {"currentNumberScheduled": 3, "numberMisscheduled": 0, "desiredNumberScheduled": 3, "numberReady": 3}}),
        json!({"apiVersion": "apps/v1", "kind": "ControllerRevision", "metadata": meta("web-1"),
            "data": {"spec": {"template": {"$patch": "replace"}}}, "revision": 1}),
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": meta("pi"),
            "spec": {"parallelism": 2, "completions": 4, "backoffLimit": 3, "manualSelector": false,
                "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "u"}},
                "template": {"metadata": {"labels": {"batch.kubernetes.io/controller-uid": "u"}, "creationTimestamp": null},
                    "spec": {"restartPolicy": "Never", "containers": [{"name": "pi", "image": "perl"}]}},
                "podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]}},
            "status": {"active": 1, "succeeded": 2, "failed": 1,
                "conditions": [{"type": "Complete", "status": "True", "reason": "CompletionsReached"}]}}),
        json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": meta("tick"),
            "spec": {"schedule": "*/1 * * * *", "timeZone": "Etc/UTC", "concurrencyPolicy": "Forbid", "suspend": false,
                "jobTemplate": {"metadata": {"creationTimestamp": null}, "spec": {"template": {"metadata": {"creationTimestamp": null},
                    "spec": {"restartPolicy": "OnFailure", "containers": [{"name": "c", "image": "busybox"}]}}}}},
            "status": {"active": [{"kind": "Job", "name": "tick-1", "namespace": "default"}]}}),
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": meta("pdb"),
            "spec": {"minAvailable": "50%", "selector": {"matchLabels": {"app": "web"}}, "unhealthyPodEvictionPolicy": "AlwaysAllow"},
            "status": {"currentHealthy": 3, "desiredHealthy": 2, "disruptionsAllowed": 1, "expectedPods": 3}}),
        json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": meta("web-0"),
            "deleteOptions": {"gracePeriodSeconds": 5}}),
        json!({"apiVersion": "meta.k8s.io/v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
            "preconditions": {"uid": "u1", "resourceVersion": "7"}, "propagationPolicy": "Foreground",
            "dryRun": ["All"]}),
    ]
}

#[test]
fn every_served_kind_round_trips() {
    let samples = samples();
    for (api_version, kind, _) in super::descriptors::KINDS {
        assert!(
            samples
                .iter()
                .any(|s| s["apiVersion"] == *api_version && s["kind"] == *kind),
            "no sample for {api_version} {kind}"
        );
    }
    for sample in samples {
        let body = encode_body(&sample).unwrap();
        assert!(body.starts_with(MAGIC));
        let decoded = decode_body(&body).unwrap();
        assert_eq!(decoded, sample, "{}", sample["kind"]);
        // The bare message decodes the same way.
        let (av, kind) = (
            sample["apiVersion"].as_str().unwrap(),
            sample["kind"].as_str().unwrap(),
        );
        let raw = encode_object(av, kind, &sample).unwrap();
        assert_eq!(decode_object(av, kind, &raw).unwrap(), sample);
    }
}

#[test]
fn decoded_samples_match_the_k8s_openapi_types() {
    use k8s_openapi::api as k;
    fn check<T: serde::de::DeserializeOwned + serde::Serialize>(v: &Value) {
        let typed: T = serde_json::from_value(v.clone()).unwrap();
        let mut back = serde_json::to_value(&typed).unwrap();
        let mut want = v.clone();
        // k8s-openapi adds apiVersion/kind itself and drops nulls; compare without them.
        strip_nulls(&mut back);
        strip_nulls(&mut want);
        assert_eq!(back, want);
    }
    for sample in samples() {
        let v = decode_body(&encode_body(&sample).unwrap()).unwrap();
        match (
            v["apiVersion"].as_str().unwrap(),
            v["kind"].as_str().unwrap(),
        ) {
            ("v1", "Namespace") => check::<k::core::v1::Namespace>(&v),
            ("v1", "Node") => check::<k::core::v1::Node>(&v),
            ("v1", "Pod") => check::<k::core::v1::Pod>(&v),
            ("v1", "Service") => check::<k::core::v1::Service>(&v),
            ("v1", "Endpoints") => check::<k::core::v1::Endpoints>(&v),
            ("v1", "ConfigMap") => check::<k::core::v1::ConfigMap>(&v),
            ("v1", "Secret") => check::<k::core::v1::Secret>(&v),
            ("v1", "Event") => check::<k::core::v1::Event>(&v),
            ("v1", "ServiceAccount") => check::<k::core::v1::ServiceAccount>(&v),
            ("apps/v1", "Deployment") => check::<k::apps::v1::Deployment>(&v),
            ("apps/v1", "ReplicaSet") => check::<k::apps::v1::ReplicaSet>(&v),
            ("apps/v1", "StatefulSet") => check::<k::apps::v1::StatefulSet>(&v),
            ("apps/v1", "DaemonSet") => check::<k::apps::v1::DaemonSet>(&v),
            ("batch/v1", "Job") => check::<k::batch::v1::Job>(&v),
            ("batch/v1", "CronJob") => check::<k::batch::v1::CronJob>(&v),
            ("policy/v1", "PodDisruptionBudget") => check::<k::policy::v1::PodDisruptionBudget>(&v),
            ("discovery.k8s.io/v1", _) => check::<k::discovery::v1::EndpointSlice>(&v),
            ("networking.k8s.io/v1", "Ingress") => check::<k::networking::v1::Ingress>(&v),
            ("networking.k8s.io/v1", "IngressClass") => {
                check::<k::networking::v1::IngressClass>(&v)
            }
            ("networking.k8s.io/v1", "NetworkPolicy") => {
                check::<k::networking::v1::NetworkPolicy>(&v)
            }
            ("coordination.k8s.io/v1", _) => check::<k::coordination::v1::Lease>(&v),
            ("events.k8s.io/v1", _) => check::<k::events::v1::Event>(&v),
            _ => {}
        }
    }
}

fn strip_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, x| !x.is_null());
            m.values_mut().for_each(strip_nulls);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

/// Bytes built by hand the way Go's gogo-protobuf marshals what `kubectl create service
/// clusterip web --tcp=80:8080` sends: every non-pointer field written, zero or not.
fn kubectl_service_body() -> Vec<u8> {
    let mut meta = Vec::new();
    put_bytes_field(&mut meta, 1, b"web"); // name
    put_bytes_field(&mut meta, 2, b""); // generateName
    put_bytes_field(&mut meta, 3, b""); // namespace
    put_bytes_field(&mut meta, 4, b""); // selfLink
    put_bytes_field(&mut meta, 5, b""); // uid
    put_bytes_field(&mut meta, 6, b""); // resourceVersion
    put_varint_field(&mut meta, 7, 0); // generation
    put_bytes_field(&mut meta, 8, b""); // creationTimestamp (zero time)
    let mut label = Vec::new();
    put_bytes_field(&mut label, 1, b"app");
    put_bytes_field(&mut label, 2, b"web");
    put_bytes_field(&mut meta, 11, &label);

    let mut target = Vec::new();
    put_varint_field(&mut target, 1, 0);
    put_varint_field(&mut target, 2, 8080);
    put_bytes_field(&mut target, 3, b"");
    let mut port = Vec::new();
    put_bytes_field(&mut port, 1, b"80-8080");
    put_bytes_field(&mut port, 2, b"TCP");
    put_varint_field(&mut port, 3, 80);
    put_bytes_field(&mut port, 4, &target);
    put_varint_field(&mut port, 5, 0); // nodePort
    let mut spec = Vec::new();
    put_bytes_field(&mut spec, 1, &port);
    put_bytes_field(&mut spec, 2, &label); // selector app=web
    put_bytes_field(&mut spec, 3, b""); // clusterIP
    put_bytes_field(&mut spec, 4, b"ClusterIP"); // type
    put_bytes_field(&mut spec, 7, b""); // sessionAffinity
    put_varint_field(&mut spec, 13, 0); // publishNotReadyAddresses
    let mut status = Vec::new();
    put_bytes_field(&mut status, 1, b""); // loadBalancer
    let mut service = Vec::new();
    put_bytes_field(&mut service, 1, &meta);
    put_bytes_field(&mut service, 2, &spec);
    put_bytes_field(&mut service, 3, &status);

    let mut type_meta = Vec::new();
    put_bytes_field(&mut type_meta, 1, b"v1");
    put_bytes_field(&mut type_meta, 2, b"Service");
    let mut body = MAGIC.to_vec();
    put_bytes_field(&mut body, 1, &type_meta);
    put_bytes_field(&mut body, 2, &service);
    put_bytes_field(&mut body, 3, b"");
    put_bytes_field(&mut body, 4, b"");
    body
}

#[test]
fn hand_built_kubectl_service_decodes_like_go_json() {
    let decoded = decode_body(&kubectl_service_body()).unwrap();
    let want = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "labels": {"app": "web"}, "creationTimestamp": null},
        "spec": {"ports": [{"name": "80-8080", "protocol": "TCP", "port": 80, "targetPort": 8080}],
            "selector": {"app": "web"}, "type": "ClusterIP"},
        "status": {"loadBalancer": {}}});
    assert_eq!(decoded, want);
}

#[test]
fn hand_built_namespace_and_special_values() {
    // Namespace{metadata{name: "demo", deletionTimestamp{seconds: 1700000000}}}, with an unknown
    // field 99 that must be skipped.
    let mut ts = Vec::new();
    put_varint_field(&mut ts, 1, 1_700_000_000);
    put_varint_field(&mut ts, 2, 5);
    let mut meta = Vec::new();
    put_bytes_field(&mut meta, 1, b"demo");
    put_bytes_field(&mut meta, 9, &ts);
    put_varint_field(&mut meta, 10, 0); // deletionGracePeriodSeconds: pointer, kept at 0
    put_varint_field(&mut meta, 99, 7);
    let mut ns = Vec::new();
    put_bytes_field(&mut ns, 1, &meta);
    assert_eq!(
        decode_object("v1", "Namespace", &ns).unwrap(),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo",
            "deletionTimestamp": "2023-11-14T22:13:20Z", "deletionGracePeriodSeconds": 0}})
    );
    // A negative int32 is a sign-extended 10-byte varint.
    let mut dep_spec = Vec::new();
    put_varint_field(&mut dep_spec, 1, (-1i64) as u64);
    let mut dep = Vec::new();
    put_bytes_field(&mut dep, 2, &dep_spec);
    assert_eq!(
        decode_object("apps/v1", "Deployment", &dep).unwrap()["spec"],
        json!({"replicas": -1})
    );
}

#[test]
fn delete_options_accept_any_api_version() {
    let opts =
        json!({"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"});
    assert_eq!(decode_body(&encode_body(&opts).unwrap()).unwrap(), opts);
    assert!(supports("apps/v1", "DeleteOptions"));
}

#[test]
fn errors_are_reported_not_panics() {
    assert_eq!(
        decode_body(b"{\"kind\":\"Pod\"}"),
        Err(ProtobufError::MissingMagic)
    );
    assert_eq!(decode_body(b""), Err(ProtobufError::MissingMagic));

    let unknown = decode_body(&encode_envelope("v1", "PersistentVolume", b"", "")).unwrap_err();
    assert!(unknown.is_unsupported(), "{unknown}");
    assert!(unknown.to_string().contains("PersistentVolume"));
    assert!(
        decode_body(&encode_envelope("v1", "Pod", b"", "gzip"))
            .unwrap_err()
            .is_unsupported()
    );
    assert!(decode_body(&encode_envelope("", "", b"", "")).is_err());

    // Wrong wire type for a known field: metadata as a varint.
    let mut bad = Vec::new();
    put_varint_field(&mut bad, 1, 3);
    assert!(matches!(
        decode_object("v1", "Pod", &bad),
        Err(ProtobufError::Malformed(_))
    ));
    // FieldsV1 raw bytes that are not JSON.
    assert!(decode_object("v1", "ConfigMap", &nested(&[1, 17, 7, 1], b"{nope")).is_err());

    // Every truncation of a valid body either decodes or errors; cutting inside raw errors.
    let body = kubectl_service_body();
    for cut in 0..body.len() {
        let _ = decode_body(&body[..cut]);
    }
    assert_eq!(
        decode_body(&body[..body.len() - 20]),
        Err(ProtobufError::Truncated)
    );

    // encode_body rejects JSON that does not fit the schema.
    for bad in [
        json!({"kind": "Pod"}),
        json!({"apiVersion": "v1", "kind": "Pod", "spec": {"containers": {}}}),
        json!({"apiVersion": "v1", "kind": "Secret", "data": {"k": "not base64!"}}),
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": 1.5}}),
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": 4_294_967_296u64}}),
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "spec": {"renewTime": "yesterday"}}),
    ] {
        assert!(
            matches!(encode_body(&bad), Err(ProtobufError::InvalidJson(_))),
            "{bad}"
        );
    }
}

/// `runtime.Unknown` around `raw`.
fn encode_envelope(api_version: &str, kind: &str, raw: &[u8], encoding: &str) -> Vec<u8> {
    let mut type_meta = Vec::new();
    put_bytes_field(&mut type_meta, 1, api_version.as_bytes());
    put_bytes_field(&mut type_meta, 2, kind.as_bytes());
    let mut body = MAGIC.to_vec();
    put_bytes_field(&mut body, 1, &type_meta);
    put_bytes_field(&mut body, 2, raw);
    put_bytes_field(&mut body, 3, encoding.as_bytes());
    body
}

/// `leaf` wrapped in length-delimited fields `path[last]` .. `path[0]` (outermost first).
fn nested(path: &[u32], leaf: &[u8]) -> Vec<u8> {
    let mut bytes = leaf.to_vec();
    for tag in path.iter().rev() {
        let mut outer = Vec::new();
        put_bytes_field(&mut outer, *tag, &bytes);
        bytes = outer;
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_bodies_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_body(&bytes);
        let mut with_magic = MAGIC.to_vec();
        with_magic.extend_from_slice(&bytes);
        let _ = decode_body(&with_magic);
        for (av, kind, _) in super::descriptors::KINDS {
            let _ = decode_object(av, kind, &bytes);
        }
    }

    #[test]
    fn mutated_valid_bodies_never_panic(index in 0usize..10_000, byte in any::<u8>(), sample in 0usize..18) {
        let samples = samples();
        let mut body = encode_body(&samples[sample % samples.len()]).unwrap();
        let i = index % body.len();
        body[i] = byte;
        if let Ok(v) = decode_body(&body) {
            // Whatever decodes must re-encode.
            if supports(v["apiVersion"].as_str().unwrap_or(""), v["kind"].as_str().unwrap_or("")) {
                let _ = encode_body(&v);
            }
        }
    }
}

/// Bodies captured from kubectl 1.32 (`kubectl create ...` against a loopback stub server), with
/// kubectl's own JSON for the same command (`--dry-run=client -o json`).
macro_rules! kubectl_case {
    ($name:literal) => {
        (
            $name,
            include_bytes!(concat!("testdata/kubectl_", $name, ".bin")).as_slice(),
            include_str!(concat!("testdata/kubectl_", $name, ".json")),
        )
    };
}

#[test]
fn real_kubectl_bodies_decode_to_kubectls_json() {
    let cases = [
        kubectl_case!("namespace"),
        kubectl_case!("configmap"),
        kubectl_case!("secret"),
        kubectl_case!("serviceaccount"),
        kubectl_case!("deployment"),
        kubectl_case!("ingress"),
        kubectl_case!("service_clusterip"),
        kubectl_case!("service_nodeport"),
    ];
    for (name, body, json) in cases {
        let want: Value = serde_json::from_str(json).unwrap();
        let got = decode_body(body).unwrap();
        assert_eq!(got, want, "{name}");
        // And our encoder reproduces a body that decodes the same.
        assert_eq!(
            decode_body(&encode_body(&got).unwrap()).unwrap(),
            want,
            "{name}"
        );
    }
}
