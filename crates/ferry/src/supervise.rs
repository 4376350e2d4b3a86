//! Components of `ferry up` run as supervised tasks: a panic or an error in one (DNS, proxy,
//! agent, controllers) is caught through its `JoinHandle`, logged, shown in the API server's
//! `/readyz` as that component failing, and the component is restarted after a backoff
//! (1 s doubling to 1 min, reset once a run lasted 5 min). The API server and the other
//! components keep serving meanwhile.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_apiserver::readyz::NotReady;
use tokio_util::sync::CancellationToken;

/// First restart delay.
const RESTART_MIN: Duration = Duration::from_secs(1);
/// Longest restart delay.
const RESTART_MAX: Duration = Duration::from_secs(60);
/// A run this long resets the delay.
const STABLE: Duration = Duration::from_secs(300);

/// The restart delay after a run of `ran` that followed a delay of `prev` (pure).
pub fn restart_delay(prev: Option<Duration>, ran: Duration) -> Duration {
    match prev {
        Some(p) if ran < STABLE => (p * 2).min(RESTART_MAX),
        _ => RESTART_MIN,
    }
}

/// What a component is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Running,
    /// It failed with this reason; a restart is due.
    Failed(String),
    Stopped,
}

/// A component's state, shared with its readiness check.
#[derive(Clone)]
pub struct Component {
    pub name: Arc<str>,
    state: Arc<Mutex<State>>,
}

static CHECKS: std::sync::OnceLock<ferry_apiserver::readyz::Checks> = std::sync::OnceLock::new();

/// Where components register their readiness: the API server's `/readyz`.
pub fn set_checks(c: ferry_apiserver::readyz::Checks) {
    let _ = CHECKS.set(c);
}

/// Registers (or replaces) a readiness check, if the API server runs in this process.
pub fn add_check(name: &str, f: impl Fn() -> Result<(), NotReady> + Send + Sync + 'static) {
    if let Some(c) = CHECKS.get() {
        c.add(name, f);
    }
}

impl Component {
    /// A component; its state is a readiness check of the same name.
    pub fn new(name: impl Into<String>) -> Self {
        let name: Arc<str> = Arc::from(name.into());
        let c = Component {
            name: name.clone(),
            state: Arc::new(Mutex::new(State::Running)),
        };
        let me = c.clone();
        add_check(&name, move || me.check());
        c
    }
    pub fn state(&self) -> State {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
    fn set(&self, s: State) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = s;
    }
    /// `Ok` while running (the readiness check of the component).
    pub fn check(&self) -> Result<(), NotReady> {
        match self.state() {
            State::Running => Ok(()),
            State::Failed(r) => Err(NotReady(r)),
            State::Stopped => Err("stopped".into()),
        }
    }
}

fn panic_text(e: tokio::task::JoinError) -> String {
    match e.try_into_panic() {
        Ok(p) => p
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(non-string panic payload)".into()),
        Err(e) => e.to_string(),
    }
}

/// Runs `make()` as a task until `stop`, restarting it whenever it ends on its own.
pub fn spawn<F, Fut, E>(
    component: Component,
    stop: CancellationToken,
    mut make: F,
) -> tokio::task::JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Into<anyhow::Error> + Send + 'static,
{
    tokio::spawn(async move {
        let mut delay: Option<Duration> = None;
        loop {
            component.set(State::Running);
            let started = Instant::now();
            let r = tokio::spawn(make()).await;
            if stop.is_cancelled() {
                component.set(State::Stopped);
                return;
            }
            let reason = match r {
                Ok(Ok(())) => "exited".to_string(),
                Ok(Err(e)) => format!("{:#}", e.into()),
                Err(e) if e.is_panic() => format!("panicked: {}", panic_text(e)),
                Err(e) => e.to_string(),
            };
            let d = restart_delay(delay, started.elapsed());
            delay = Some(d);
            tracing::error!(component = %component.name, restart_in = ?d, "{reason}");
            component.set(State::Failed(format!("{reason}; restarting in {d:?}")));
            tokio::select! {
                _ = stop.cancelled() => {
                    component.set(State::Stopped);
                    return;
                }
                _ = tokio::time::sleep(d) => {}
            }
            tracing::info!(component = %component.name, "restarting");
        }
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn delays() {
        let s = Duration::from_secs;
        assert_eq!(restart_delay(None, s(0)), s(1));
        assert_eq!(restart_delay(Some(s(1)), s(2)), s(2));
        assert_eq!(restart_delay(Some(s(32)), s(2)), s(60));
        assert_eq!(restart_delay(Some(s(60)), s(2)), s(60));
        assert_eq!(restart_delay(Some(s(60)), s(301)), s(1));
    }

    #[tokio::test]
    async fn a_panicking_component_is_restarted_and_reported() {
        let c = Component::new("boom");
        let runs = Arc::new(AtomicU32::new(0));
        let stop = CancellationToken::new();
        let (r, s) = (runs.clone(), stop.clone());
        let h = spawn(c.clone(), stop.clone(), move || {
            let n = r.fetch_add(1, Ordering::SeqCst);
            let s = s.clone();
            async move {
                if n < 2 {
                    panic!("run {n} panics");
                }
                s.cancelled().await;
                anyhow::Ok(())
            }
        });
        // Runs 0 and 1 panic (restarts after 1 s and 2 s); run 2 keeps going.
        while runs.load(Ordering::SeqCst) < 3 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if runs.load(Ordering::SeqCst) < 3 {
                let st = c.state();
                assert!(
                    matches!(&st, State::Failed(r) if r.contains("panics")) || st == State::Running,
                    "{st:?}"
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(c.check(), Ok(()));
        stop.cancel();
        h.await.unwrap();
        assert_eq!(c.state(), State::Stopped);
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn an_error_is_reported_until_the_restart() {
        let c = Component::new("err");
        let stop = CancellationToken::new();
        let h = spawn(c.clone(), stop.clone(), || async {
            anyhow::bail!("cannot listen on 127.0.0.1:53")
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        let e = c.check().unwrap_err();
        assert!(e.0.contains("cannot listen on 127.0.0.1:53"), "{e}");
        stop.cancel();
        h.await.unwrap();
    }
}
