//! Pure pod lifecycle decisions: phase and conditions from container states (kubelet's
//! `getPhase`/`generateAPIPodStatus`), restart decisions, restart back-off, probe thresholds.

use std::time::Duration;

/// The state of one container as the agent tracks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Waiting {
        reason: String,
        message: Option<String>,
    },
    Running {
        started_at: String,
    },
    Terminated(Terminated),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Terminated {
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub reason: String,
    pub message: Option<String>,
    pub started_at: Option<String>,
    pub finished_at: String,
}

impl Terminated {
    /// `Completed` for exit 0, `Error` otherwise (as containerd reports), unless a reason is set.
    pub fn reason_for(exit_code: i32) -> &'static str {
        if exit_code == 0 { "Completed" } else { "Error" }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    pub name: String,
    pub image: String,
    pub state: State,
    pub last: Option<Terminated>,
    pub restart_count: i32,
    pub ready: bool,
    pub started: bool,
}

/// The pod phase (kubelet's `getPhase`, regular containers).
pub fn phase(containers: &[Container], restart_policy: &str, init_done: bool) -> &'static str {
    if !init_done {
        return "Pending";
    }
    let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for c in containers {
        match &c.state {
            State::Running { .. } => running += 1,
            State::Terminated(t) => {
                stopped += 1;
                if t.exit_code == 0 {
                    succeeded += 1;
                }
            }
            State::Waiting { .. } => {
                if c.last.is_some() {
                    stopped += 1;
                } else {
                    waiting += 1;
                }
            }
        }
    }
    if waiting > 0 {
        return "Pending";
    }
    if running > 0 {
        return "Running";
    }
    if stopped > 0 {
        if restart_policy == "Always" {
            return "Running";
        }
        if stopped == succeeded {
            return "Succeeded";
        }
        if restart_policy == "Never" {
            return "Failed";
        }
        // OnFailure: a failed container will be restarted. Waiting ones with a last state
        // are restarting; terminated ones that failed are about to.
        let all_done = containers
            .iter()
            .all(|c| matches!(&c.state, State::Terminated(t) if t.exit_code == 0));
        return if all_done { "Succeeded" } else { "Running" };
    }
    "Pending"
}

/// Whether a container that exited with `exit_code` is restarted under `restart_policy`.
pub fn should_restart(restart_policy: &str, exit_code: i32) -> bool {
    match restart_policy {
        "Never" => false,
        "OnFailure" => exit_code != 0,
        _ => true,
    }
}

/// One pod condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    pub type_: &'static str,
    pub status: bool,
    pub reason: Option<String>,
    pub message: Option<String>,
}

/// `PodReadyToStartContainers`, `Initialized`, `ContainersReady`, `Ready` as kubelet computes
/// them (`PodScheduled` is the scheduler's and kept as is). A pod being deleted stays Ready while
/// its containers run and pass readiness (kubelet keeps probing during graceful termination),
/// so its endpoints are `serving` and `terminating` until it stops.
pub fn conditions(
    containers: &[Container],
    phase: &str,
    sandbox_ready: bool,
    init_done: bool,
) -> Vec<Condition> {
    let mut out = vec![Condition {
        type_: "PodReadyToStartContainers",
        status: sandbox_ready && !matches!(phase, "Succeeded" | "Failed"),
        reason: None,
        message: None,
    }];
    out.push(Condition {
        type_: "Initialized",
        status: init_done,
        reason: (!init_done).then(|| "ContainersNotInitialized".into()),
        message: None,
    });
    let unready: Vec<&str> = containers
        .iter()
        .filter(|c| !c.ready)
        .map(|c| c.name.as_str())
        .collect();
    let (status, reason, message) = if matches!(phase, "Succeeded" | "Failed") {
        (false, Some("PodCompleted".to_string()), None)
    } else if unready.is_empty() {
        (true, None, None)
    } else {
        (
            false,
            Some("ContainersNotReady".to_string()),
            Some(format!(
                "containers with unready status: [{}]",
                unready.join(" ")
            )),
        )
    };
    out.push(Condition {
        type_: "ContainersReady",
        status,
        reason: reason.clone(),
        message: message.clone(),
    });
    out.push(Condition {
        type_: "Ready",
        status,
        reason,
        message,
    });
    out
}

