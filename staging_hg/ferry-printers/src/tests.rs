use jiff::Timestamp;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::*;

const NOW: &str = "2024-06-01T12:00:00Z";
/// Five minutes and ten seconds before [`NOW`].
const CREATED: &str = "2024-06-01T11:54:50Z";

fn now() -> Timestamp {
    NOW.parse().expect("now")
}

fn obj<T: DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("object")
}

fn meta(name: &str) -> Value {
    json!({"name": name, "namespace": "default", "creationTimestamp": CREATED})
}

/// Runs a printer over JSON objects and compares whole rows; also checks the row has one cell
/// per column.
fn check<T: DeserializeOwned>(
    printer: fn(&T, Timestamp) -> Vec<Value>,
    columns: fn() -> Vec<crate::kinds::Column>,
    cases: Vec<(Value, Value)>,
) {
    let n = columns().len();
    for (input, want) in cases {
        let row = printer(&obj(input.clone()), now());
        assert_eq!(row.len(), n, "cells vs columns for {input}");
        assert_eq!(Value::Array(row), want, "row for {input}");
    }
}

/// A column's name, type and priority.
type Shape = (String, String, i32);

fn column_shape(cols: Vec<crate::kinds::Column>) -> Vec<Shape> {
    cols.into_iter()
        .map(|c| (c.name.to_string(), c.type_.to_string(), c.priority))
        .collect()
}

#[test]
fn column_definitions() {
    let s = |v: &[(&str, &str, i32)]| -> Vec<Shape> {
        v.iter()
            .map(|(a, b, c)| (a.to_string(), b.to_string(), *c))
            .collect()
    };
    let cases: Vec<(Vec<crate::kinds::Column>, Vec<Shape>)> = vec![
        (
            columns::namespace(),
            s(&[
                ("Name", "string", 0),
                ("Status", "string", 0),
                ("Age", "string", 0),
            ]),
        ),
        (
            columns::node(),
            s(&[
                ("Name", "string", 0),
                ("Status", "string", 0),
                ("Roles", "string", 0),
                ("Age", "string", 0),
                ("Version", "string", 0),
                ("Internal-IP", "string", 1),
                ("External-IP", "string", 1),
                ("OS-Image", "string", 1),
                ("Kernel-Version", "string", 1),
                ("Container-Runtime", "string", 1),
            ]),
        ),
        (
            columns::pod(),
            s(&[
                ("Name", "string", 0),
                ("Ready", "string", 0),
                ("Status", "string", 0),
                ("Restarts", "string", 0),
                ("Age", "string", 0),
                ("IP", "string", 1),
                ("Node", "string", 1),
                ("Nominated Node", "string", 1),
                ("Readiness Gates", "string", 1),
            ]),
        ),
        (
            columns::service(),
            s(&[
                ("Name", "string", 0),
                ("Type", "string", 0),
                ("Cluster-IP", "string", 0),
                ("External-IP", "string", 0),
                ("Port(s)", "string", 0),
                ("Age", "string", 0),
                ("Selector", "string", 1),
            ]),
        ),
        (
            columns::endpoints(),
            s(&[
                ("Name", "string", 0),
                ("Endpoints", "string", 0),
                ("Age", "string", 0),
            ]),
        ),
        (
            columns::config_map(),
            s(&[
                ("Name", "string", 0),
                ("Data", "string", 0),
                ("Age", "string", 0),
            ]),
        ),
        (
            columns::secret(),
            s(&[
                ("Name", "string", 0),
                ("Type", "string", 0),
                ("Data", "string", 0),
                ("Age", "string", 0),
            ]),
        ),
        (
            columns::core_event(),
            s(&[
                ("Last Seen", "string", 0),
                ("Type", "string", 0),
                ("Reason", "string", 0),
                ("Object", "string", 0),
                ("Subobject", "string", 1),
                ("Source", "string", 1),
                ("Message", "string", 0),
                ("First Seen", "string", 1),
                ("Count", "string", 1),
                ("Name", "string", 1),
            ]),
        ),
        (
            columns::service_account(),
            s(&[
                ("Name", "string", 0),
                ("Secrets", "string", 0),
                ("Age", "string", 0),
            ]),
        ),
        (
            columns::deployment(),
            s(&[
                ("Name", "string", 0),
                ("Ready", "string", 0),
                ("Up-to-date", "string", 0),
                ("Available", "string", 0),
                ("Age", "string", 0),
                ("Containers", "string", 1),
                ("Images", "string", 1),
                ("Selector", "string", 1),
            ]),
        ),
        (
            columns::replica_set(),
            s(&[
                ("Name", "string", 0),
                ("Desired", "integer", 0),
                ("Current", "integer", 0),
                ("Ready", "integer", 0),
                ("Age", "string", 0),
                ("Containers", "string", 1),
                ("Images", "string", 1),
                ("Selector", "string", 1),
            ]),
        ),
        (
            columns::endpoint_slice(),
            s(&[
                ("Name", "string", 0),
                ("AddressType", "string", 0),
                ("Ports", "string", 0),
                ("Endpoints", "string", 0),
                ("Age", "string", 0),
            ]),
        ),
        (
            columns::ingress(),
            s(&[
                ("Name", "string", 0),
                ("Class", "string", 0),
                ("Hosts", "string", 0),
                ("Address", "string", 0),
                ("Ports", "string", 0),
                ("Age", "string", 0),
            ]),
        ),
        (
            columns::ingress_class(),
            s(&[
                ("Name", "string", 0),
                ("Controller", "string", 0),
                ("Parameters", "string", 0),
                ("Age", "string", 0),
            ]),
        ),
        (
            columns::network_policy(),
            s(&[
                ("Name", "string", 0),
                ("Pod-Selector", "string", 0),
                ("Age", "string", 0),
            ]),
        ),
        (
            columns::lease(),
            s(&[
                ("Name", "string", 0),
                ("Holder", "string", 0),
                ("Age", "string", 0),
            ]),
        ),
    ];
    for (cols, want) in cases {
        // Every table has exactly one Name column with format "name"; every other format is empty.
        let names: Vec<_> = cols
            .iter()
            .filter(|c| c.format == "name")
            .map(|c| c.name)
            .collect();
        assert_eq!(names, vec!["Name"], "{want:?}");
        assert!(cols.iter().all(|c| !c.description.is_empty()), "{want:?}");
        assert_eq!(column_shape(cols), want);
    }
    assert_eq!(
        column_shape(columns::events_event()),
        column_shape(columns::core_event())
    );
}

