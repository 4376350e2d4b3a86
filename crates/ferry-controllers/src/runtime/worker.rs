//! Workers: pull keys off the queue, reconcile, and requeue by the outcome.

use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use tokio_util::sync::CancellationToken;

use super::queue::{QueueKey, WorkQueue};

/// What a successful reconcile asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing until the next watch event touching the key.
    Done,
    /// Look again after this long (e.g. waiting for `minReadySeconds`); the backoff is reset.
    RequeueAfter(Duration),
}

/// A controller: reconciles one key. Convention: read the key's state from reflector stores,
/// hand it to a pure planner (`plan(&state) -> Vec<Write>`), and execute the writes (see
/// [`execute_all`]). An error requeues the key with the queue's backoff.
pub trait Reconciler: Send + Sync + 'static {
    type Key: QueueKey + Display;
    type Error: Display + Send;
    /// The controller's name in logs.
    fn name(&self) -> &'static str;
    fn reconcile(
        &self,
        key: &Self::Key,
    ) -> impl Future<Output = Result<Action, Self::Error>> + Send;
}

/// Runs `workers` workers of `r` on `queue` until `stop`; then shuts the queue down and waits
/// for the workers to finish their current key.
pub async fn run<R: Reconciler>(
    r: Arc<R>,
    queue: Arc<WorkQueue<R::Key>>,
    workers: usize,
    stop: CancellationToken,
) {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..workers.max(1) {
        let (r, queue) = (r.clone(), queue.clone());
        set.spawn(async move {
            while let Some(key) = queue.get().await {
                process(r.as_ref(), &queue, &key).await;
                queue.done(&key);
            }
        });
    }
    stop.cancelled().await;
    queue.shut_down();
    while set.join_next().await.is_some() {}
}

/// One reconcile of `key` and its bookkeeping (forget on success, backoff on failure).
pub async fn process<R: Reconciler>(r: &R, queue: &WorkQueue<R::Key>, key: &R::Key) {
    match r.reconcile(key).await {
        Ok(Action::Done) => queue.forget(key),
        Ok(Action::RequeueAfter(d)) => {
            queue.forget(key);
            queue.add_after(key.clone(), d);
        }
        Err(e) => {
            let retries = queue.num_requeues(key);
            let delay = queue.add_rate_limited(key.clone());
            tracing::warn!(
                controller = r.name(),
                key = %key,
                retries,
                retry_in = ?delay,
                "sync failed: {e}"
            );
        }
    }
}

/// Several failed writes of one reconcile.
#[derive(Debug, thiserror::Error)]
#[error("{failed} of {total} writes failed; first: {first}")]
pub struct WriteErrors<E: std::fmt::Debug + Display> {
    pub failed: usize,
    pub total: usize,
    pub first: E,
}

/// Executes the writes of one key concurrently; all are attempted, the first error (with the
/// count of failures) is returned. Returns the successful results in plan order.
pub async fn execute_all<W, T, E, F, Fut>(writes: Vec<W>, exec: F) -> Result<Vec<T>, WriteErrors<E>>
where
    F: Fn(W) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: std::fmt::Debug + Display,
{
    let total = writes.len();
    let results = join_all(writes.into_iter().map(exec)).await;
    let mut ok = Vec::with_capacity(total);
    let mut first = None;
    let mut failed = 0;
    for r in results {
        match r {
            Ok(t) => ok.push(t),
            Err(e) => {
                failed += 1;
                first.get_or_insert(e);
            }
        }
    }
    match first {
        None => Ok(ok),
        Some(first) => Err(WriteErrors {
            failed,
            total,
            first,
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use tokio::time::Instant;

    use super::*;

    /// Fails a key a given number of times, then succeeds.
    struct Flaky {
        fail: Mutex<HashMap<u32, u32>>,
        seen: Mutex<Vec<(u32, Duration)>>,
        t0: Instant,
    }

    /// A reconcile that failed on purpose.
    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct NotYet(String);

    impl Reconciler for Flaky {
        type Key = u32;
        type Error = NotYet;
        fn name(&self) -> &'static str {
            "flaky"
        }
        async fn reconcile(&self, key: &u32) -> Result<Action, NotYet> {
            if let Ok(mut s) = self.seen.lock() {
                s.push((*key, self.t0.elapsed()));
            }
            let mut f = self.fail.lock().map_err(|e| NotYet(e.to_string()))?;
            match f.get_mut(key) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    Err(NotYet(format!("key {key} not yet")))
                }
                _ => Ok(Action::Done),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn failures_retry_with_backoff_then_forget() {
        let r = Arc::new(Flaky {
            fail: Mutex::new(HashMap::from([(1, 3)])),
            seen: Mutex::default(),
            t0: Instant::now(),
        });
        let q: Arc<WorkQueue<u32>> = Arc::default();
        let stop = CancellationToken::new();
        let h = tokio::spawn(run(r.clone(), q.clone(), 2, stop.clone()));
        q.add(1);
        q.add(2);
        tokio::time::sleep(Duration::from_secs(5)).await;
        let seen = r.seen.lock().map(|s| s.clone()).unwrap_or_default();
        let ones: Vec<Duration> = seen.iter().filter(|(k, _)| *k == 1).map(|s| s.1).collect();
        // Tried at 0, then after 5, 10 and 20 ms more.
        let ms = |n| Duration::from_millis(n);
        assert_eq!(ones, vec![ms(0), ms(5), ms(15), ms(35)]);
        assert_eq!(seen.iter().filter(|(k, _)| *k == 2).count(), 1);
        assert_eq!(q.num_requeues(&1), 0, "forgotten after success");
        stop.cancel();
        assert!(h.await.is_ok());
    }

    #[tokio::test]
    async fn execute_all_runs_every_write_and_reports_failures() {
        let r = execute_all(vec![1, 2, 3, 4], |w| async move {
            if w % 2 == 0 {
                Err(format!("w{w}"))
            } else {
                Ok(w * 10)
            }
        })
        .await;
        match r {
            Err(e) => {
                assert_eq!((e.failed, e.total, e.first.as_str()), (2, 4, "w2"));
            }
            Ok(v) => panic!("expected failure, got {v:?}"),
        }
        let ok = execute_all(vec![1, 3], |w| async move { Ok::<_, String>(w) }).await;
        assert_eq!(ok.ok(), Some(vec![1, 3]));
    }
}
