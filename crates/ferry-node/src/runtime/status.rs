//! Status rendering: the pod status this agent maintains (`StatusBook`) and how container states
//! are written as JSON.

use super::*;

/// The pod status this agent maintains.
pub(super) struct StatusBook {
    pub(super) host_ips: Vec<String>,
    pub(super) pod_ips: Vec<String>,
    pub(super) start_time: String,
    pub(super) sandbox_ready: bool,
    pub(super) init_done: bool,
    pub(super) init_failed: bool,
    pub(super) policy: String,
    pub(super) containers: Vec<podstate::Container>,
    pub(super) init_containers: Vec<podstate::Container>,
    pub(super) transitions: HashMap<&'static str, (bool, String)>,
    pub(super) scheduled: Option<Value>,
    pub(super) last_sent: Option<Value>,
}

impl StatusBook {
    pub(super) fn new(pod: &Pod, node_ips: &[IpAddr]) -> StatusBook {
        let spec = pod.spec.clone().unwrap_or_default();
        let scheduled = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"))
            .and_then(|c| serde_json::to_value(c).ok());
        StatusBook {
            host_ips: node_ips.iter().map(|i| i.to_string()).collect(),
            pod_ips: Vec::new(),
            start_time: pod
                .status
                .as_ref()
                .and_then(|s| s.start_time.as_ref())
                .and_then(|t| serde_json::to_value(t).ok())
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_else(now),
            sandbox_ready: false,
            init_done: spec.init_containers.as_ref().is_none_or(|v| v.is_empty()),
            init_failed: false,
            policy: spec
                .restart_policy
                .clone()
                .unwrap_or_else(|| "Always".into()),
            init_containers: spec
                .init_containers
                .iter()
                .flatten()
                .map(|c| podstate::Container {
                    name: c.name.clone(),
                    image: c.image.clone().unwrap_or_default(),
                    state: State::Waiting {
                        reason: "PodInitializing".into(),
                        message: None,
                    },
                    last: None,
                    restart_count: 0,
                    ready: false,
                    started: false,
                })
                .collect(),
            containers: spec
                .containers
                .iter()
                .map(|c| podstate::Container {
                    name: c.name.clone(),
                    image: c.image.clone().unwrap_or_default(),
                    state: State::Waiting {
                        reason: "ContainerCreating".into(),
                        message: None,
                    },
                    last: None,
                    restart_count: 0,
                    ready: false,
                    started: false,
                })
                .collect(),
            transitions: HashMap::new(),
            scheduled,
            last_sent: None,
        }
    }

    pub(super) fn set_init(&mut self, name: &str, state: State) {
        if let Some(c) = self.init_containers.iter_mut().find(|c| c.name == name) {
            c.ready = matches!(&state, State::Terminated(t) if t.exit_code == 0);
            c.started = matches!(state, State::Running { .. });
            c.state = state;
        }
    }

    pub(super) fn set_state(&mut self, name: &str, state: State, restart_count: i32) {
        if let Some(c) = self.containers.iter_mut().find(|c| c.name == name) {
            if let State::Terminated(t) = &c.state
                && !matches!(state, State::Terminated(_))
            {
                c.last = Some(t.clone());
            }
            if !matches!(state, State::Running { .. }) {
                c.ready = false;
                c.started = false;
            }
            c.state = state;
            c.restart_count = restart_count;
        }
    }

    pub(super) fn apply(&mut self, u: Update) {
        match u {
            Update::State {
                name,
                state,
                restart_count,
            } => self.set_state(&name, state, restart_count),
            Update::Ready { name, ready } => {
                if let Some(c) = self.containers.iter_mut().find(|c| c.name == name) {
                    c.ready = ready && matches!(c.state, State::Running { .. });
                }
            }
            Update::Started { name, started } => {
                if let Some(c) = self.containers.iter_mut().find(|c| c.name == name) {
                    c.started = started;
                }
            }
        }
    }