#[test]
fn namespace_rows() {
    check(
        namespace_at,
        columns::namespace,
        vec![
            (
                json!({"metadata": meta("default"), "status": {"phase": "Active"}}),
                json!(["default", "Active", "5m10s"]),
            ),
            (
                json!({"metadata": {"name": "x"}}),
                json!(["x", "", "<unknown>"]),
            ),
            (
                json!({"metadata": {"name": "y", "creationTimestamp": "2024-06-01T12:00:30Z"}, "status": {"phase": "Terminating"}}),
                json!(["y", "Terminating", "<invalid>"]),
            ),
        ],
    );
}

#[test]
fn node_rows() {
    check(
        node_at,
        columns::node,
        vec![
            (
                json!({
                    "metadata": {"name": "n1", "creationTimestamp": "2024-05-27T12:00:00Z", "labels": {
                        "node-role.kubernetes.io/control-plane": "", "node-role.kubernetes.io/": "x",
                        "kubernetes.io/role": "worker"}},
                    "spec": {"unschedulable": true},
                    "status": {
                        "conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "True"}],
                        "addresses": [{"type": "Hostname", "address": "n1"}, {"type": "InternalIP", "address": "10.0.0.1"},
                                      {"type": "InternalIP", "address": "10.0.0.2"}],
                        "nodeInfo": {"kubeletVersion": "v1.30.0", "osImage": "Debian", "kernelVersion": "6.1",
                                     "containerRuntimeVersion": "", "architecture": "", "bootID": "", "kubeProxyVersion": "",
                                     "machineID": "", "operatingSystem": "", "systemUUID": ""}
                    }
                }),
                json!([
                    "n1",
                    "Ready,SchedulingDisabled",
                    "control-plane,worker",
                    "5d",
                    "v1.30.0",
                    "10.0.0.1",
                    "<none>",
                    "Debian",
                    "6.1",
                    "<unknown>"
                ]),
            ),
            (
                json!({"metadata": {"name": "n2"}, "status": {"conditions": [{"type": "Ready", "status": "Unknown"}],
                       "addresses": [{"type": "ExternalIP", "address": "203.0.113.9"}]}}),
                json!([
                    "n2",
                    "NotReady",
                    "<none>",
                    "<unknown>",
                    "",
                    "<none>",
                    "203.0.113.9",
                    "<unknown>",
                    "<unknown>",
                    "<unknown>"
                ]),
            ),
            (
                json!({"metadata": {"name": "n3"}}),
                json!([
                    "n3",
                    "Unknown",
                    "<none>",
                    "<unknown>",
                    "",
                    "<none>",
                    "<none>",
                    "<unknown>",
                    "<unknown>",
                    "<unknown>"
                ]),
            ),
        ],
    );
}