/// Restart back-off: the first restart is immediate, then `base`, doubling up to `max`
/// (kubelet: 10 s to 5 min). A container that ran longer than `reset_after` starts over.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
    pub reset_after: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_secs(10),
            max: Duration::from_secs(300),
            reset_after: Duration::from_secs(600),
        }
    }
}

impl Backoff {
    /// The delay before restart number `crashes` (1 = first crash in this back-off window).
    pub fn delay(&self, crashes: u32) -> Duration {
        if crashes <= 1 {
            return Duration::ZERO;
        }
        let shift = (crashes - 2).min(20);
        self.base.saturating_mul(1u32 << shift).min(self.max)
    }

    /// Crash count after a container that ran for `ran` exited.
    pub fn next_crashes(&self, crashes: u32, ran: Duration) -> u32 {
        if ran >= self.reset_after {
            1
        } else {
            crashes + 1
        }
    }
}

/// The outcome of one probe attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeResult {
    Success,
    Failure,
}

/// Probe thresholds over consecutive results (a probe's `successThreshold` /
/// `failureThreshold`): the reported result changes only after enough identical results.
#[derive(Debug, Clone)]
pub struct ProbeTracker {
    pub success_threshold: u32,
    pub failure_threshold: u32,
    pub result: ProbeResult,
    run: u32,
    last: Option<ProbeResult>,
}

impl ProbeTracker {
    /// Readiness and startup start failed (not ready/not started); liveness starts succeeded.
    pub fn new(success_threshold: i32, failure_threshold: i32, initial: ProbeResult) -> Self {
        ProbeTracker {
            success_threshold: success_threshold.max(1) as u32,
            failure_threshold: failure_threshold.max(1) as u32,
            result: initial,
            run: 0,
            last: None,
        }
    }

    /// Records one attempt; returns the new result when it flipped.
    pub fn observe(&mut self, r: ProbeResult) -> Option<ProbeResult> {
        if self.last == Some(r) {
            self.run = self.run.saturating_add(1);
        } else {
            self.last = Some(r);
            self.run = 1;
        }
        let threshold = match r {
            ProbeResult::Success => self.success_threshold,
            ProbeResult::Failure => self.failure_threshold,
        };
        if r != self.result && self.run >= threshold {
            self.result = r;
            return Some(r);
        }
        None
    }
}

