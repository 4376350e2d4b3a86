//! A cap on one component's concurrent connections.
//!
//! A listener takes a permit *before* it accepts (as HAProxy's `maxconn` does): at the cap the
//! component stops accepting, new connections wait in the kernel's listen queue (the client
//! sees a slow connect, not a reset), and no descriptor is spent on them. A permit is returned
//! when its connection ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The largest cap a semaphore can hold.
const MAX: usize = Semaphore::MAX_PERMITS;

struct Inner {
    name: &'static str,
    cap: usize,
    sem: Arc<Semaphore>,
    /// Times a connection had to wait (or was refused) at the cap.
    saturated: AtomicU64,
}

/// A named connection cap; clones share it.
#[derive(Clone)]
pub struct ConnLimiter(Arc<Inner>);

/// One connection's place under the cap; released on drop.
#[derive(Debug)]
pub struct ConnPermit(#[allow(dead_code)] OwnedSemaphorePermit);

impl std::fmt::Debug for ConnLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnLimiter")
            .field("name", &self.0.name)
            .field("cap", &self.0.cap)
            .field("in_use", &self.in_use())
            .finish()
    }
}

impl ConnLimiter {
    /// A cap of `cap` connections (at least 1).
    pub fn new(name: &'static str, cap: usize) -> Self {
        let cap = cap.clamp(1, MAX);
        ConnLimiter(Arc::new(Inner {
            name,
            cap,
            sem: Arc::new(Semaphore::new(cap)),
            saturated: AtomicU64::new(0),
        }))
    }

    pub fn name(&self) -> &'static str {
        self.0.name
    }
    pub fn capacity(&self) -> usize {
        self.0.cap
    }
    /// Connections holding a permit now.
    pub fn in_use(&self) -> usize {
        self.0.cap.saturating_sub(self.0.sem.available_permits())
    }
    /// Whether the cap is reached.
    pub fn is_full(&self) -> bool {
        self.0.sem.available_permits() == 0
    }
    /// How often a connection found the cap reached.
    pub fn saturated(&self) -> u64 {
        self.0.saturated.load(Ordering::Relaxed)
    }

    /// A permit if one is free now; counts a saturation otherwise.
    pub fn try_acquire(&self) -> Option<ConnPermit> {
        match self.0.sem.clone().try_acquire_owned() {
            Ok(p) => Some(ConnPermit(p)),
            Err(_) => {
                self.0.saturated.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Waits for a permit (first come, first served). `on_full` runs once if it must wait.
    pub async fn acquire(&self, on_full: impl FnOnce(&ConnLimiter)) -> ConnPermit {
        if let Some(p) = self.try_acquire() {
            return p;
        }
        on_full(self);
        match self.0.sem.clone().acquire_owned().await {
            Ok(p) => ConnPermit(p),
            // The semaphore is never closed.
            Err(_) => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn cap_and_release() {
        let l = ConnLimiter::new("t", 2);
        let a = l.try_acquire().unwrap();
        let _b = l.acquire(|_| panic!("not full yet")).await;
        assert!(l.is_full());
        assert_eq!(l.in_use(), 2);
        assert!(l.try_acquire().is_none());
        assert_eq!(l.saturated(), 1);
        let l2 = l.clone();
        let mut waited = false;
        let waiter = tokio::spawn(async move {
            let p = l2.acquire(|_| {}).await;
            drop(p);
        });
        tokio::task::yield_now().await;
        drop(a);
        waiter.await.unwrap();
        waited |= l.saturated() >= 1;
        assert!(waited);
        assert_eq!(l.in_use(), 1);
        assert_eq!(ConnLimiter::new("z", 0).capacity(), 1);
    }
}
