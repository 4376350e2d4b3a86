//! A background task that keeps the history bounded.

use std::sync::Arc;
use std::time::Duration;

use crate::{Revision, Store};

/// Handle of a running compactor; dropping it does not stop the task, [`CompactorHandle::stop`]
/// does.
#[derive(Debug)]
pub struct CompactorHandle {
    task: tokio::task::JoinHandle<()>,
}

impl CompactorHandle {
    /// Stops the compactor.
    pub fn stop(self) {
        self.task.abort();
    }
}

/// The revision to compact at so that the last `keep_revisions` revisions stay available, or
/// `None` when there is nothing new to forget.
pub fn compaction_target(
    current: Revision,
    compacted: Revision,
    keep_revisions: Revision,
) -> Option<Revision> {
    let target = current.saturating_sub(keep_revisions.max(0));
    (target > compacted).then_some(target)
}

/// Every `interval`, compacts `store` so that only the last `keep_revisions` revisions of history
/// remain (watches and reads at older revisions then get [`crate::StoreError::Compacted`]).
/// Errors are logged and retried at the next tick. Must be called inside a Tokio runtime.
pub fn spawn_compactor(
    store: Arc<dyn Store>,
    interval: Duration,
    keep_revisions: Revision,
) -> CompactorHandle {
    let task = tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick completes at once; skip it so a fresh start does not compact.
        ticker.tick().await;
        loop {
            ticker.tick().await;
            let (current, compacted) = match (
                store.current_revision().await,
                store.compacted_revision().await,
            ) {
                (Ok(c), Ok(p)) => (c, p),
                (Err(e), _) | (_, Err(e)) => {
                    tracing::warn!(error = %e, "compactor: reading revisions failed");
                    continue;
                }
            };
            let Some(target) = compaction_target(current, compacted, keep_revisions) else {
                continue;
            };
            match store.compact(target).await {
                Ok(()) => tracing::debug!(revision = target, "compacted store history"),
                Err(e) => tracing::warn!(error = %e, revision = target, "compaction failed"),
            }
        }
    });
    CompactorHandle { task }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        let cases = [
            // current, compacted, keep, expected
            (0, 0, 100, None),
            (50, 0, 100, None),
            (150, 0, 100, Some(50)),
            (150, 50, 100, None),
            (151, 50, 100, Some(51)),
            (10, 0, 0, Some(10)),
            (10, 0, -5, Some(10)),
        ];
        for (current, compacted, keep, expected) in cases {
            assert_eq!(
                compaction_target(current, compacted, keep),
                expected,
                "{current} {compacted} {keep}"
            );
        }
    }
}