fn pod_json(spec: Value, status: Value) -> Value {
    json!({"metadata": meta("p"), "spec": spec, "status": status})
}

fn containers(names: &[&str]) -> Value {
    Value::Array(
        names
            .iter()
            .map(|n| json!({"name": n, "image": format!("{n}:1")}))
            .collect(),
    )
}

#[test]
fn pod_rows() {
    let running = json!({"running": {"startedAt": "2024-06-01T11:55:00Z"}});
    let two = json!({"containers": containers(&["a", "b"])});
    let cases = vec![
        // Pending, nothing reported yet.
        (
            pod_json(
                json!({"containers": containers(&["a"])}),
                json!({"phase": "Pending"}),
            ),
            json!([
                "p", "0/1", "Pending", "0", "5m10s", "<none>", "<none>", "<none>", "<none>"
            ]),
        ),
        // Scheduled, image being pulled.
        (
            pod_json(
                json!({"containers": containers(&["a"]), "nodeName": "n1"}),
                json!({"phase": "Pending", "containerStatuses": [
                    {"name": "a", "image": "a:1", "imageID": "", "ready": false, "restartCount": 0,
                     "state": {"waiting": {"reason": "ContainerCreating"}}}]}),
            ),
            json!([
                "p",
                "0/1",
                "ContainerCreating",
                "0",
                "5m10s",
                "<none>",
                "n1",
                "<none>",
                "<none>"
            ]),
        ),
        // Running, one of two ready; restarts with the last one 2m ago; two IPs, first shown.
        (
            pod_json(
                two.clone(),
                json!({"phase": "Running", "podIP": "10.1.0.5", "podIPs": [{"ip": "10.1.0.5"}, {"ip": "fd00::5"}],
                    "containerStatuses": [
                        {"name": "a", "image": "a:1", "imageID": "", "ready": true, "restartCount": 2, "state": running,
                         "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2024-06-01T11:58:00Z"}}},
                        {"name": "b", "image": "b:1", "imageID": "", "ready": false, "restartCount": 0, "state": running}]}),
            ),
            json!([
                "p",
                "1/2",
                "Running",
                "2 (2m ago)",
                "5m10s",
                "10.1.0.5",
                "<none>",
                "<none>",
                "<none>"
            ]),
        ),
        // CrashLoopBackOff wins over the phase.
        (
            pod_json(
                json!({"containers": containers(&["a"])}),
                json!({"phase": "Running", "containerStatuses": [
                    {"name": "a", "image": "a:1", "imageID": "", "ready": false, "restartCount": 5,
                     "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                     "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2024-06-01T11:59:30Z"}}}]}),
            ),
            json!([
                "p",
                "0/1",
                "CrashLoopBackOff",
                "5 (30s ago)",
                "5m10s",
                "<none>",
                "<none>",
                "<none>",
                "<none>"
            ]),
        ),
        // Completed, and a terminated container without reason shows its exit code / signal.
        (
            pod_json(
                two.clone(),
                json!({"phase": "Failed", "containerStatuses": [
                    {"name": "a", "image": "a:1", "imageID": "", "ready": false, "restartCount": 0,
                     "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
                    {"name": "b", "image": "b:1", "imageID": "", "ready": false, "restartCount": 0,
                     "state": {"terminated": {"exitCode": 137}}}]}),
            ),
            // Statuses are read last to first, so the first container's reason is the one kept.
            json!([
                "p",
                "0/2",
                "Completed",
                "0",
                "5m10s",
                "<none>",
                "<none>",
                "<none>",
                "<none>"
            ]),
        ),
        (
            pod_json(
                json!({"containers": containers(&["a"])}),
                json!({"phase": "Failed", "containerStatuses": [
                    {"name": "a", "image": "a:1", "imageID": "", "ready": false, "restartCount": 0,
                     "state": {"terminated": {"exitCode": 137, "signal": 9}}}]}),
            ),
            json!([
                "p", "0/1", "Signal:9", "0", "5m10s", "<none>", "<none>", "<none>", "<none>"
            ]),
        ),
        // A completed container beside a running one: Running when the pod is Ready, else NotReady.
        (
            pod_json(
                two.clone(),
                json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}], "containerStatuses": [
                    {"name": "a", "image": "a:1", "imageID": "", "ready": false, "restartCount": 0,
                     "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
                    {"name": "b", "image": "b:1", "imageID": "", "ready": true, "restartCount": 0, "state": running}]}),
            ),
            json!([
                "p", "1/2", "NotReady", "0", "5m10s", "<none>", "<none>", "<none>", "<none>"
            ]),
        ),
        // Init containers: the second of two is running.
        (
            pod_json(
                json!({"containers": containers(&["a"]), "initContainers": containers(&["i1", "i2"])}),
                json!({"phase": "Pending", "initContainerStatuses": [
                    {"name": "i1", "image": "i1:1", "imageID": "", "ready": true, "restartCount": 0,
                     "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
                    {"name": "i2", "image": "i2:1", "imageID": "", "ready": false, "restartCount": 1, "state": running}]}),
            ),
            json!([
                "p", "0/1", "Init:1/2", "1", "5m10s", "<none>", "<none>", "<none>", "<none>"
            ]),
        ),
        // Init container failing, with and without a reason.
        (
            pod_json(
                json!({"containers": containers(&["a"]), "initContainers": containers(&["i1"])}),
                json!({"phase": "Pending", "initContainerStatuses": [
                    {"name": "i1", "image": "i1:1", "imageID": "", "ready": false, "restartCount": 3,
                     "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}),
            ),
            json!([
                "p",
                "0/1",
                "Init:CrashLoopBackOff",
                "3",
                "5m10s",
                "<none>",
                "<none>",
                "<none>",
                "<none>"
            ]),
        ),
        (
            pod_json(
                json!({"containers": containers(&["a"]), "initContainers": containers(&["i1"])}),
                json!({"phase": "Pending", "initContainerStatuses": [
                    {"name": "i1", "image": "i1:1", "imageID": "", "ready": false, "restartCount": 0,
                     "state": {"terminated": {"exitCode": 2}}}]}),
            ),
            json!([
                "p",
                "0/1",
                "Init:ExitCode:2",
                "0",
                "5m10s",
                "<none>",
                "<none>",
                "<none>",
                "<none>"
            ]),
        ),
        (
            pod_json(
                json!({"containers": containers(&["a"]), "initContainers": containers(&["i1"])}),
                json!({"phase": "Pending", "initContainerStatuses": [
                    {"name": "i1", "image": "i1:1", "imageID": "", "ready": false, "restartCount": 0,
                     "state": {"waiting": {"reason": "PodInitializing"}}}]}),
            ),
            json!([
                "p", "0/1", "Init:0/1", "0", "5m10s", "<none>", "<none>", "<none>", "<none>"
            ]),
        ),
        // A sidecar (restartable init container) counts as a container once started.
        (
            pod_json(
                json!({"containers": containers(&["a"]),
                       "initContainers": [{"name": "side", "image": "s:1", "restartPolicy": "Always"}]}),
                json!({"phase": "Running", "conditions": [{"type": "Initialized", "status": "True"}],
                    "initContainerStatuses": [
                        {"name": "side", "image": "s:1", "imageID": "", "ready": true, "started": true, "restartCount": 1,
                         "state": running, "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2024-06-01T11:00:00Z"}}}],
                    "containerStatuses": [
                        {"name": "a", "image": "a:1", "imageID": "", "ready": true, "restartCount": 0, "state": running}]}),
            ),
            json!([
                "p",
                "2/2",
                "Running",
                "1 (60m ago)",
                "5m10s",
                "<none>",
                "<none>",
                "<none>",
                "<none>"
            ]),
        ),
        // Scheduling gates.
        (
            pod_json(
                json!({"containers": containers(&["a"])}),
                json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}),
            ),
            json!([
                "p",
                "0/1",
                "SchedulingGated",
                "0",
                "5m10s",
                "<none>",
                "<none>",
                "<none>",
                "<none>"
            ]),
        ),
        // Status reason (e.g. Evicted) replaces the phase.
        (
            pod_json(
                json!({"containers": containers(&["a"])}),
                json!({"phase": "Failed", "reason": "Evicted"}),
            ),
            json!([
                "p", "0/1", "Evicted", "0", "5m10s", "<none>", "<none>", "<none>", "<none>"
            ]),
        ),
        // Readiness gates and nominated node.
        (
            pod_json(
                json!({"containers": containers(&["a"]), "readinessGates": [{"conditionType": "x/ok"}, {"conditionType": "x/lb"}]}),
                json!({"phase": "Pending", "nominatedNodeName": "n9",
                       "conditions": [{"type": "x/ok", "status": "True"}, {"type": "x/lb", "status": "False"}]}),
            ),
            json!([
                "p", "0/1", "Pending", "0", "5m10s", "<none>", "<none>", "n9", "1/2"
            ]),
        ),
    ];
    check(pod_at, columns::pod, cases);

    // Deletion: Terminating unless already terminal; NodeLost reads Unknown.
    let deleting = |phase: &str, reason: Option<&str>| {
        let mut m = meta("p");
        m["deletionTimestamp"] = json!("2024-06-01T11:59:00Z");
        let mut status = json!({"phase": phase});
        if let Some(r) = reason {
            status["reason"] = json!(r);
        }
        json!({"metadata": m, "spec": {"containers": containers(&["a"])}, "status": status})
    };
    check(
        pod_at,
        columns::pod,
        vec![
            (
                deleting("Running", None),
                json!([
                    "p",
                    "0/1",
                    "Terminating",
                    "0",
                    "5m10s",
                    "<none>",
                    "<none>",
                    "<none>",
                    "<none>"
                ]),
            ),
            (
                deleting("Succeeded", None),
                json!([
                    "p",
                    "0/1",
                    "Succeeded",
                    "0",
                    "5m10s",
                    "<none>",
                    "<none>",
                    "<none>",
                    "<none>"
                ]),
            ),
            (
                deleting("Running", Some("NodeLost")),
                json!([
                    "p", "0/1", "Unknown", "0", "5m10s", "<none>", "<none>", "<none>", "<none>"
                ]),
            ),
        ],
    );
}

fn svc(spec: Value, status: Value) -> Value {
    json!({"metadata": meta("s"), "spec": spec, "status": status})
}

#[test]
fn service_rows() {
    check(
        service_at,
        columns::service,
        vec![
            (
                svc(
                    json!({"type": "ClusterIP", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10", "fd00::a"],
                           "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}],
                           "selector": {"k8s-app": "dns", "a": "b"}}),
                    json!({}),
                ),
                json!([
                    "s",
                    "ClusterIP",
                    "10.96.0.10",
                    "<none>",
                    "53/UDP,53/TCP",
                    "5m10s",
                    "a=b,k8s-app=dns"
                ]),
            ),
            (
                svc(
                    json!({"type": "NodePort", "clusterIPs": ["10.96.0.11"], "externalIPs": ["198.18.0.1", "198.18.0.2"],
                           "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}]}),
                    json!({}),
                ),
                json!([
                    "s",
                    "NodePort",
                    "10.96.0.11",
                    "198.18.0.1,198.18.0.2",
                    "80:30080/TCP",
                    "5m10s",
                    "<none>"
                ]),
            ),
            (
                svc(
                    json!({"type": "LoadBalancer", "clusterIPs": ["10.96.0.12"], "ports": [{"port": 443, "nodePort": 31443, "protocol": "TCP"}]}),
                    json!({}),
                ),
                json!([
                    "s",
                    "LoadBalancer",
                    "10.96.0.12",
                    "<pending>",
                    "443:31443/TCP",
                    "5m10s",
                    "<none>"
                ]),
            ),
            (
                svc(
                    json!({"type": "LoadBalancer", "clusterIPs": ["10.96.0.12"], "externalIPs": ["198.18.0.9"]}),
                    json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.2"}, {"hostname": "lb.example.com"}, {"ip": "203.0.113.1"}]}}),
                ),
                json!([
                    "s",
                    "LoadBalancer",
                    "10.96.0.12",
                    "203.0.113.1,203.0.113.2,lb.example.com,198.18.0.9",
                    "<none>",
                    "5m10s",
                    "<none>"
                ]),
            ),
            (
                svc(
                    json!({"type": "ExternalName", "externalName": "db.example.com"}),
                    json!({}),
                ),
                json!([
                    "s",
                    "ExternalName",
                    "<none>",
                    "db.example.com",
                    "<none>",
                    "5m10s",
                    "<none>"
                ]),
            ),
            (
                svc(
                    json!({"clusterIP": "None", "clusterIPs": ["None"]}),
                    json!({}),
                ),
                json!(["s", "", "None", "<unknown>", "<none>", "5m10s", "<none>"]),
            ),
        ],
    );
}

#[test]
fn endpoints_rows() {
    let addrs = |ips: &[&str]| Value::Array(ips.iter().map(|ip| json!({"ip": ip})).collect());
    check(
        endpoints_at,
        columns::endpoints,
        vec![
            (
                json!({"metadata": meta("e")}),
                json!(["e", "<none>", "5m10s"]),
            ),
            (
                json!({"metadata": meta("e"), "subsets": [{"addresses": addrs(&["10.0.0.1", "10.0.0.2"]), "ports": [{"port": 80}]}]}),
                json!(["e", "10.0.0.1:80,10.0.0.2:80", "5m10s"]),
            ),
            (
                json!({"metadata": meta("e"), "subsets": [
                    {"addresses": addrs(&["10.0.0.1", "10.0.0.2"]), "ports": [{"port": 80}, {"port": 443}]}]}),
                json!([
                    "e",
                    "10.0.0.1:80,10.0.0.2:80,10.0.0.1:443 + 1 more...",
                    "5m10s"
                ]),
            ),
            (
                json!({"metadata": meta("e"), "subsets": [{"addresses": addrs(&["fd00::1"]), "ports": [{"port": 80}]},
                                                          {"addresses": addrs(&["10.0.0.3", "10.0.0.4", "10.0.0.5"])}]}),
                json!(["e", "[fd00::1]:80,10.0.0.3,10.0.0.4 + 1 more...", "5m10s"]),
            ),
            (
                json!({"metadata": meta("e"), "subsets": [{"ports": [{"port": 80}]}]}),
                json!(["e", "", "5m10s"]),
            ),
        ],
    );
}

#[test]
fn endpoint_slice_rows() {
    check(
        endpoint_slice_at,
        columns::endpoint_slice,
        vec![
            (
                json!({"metadata": meta("es"), "addressType": "IPv4", "endpoints": []}),
                json!(["es", "IPv4", "<unset>", "<unset>", "5m10s"]),
            ),
            (
                json!({"metadata": meta("es"), "addressType": "IPv4",
                       "ports": [{"port": 80}, {"name": "dns"}, {}, {"port": 9}],
                       "endpoints": [{"addresses": ["10.0.0.1"]}, {"addresses": ["10.0.0.2", "10.0.0.3"]}, {"addresses": ["10.0.0.4"]}]}),
                json!([
                    "es",
                    "IPv4",
                    "80,dns,* + 1 more...",
                    "10.0.0.1,10.0.0.2,10.0.0.3 + 1 more...",
                    "5m10s"
                ]),
            ),
        ],
    );
}

#[test]
fn small_kinds_rows() {
    check(
        config_map_at,
        columns::config_map,
        vec![
            (json!({"metadata": meta("c")}), json!(["c", 0, "5m10s"])),
            (
                json!({"metadata": meta("c"), "data": {"a": "1", "b": "2"}, "binaryData": {"c": "AA=="}}),
                json!(["c", 3, "5m10s"]),
            ),
        ],
    );
    check(
        secret_at,
        columns::secret,
        vec![
            (
                json!({"metadata": meta("s"), "type": "Opaque", "data": {"a": "MQ=="}, "stringData": {"a": "x", "b": "y"}}),
                json!(["s", "Opaque", 2, "5m10s"]),
            ),
            (json!({"metadata": meta("s")}), json!(["s", "", 0, "5m10s"])),
        ],
    );
    check(
        service_account_at,
        columns::service_account,
        vec![
            (json!({"metadata": meta("sa")}), json!(["sa", 0, "5m10s"])),
            (
                json!({"metadata": meta("sa"), "secrets": [{"name": "t"}]}),
                json!(["sa", 1, "5m10s"]),
            ),
        ],
    );
    check(
        lease_at,
        columns::lease,
        vec![
            (
                json!({"metadata": meta("l"), "spec": {"holderIdentity": "ferry-1"}}),
                json!(["l", "ferry-1", "5m10s"]),
            ),
            (json!({"metadata": meta("l")}), json!(["l", "", "5m10s"])),
        ],
    );
}

#[test]
fn workload_rows() {
    let template = json!({"metadata": {"labels": {"app": "web"}}, "spec": {"containers": containers(&["web", "side"])}});
    check(
        deployment_at,
        columns::deployment,
        vec![
            (
                json!({"metadata": meta("d"), "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}}, "template": template},
                       "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2}}),
                json!([
                    "d",
                    "2/3",
                    3,
                    2,
                    "5m10s",
                    "web,side",
                    "web:1,side:1",
                    "app=web"
                ]),
            ),
            (
                json!({"metadata": meta("d"), "spec": {"selector": {}, "template": {}}}),
                json!(["d", "0/0", 0, 0, "5m10s", "", "", ""]),
            ),
            (
                json!({"metadata": meta("d"), "spec": {"replicas": 1, "template": {},
                       "selector": {"matchExpressions": [{"key": "app", "operator": "Bad"}]}}}),
                json!(["d", "0/1", 0, 0, "5m10s", "", "", "<invalid>"]),
            ),
        ],
    );
    check(
        replica_set_at,
        columns::replica_set,
        vec![
            (
                json!({"metadata": meta("rs"), "spec": {"replicas": 3, "template": template,
                       "selector": {"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}]}},
                       "status": {"replicas": 3, "readyReplicas": 1}}),
                json!([
                    "rs",
                    3,
                    3,
                    1,
                    "5m10s",
                    "web,side",
                    "web:1,side:1",
                    "app=web,tier notin (db)"
                ]),
            ),
            (
                json!({"metadata": meta("rs"), "spec": {"selector": {}}, "status": {"replicas": 0}}),
                json!(["rs", 0, 0, 0, "5m10s", "", "", "<none>"]),
            ),
            (
                json!({"metadata": meta("rs"), "spec": {"selector": {"matchLabels": {"a b": "c"}}}, "status": {"replicas": 0}}),
                json!(["rs", 0, 0, 0, "5m10s", "", "", "<error>"]),
            ),
        ],
    );
}

#[test]
fn networking_rows() {
    check(
        ingress_at,
        columns::ingress,
        vec![
            (
                json!({"metadata": meta("i"), "spec": {}}),
                json!(["i", "<none>", "*", "", "80", "5m10s"]),
            ),
            (
                json!({"metadata": meta("i"), "spec": {"ingressClassName": "ferry", "tls": [{"hosts": ["a.test"]}],
                        "rules": [{"host": "a.test"}, {}, {"host": "b.test"}, {"host": "c.test"}, {"host": "d.test"}]},
                       "status": {"loadBalancer": {"ingress": [{"ip": "198.18.0.5"}, {"hostname": "lb.test"}]}}}),
                json!([
                    "i",
                    "ferry",
                    "a.test,b.test,c.test + 2 more...",
                    "198.18.0.5,lb.test",
                    "80, 443",
                    "5m10s"
                ]),
            ),
        ],
    );
    check(
        ingress_class_at,
        columns::ingress_class,
        vec![
            (
                json!({"metadata": meta("ic"), "spec": {"controller": "ferry.dev/ingress"}}),
                json!(["ic", "ferry.dev/ingress", "<none>", "5m10s"]),
            ),
            (
                json!({"metadata": meta("ic"), "spec": {"controller": "c", "parameters": {"apiGroup": "k8s.example.com", "kind": "Params", "name": "p1"}}}),
                json!(["ic", "c", "Params.k8s.example.com/p1", "5m10s"]),
            ),
            (
                json!({"metadata": meta("ic"), "spec": {"controller": "c", "parameters": {"kind": "ConfigMap", "name": "p2"}}}),
                json!(["ic", "c", "ConfigMap/p2", "5m10s"]),
            ),
        ],
    );
    check(
        network_policy_at,
        columns::network_policy,
        vec![
            (
                json!({"metadata": meta("np"), "spec": {"podSelector": {}}}),
                json!(["np", "<none>", "5m10s"]),
            ),
            (
                json!({"metadata": meta("np"), "spec": {"podSelector": {"matchLabels": {"role": "db"},
                        "matchExpressions": [{"key": "env", "operator": "Exists"}]}}}),
                json!(["np", "env,role=db", "5m10s"]),
            ),
        ],
    );
}

#[test]
fn event_rows() {
    check(
        core_event_at,
        columns::core_event,
        vec![
            (
                json!({"metadata": meta("p.1"), "involvedObject": {"kind": "Pod", "name": "web-1", "fieldPath": "spec.containers{web}"},
                       "type": "Normal", "reason": "Pulled", "message": "  Pulled image \n", "count": 4,
                       "source": {"component": "kubelet", "host": "n1"},
                       "firstTimestamp": "2024-06-01T11:00:00Z", "lastTimestamp": "2024-06-01T11:59:00Z"}),
                json!([
                    "60s",
                    "Normal",
                    "Pulled",
                    "pod/web-1",
                    "spec.containers{web}",
                    "kubelet, n1",
                    "Pulled image",
                    "60m",
                    4,
                    "p.1"
                ]),
            ),
            (
                json!({"metadata": meta("x.1"), "involvedObject": {"kind": "Node"}, "type": "Warning", "reason": "R",
                       "eventTime": "2024-06-01T11:58:00.000000Z", "reportingComponent": "ferry-controller",
                       "reportingInstance": "ferry-1"}),
                json!([
                    "2m",
                    "Warning",
                    "R",
                    "node",
                    "",
                    "ferry-controller, ferry-1",
                    "",
                    "2m",
                    1,
                    "x.1"
                ]),
            ),
            (
                json!({"metadata": meta("y.1"), "involvedObject": {"kind": "Service", "name": "s"},
                       "eventTime": "2024-06-01T11:00:00.000000Z",
                       "series": {"count": 7, "lastObservedTime": "2024-06-01T11:59:50.000000Z"},
                       "source": {"component": "c"}}),
                json!(["10s", "", "", "service/s", "", "c", "", "60m", 7, "y.1"]),
            ),
            (
                json!({"metadata": {"name": "z"}, "involvedObject": {}}),
                json!(["<unknown>", "", "", "", "", "", "", "<unknown>", 1, "z"]),
            ),
        ],
    );
    check(
        events_event_at,
        columns::events_event,
        vec![
            (
                json!({"metadata": meta("p.1"), "eventTime": "2024-06-01T11:58:00.000000Z",
                       "regarding": {"kind": "Pod", "name": "web-1", "fieldPath": "spec.containers{web}"},
                       "type": "Normal", "reason": "Started", "note": "Started container", "reportingController": "kubelet",
                       "reportingInstance": "n1"}),
                json!([
                    "2m",
                    "Normal",
                    "Started",
                    "pod/web-1",
                    "spec.containers{web}",
                    "kubelet, n1",
                    "Started container",
                    "2m",
                    1,
                    "p.1"
                ]),
            ),
            (
                json!({"metadata": meta("q.1"), "eventTime": "2024-06-01T11:00:00.000000Z",
                       "regarding": {"kind": "Deployment", "name": "d"}, "deprecatedSource": {"component": "dc"},
                       "deprecatedFirstTimestamp": "2024-06-01T11:30:00Z", "deprecatedLastTimestamp": "2024-06-01T11:57:00Z",
                       "deprecatedCount": 3}),
                json!(["3m", "", "", "deployment/d", "", "dc", "", "30m", 3, "q.1"]),
            ),
            (
                json!({"metadata": meta("r.1"), "eventTime": "2024-06-01T11:00:00.000000Z",
                       "regarding": {"kind": "Pod", "name": "p"},
                       "series": {"count": 9, "lastObservedTime": "2024-06-01T11:59:00.000000Z"}}),
                json!(["60s", "", "", "pod/p", "", "", "", "60m", 9, "r.1"]),
            ),
        ],
    );
}

#[test]
fn row_wrappers_use_the_current_time() {
    let ns: core::Namespace =
        obj(json!({"metadata": {"name": "n", "creationTimestamp": "2000-01-01T00:00:00Z"}}));
    let row = namespace(&ns);
    let age = row[2].as_str().expect("age");
    assert!(age.ends_with('y'), "{age}");
}