/// An HTTP probe succeeds on status 200..400 (redirects are not followed here).
pub fn http_status_ok(code: u16) -> bool {
    (200..400).contains(&code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(state: State, last: bool, ready: bool) -> Container {
        Container {
            name: "c".into(),
            image: "i".into(),
            state,
            last: last.then(|| term(1)),
            restart_count: 0,
            ready,
            started: true,
        }
    }
    fn term(code: i32) -> Terminated {
        Terminated {
            exit_code: code,
            signal: None,
            reason: Terminated::reason_for(code).into(),
            message: None,
            started_at: None,
            finished_at: "t".into(),
        }
    }
    fn running() -> State {
        State::Running {
            started_at: "t".into(),
        }
    }
    fn waiting() -> State {
        State::Waiting {
            reason: "ContainerCreating".into(),
            message: None,
        }
    }

    #[test]
    fn phase_table() {
        let t = |code| State::Terminated(term(code));
        let cases: Vec<(Vec<Container>, &str, bool, &str)> = vec![
            (vec![c(waiting(), false, false)], "Always", true, "Pending"),
            (vec![c(running(), false, false)], "Always", true, "Running"),
            (vec![c(running(), false, false)], "Always", false, "Pending"),
            (vec![c(t(0), false, false)], "Never", true, "Succeeded"),
            (vec![c(t(1), false, false)], "Never", true, "Failed"),
            (
                vec![c(t(0), false, false), c(t(1), false, false)],
                "Never",
                true,
                "Failed",
            ),
            (vec![c(t(1), false, false)], "Always", true, "Running"),
            (vec![c(t(0), false, false)], "Always", true, "Running"),
            (vec![c(t(0), false, false)], "OnFailure", true, "Succeeded"),
            (vec![c(t(1), false, false)], "OnFailure", true, "Running"),
            // CrashLoopBackOff: waiting with a last state counts as stopped.
            (vec![c(waiting(), true, false)], "Always", true, "Running"),
            (
                vec![c(running(), false, true), c(waiting(), false, false)],
                "Always",
                true,
                "Pending",
            ),
            (
                vec![c(running(), false, true), c(t(0), false, false)],
                "Never",
                true,
                "Running",
            ),
        ];
        for (i, (cs, policy, init, want)) in cases.into_iter().enumerate() {
            assert_eq!(phase(&cs, policy, init), want, "case {i}");
        }
    }

    #[test]
    fn restart_table() {
        for (policy, code, want) in [
            ("Always", 0, true),
            ("Always", 1, true),
            ("OnFailure", 0, false),
            ("OnFailure", 2, true),
            ("Never", 1, false),
            ("Never", 0, false),
        ] {
            assert_eq!(should_restart(policy, code), want, "{policy} {code}");
        }
    }

    #[test]
    fn condition_table() {
        let ready = vec![c(running(), false, true)];
        let conds = conditions(&ready, "Running", true, true);
        let ready_c = conds.iter().find(|c| c.type_ == "Ready").expect("Ready");
        assert!(ready_c.status);
        let unready = vec![c(running(), false, false)];
        let conds = conditions(&unready, "Running", true, true);
        let r = conds
            .iter()
            .find(|c| c.type_ == "ContainersReady")
            .expect("CR");
        assert!(!r.status);
        assert_eq!(
            r.message.as_deref(),
            Some("containers with unready status: [c]")
        );
        // Terminating makes no difference (kubelet): still Ready while running and ready.
        let conds = conditions(&ready, "Running", true, true);
        assert!(
            conds
                .iter()
                .find(|c| c.type_ == "Ready")
                .expect("Ready")
                .status
        );
        let conds = conditions(&ready, "Succeeded", true, true);
        let r = conds.iter().find(|c| c.type_ == "Ready").expect("Ready");
        assert_eq!(r.reason.as_deref(), Some("PodCompleted"));
        assert!(!conds[0].status);
    }

    #[test]
    fn backoff_table() {
        let b = Backoff::default();
        let s = Duration::from_secs;
        for (n, want) in [
            (1, 0),
            (2, 10),
            (3, 20),
            (4, 40),
            (5, 80),
            (6, 160),
            (7, 300),
            (50, 300),
        ] {
            assert_eq!(b.delay(n), s(want), "crash {n}");
        }
        assert_eq!(b.next_crashes(5, s(1)), 6);
        assert_eq!(b.next_crashes(5, s(601)), 1);
    }

    #[test]
    fn probe_thresholds() {
        use ProbeResult::*;
        // Readiness: success threshold 2, failure threshold 3, starts failed.
        let mut p = ProbeTracker::new(2, 3, Failure);
        assert_eq!(p.observe(Success), None);
        assert_eq!(p.observe(Success), Some(Success));
        assert_eq!(p.observe(Failure), None);
        assert_eq!(p.observe(Success), None);
        assert_eq!(p.observe(Failure), None);
        assert_eq!(p.observe(Failure), None);
        assert_eq!(p.observe(Failure), Some(Failure));
        assert_eq!(p.observe(Failure), None);
        // Liveness: starts succeeded, threshold 1.
        let mut l = ProbeTracker::new(1, 1, Success);
        assert_eq!(l.observe(Success), None);
        assert_eq!(l.observe(Failure), Some(Failure));
        for (code, ok) in [
            (200, true),
            (302, true),
            (399, true),
            (400, false),
            (500, false),
            (100, false),
        ] {
            assert_eq!(http_status_ok(code), ok);
        }
    }
}
