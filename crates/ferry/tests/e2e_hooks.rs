//! Lifecycle hooks through the real binary (issue 27): a preStop hook (`sleep` and `exec`
//! handlers) keeps a deleted pod Terminating within its grace period while its EndpointSlice
//! endpoint is `ready: false, serving: true, terminating: true`; a failing postStart hook kills
//! the container with a `FailedPostStartHook` Warning Event.

mod common;

use std::time::{Duration, Instant};

use common::{Ferry, eventually, json};

const PODS: &str = r#"
apiVersion: v1
kind: Service
metadata:
  name: hooks
spec:
  selector:
    app: hooks
  ports:
  - port: 80
---
apiVersion: v1
kind: Pod
metadata:
  name: sleepy
  labels:
    app: hooks
spec:
  terminationGracePeriodSeconds: 120
  containers:
  - name: c
    image: busybox
    command: ["sh", "-c", "echo up; exec sleep 3600"]
    lifecycle:
      preStop:
        sleep:
          seconds: 8
---
apiVersion: v1
kind: Pod
metadata:
  name: execy
  labels:
    app: hooks
spec:
  terminationGracePeriodSeconds: 120
  containers:
  - name: c
    image: busybox
    command: ["sh", "-c", "echo up; exec sleep 3600"]
    lifecycle:
      postStart:
        exec:
          command: ["sh", "-c", "exit 0"]
      preStop:
        exec:
          command: ["sleep", "8"]
"#;

/// The endpoint conditions (ready, serving, terminating) of pod `name` in Service `hooks`'s
/// EndpointSlices.
fn conditions(f: &Ferry, name: &str) -> Option<(bool, bool, bool)> {
    let o = f.kubectl(&[
        "get",
        "endpointslices",
        "-l",
        "kubernetes.io/service-name=hooks",
        "-o",
        "json",
    ]);
    if !o.status.success() {
        return None;
    }
    let v = json(&String::from_utf8_lossy(&o.stdout));
    for s in v["items"].as_array().into_iter().flatten() {
        for e in s["endpoints"].as_array().into_iter().flatten() {
            if e["targetRef"]["name"] == name {
                let c = &e["conditions"];
                let b = |k: &str| c[k].as_bool().unwrap_or(false);
                return Some((b("ready"), b("serving"), b("terminating")));
            }
        }
    }
    None
}

fn exists(f: &Ferry, pod: &str) -> bool {
    let o = f.kubectl(&["get", "pod", pod, "-o", "name"]);
    o.status.success()
}

#[test]
fn pre_stop_keeps_the_pod_terminating_and_its_endpoint_serving() {
    let f = Ferry::start();
    let o = f.k_stdin("kubectl", &["apply", "-f", "-"], PODS);
    assert!(o.status.success(), "{o:?}");
    for pod in ["sleepy", "execy"] {
        f.k(
            "kubectl",
            &[
                "wait",
                "--for=condition=Ready",
                &format!("pod/{pod}"),
                "--timeout=120s",
            ],
        );
        assert!(
            eventually(60, || conditions(&f, pod) == Some((true, true, false))),
            "{pod}: endpoint never ready: {:?}\n{}",
            conditions(&f, pod),
            f.log()
        );
    }
    let t0 = Instant::now();
    f.k(
        "kubectl",
        &["delete", "pod", "sleepy", "execy", "--wait=false"],
    );
    for pod in ["sleepy", "execy"] {
        // While preStop runs the pod is Terminating, still Ready: serving, terminating.
        assert!(
            eventually(30, || conditions(&f, pod) == Some((false, true, true))),
            "{pod}: endpoint not serving+terminating: {:?}\n{}",
            conditions(&f, pod),
            f.log()
        );
    }
    // The hooks take 8 s: after 4 s both pods are still there.
    let four = Duration::from_secs(4);
    if let Some(left) = four.checked_sub(t0.elapsed()) {
        std::thread::sleep(left);
    }
    for pod in ["sleepy", "execy"] {
        assert!(
            exists(&f, pod),
            "{pod} went before its preStop hook ended ({:?} after the delete)\n{}",
            t0.elapsed(),
            f.log()
        );
    }
    // ... and go once the hook is done and the container stopped (well within the 120 s).
    assert!(
        eventually(60, || !exists(&f, "sleepy") && !exists(&f, "execy")),
        "pods still there {:?} after the delete\n{}",
        t0.elapsed(),
        f.log()
    );
    eprintln!("pods gone {:?} after the delete", t0.elapsed());
}

#[test]
fn failed_post_start_hook_kills_the_container() {
    let f = Ferry::start();
    let pod = r#"
apiVersion: v1
kind: Pod
metadata:
  name: hooked
spec:
  restartPolicy: Never
  containers:
  - name: c
    image: busybox
    command: ["sh", "-c", "exec sleep 3600"]
    lifecycle:
      postStart:
        exec:
          command: ["sh", "-c", "echo no; exit 3"]
"#;
    let o = f.k_stdin("kubectl", &["apply", "-f", "-"], pod);
    assert!(o.status.success(), "{o:?}");
    let event = || {
        let o = f.kubectl(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=hooked,reason=FailedPostStartHook",
            "-o",
            "json",
        ]);
        let v = json(&String::from_utf8_lossy(&o.stdout));
        v["items"].as_array().and_then(|i| i.first()).cloned()
    };
    assert!(
        eventually(60, || event().is_some()),
        "no FailedPostStartHook event\n{}",
        f.log()
    );
    let e = event().unwrap_or_default();
    assert_eq!(e["type"], "Warning", "{e}");
    let msg = e["message"].as_str().unwrap_or_default();
    assert!(
        msg.starts_with("Exec lifecycle hook ([sh -c echo no; exit 3]) for Container \"c\"")
            && msg.contains("exited with 3"),
        "{msg}"
    );
    // Killed, and with restartPolicy Never not restarted: the pod fails.
    assert!(
        eventually(60, || {
            let o = f.kubectl(&["get", "pod", "hooked", "-o", "json"]);
            let v = json(&String::from_utf8_lossy(&o.stdout));
            let code = v["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"]
                .as_i64()
                .unwrap_or(0);
            v["status"]["phase"] == "Failed" && code != 0
        }),
        "pod not Failed with its container killed:\n{}\n{}",
        f.k("kubectl", &["get", "pod", "hooked", "-o", "yaml"]),
        f.log()
    );
}