    pub(super) fn render(&mut self, final_: bool) -> Value {
        let phase = if self.init_failed {
            if self.policy == "Never" {
                "Failed"
            } else {
                "Pending"
            }
        } else if final_ {
            // Containers stopped because of the deletion: kubelet reports the terminal phase
            // from the exit codes (Succeeded only if all exited 0).
            let all_ok = self
                .containers
                .iter()
                .all(|c| matches!(&c.state, State::Terminated(t) if t.exit_code == 0));
            let p = podstate::phase(&self.containers, &self.policy, self.init_done);
            if p == "Running" || p == "Pending" {
                if all_ok { "Succeeded" } else { "Failed" }
            } else {
                p
            }
        } else {
            podstate::phase(&self.containers, &self.policy, self.init_done)
        };
        let conds =
            podstate::conditions(&self.containers, phase, self.sandbox_ready, self.init_done);
        let ts = now();
        let mut conditions: Vec<Value> = Vec::new();
        for c in conds {
            let entry = self
                .transitions
                .entry(c.type_)
                .or_insert_with(|| (c.status, ts.clone()));
            if entry.0 != c.status {
                *entry = (c.status, ts.clone());
            }
            let mut v = json!({
                "type": c.type_,
                "status": if c.status { "True" } else { "False" },
                "lastProbeTime": null,
                "lastTransitionTime": entry.1,
            });
            if let Some(r) = c.reason {
                v["reason"] = json!(r);
            }
            if let Some(m) = c.message {
                v["message"] = json!(m);
            }
            conditions.push(v);
        }
        if let Some(s) = &self.scheduled {
            conditions.push(s.clone());
        }
        let statuses: Vec<Value> = self
            .containers
            .iter()
            .map(|c| {
                let mut v = json!({
                    "name": c.name,
                    "image": c.image,
                    "imageID": format!("ferry://{}", c.image),
                    "ready": c.ready,
                    "started": c.started,
                    "restartCount": c.restart_count,
                    "state": state_json(&c.state),
                    "lastState": c.last.as_ref().map(|t| json!({"terminated": term_json(t)})).unwrap_or(json!({})),
                });
                if !matches!(c.state, State::Waiting { .. }) {
                    v["containerID"] = json!(format!("ferry://{}-{}", c.name, c.restart_count));
                }
                v
            })
            .collect();
        let mut status = json!({
            "phase": phase,
            "conditions": conditions,
            "hostIP": self.host_ips.first(),
            "hostIPs": self.host_ips.iter().map(|i| json!({"ip": i})).collect::<Vec<_>>(),
            "startTime": self.start_time,
            "containerStatuses": statuses,
        });
        if !self.init_containers.is_empty() {
            status["initContainerStatuses"] = json!(
                self.init_containers
                    .iter()
                    .map(|c| {
                        let mut v = json!({
                            "name": c.name,
                            "image": c.image,
                            "imageID": format!("ferry://{}", c.image),
                            "ready": c.ready,
                            "started": c.started,
                            "restartCount": c.restart_count,
                            "state": state_json(&c.state),
                            "lastState": {},
                        });
                        if !matches!(c.state, State::Waiting { .. }) {
                            v["containerID"] = json!(format!("ferry://{}-0", c.name));
                        }
                        v
                    })
                    .collect::<Vec<_>>()
            );
        }
        if !self.pod_ips.is_empty() {
            status["podIP"] = json!(self.pod_ips[0]);
            status["podIPs"] = json!(
                self.pod_ips
                    .iter()
                    .map(|i| json!({"ip": i}))
                    .collect::<Vec<_>>()
            );
        }
        status
    }

    pub(super) async fn push(&mut self, pods: &Api<Pod>, name: &str, final_: bool) {
        let status = self.render(final_);
        if self.last_sent.as_ref() == Some(&status) {
            return;
        }
        let body = json!({"status": status});
        match pods
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&body))
            .await
        {
            Ok(_) => self.last_sent = Some(status),
            Err(e) => crate::node::log_api_error(&format!("status of {name}"), &e),
        }
    }
}

pub(super) fn term_json(t: &Terminated) -> Value {
    let mut v = json!({
        "exitCode": t.exit_code,
        "reason": t.reason,
        "finishedAt": t.finished_at,
        "containerID": "ferry://",
    });
    if let Some(s) = &t.started_at {
        v["startedAt"] = json!(s);
    }
    if let Some(s) = t.signal {
        v["signal"] = json!(s);
    }
    if let Some(m) = &t.message {
        v["message"] = json!(m);
    }
    v
}

pub(super) fn state_json(s: &State) -> Value {
    match s {
        State::Waiting { reason, message } => {
            let mut w = json!({"reason": reason});
            if let Some(m) = message {
                w["message"] = json!(m);
            }
            json!({"waiting": w})
        }
        State::Running { started_at } => json!({"running": {"startedAt": started_at}}),
        State::Terminated(t) => json!({"terminated": term_json(t)}),
    }
}

#[cfg(test)]
mod status_tests {
    use super::*;

    #[test]
    fn init_container_statuses_are_reported() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {"initContainers": [{"name": "wait", "image": "busybox"}],
                     "containers": [{"name": "c", "image": "busybox"}]}
        }))
        .expect("pod");
        let mut book = StatusBook::new(&pod, &[]);
        let s = book.render(false);
        assert_eq!(
            s["initContainerStatuses"][0]["state"]["waiting"]["reason"],
            "PodInitializing"
        );
        book.set_init(
            "wait",
            State::Running {
                started_at: "t".into(),
            },
        );
        let s = book.render(false);
        assert_eq!(
            s["initContainerStatuses"][0]["state"]["running"]["startedAt"],
            "t"
        );
        assert_eq!(s["phase"], "Pending");
    }
}
