//! One watch and one reflector store per kind, shared by every controller that reads the kind
//! (client-go's `SharedInformerFactory`): at 150,000 Pods each extra Pod reflector costs a full
//! list from the API server and a copy of every Pod, so the Pod-reading controllers (services,
//! ReplicaSet/Deployment, Job, StatefulSet, DaemonSet, disruption, scheduler, pod GC) subscribe
//! to one [`SharedInformer`] instead of each watching Pods.
//!
//! A subscriber gets a [`Change`] for every change after the store shows it, as with
//! [`super::reflect`]. One subscribing after the watch started is first handed every cached
//! object as a creation (under the same lock as the dispatch, so it misses nothing; it may see
//! an object twice, which key-mapping handlers absorb).

use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use kube::Api;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::pod::SlimPod;
use super::reflect::{Change, Reflected, Sink, spawn_reflector};

/// A change handler, and the token that ends its subscription (None: for the informer's life).
type Handler<K> = (
    Option<CancellationToken>,
    Box<dyn FnMut(Change<'_, K>) + Send>,
);

struct Handlers<K> {
    list: Mutex<Vec<Handler<K>>>,
    synced: watch::Sender<bool>,
}

impl<K> Handlers<K> {
    /// A panicking handler leaves the list intact (pushes only): take the lock over.
    fn lock(&self) -> MutexGuard<'_, Vec<Handler<K>>> {
        self.list.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

struct Fanout<K>(Arc<Handlers<K>>);

impl<K: Send + 'static> Sink<K> for Fanout<K> {
    fn change(&mut self, ch: Change<'_, K>) {
        self.0.lock().retain_mut(|(until, h)| {
            if until.as_ref().is_some_and(CancellationToken::is_cancelled) {
                // Ended: dropped with what it holds.
                return false;
            }
            h(Change {
                old: ch.old,
                new: ch.new,
            });
            true
        });
    }
    fn listed(&mut self) {
        self.0.synced.send_replace(true);
    }
}

/// One watch of every `K` into one store, with any number of change handlers.
pub struct SharedInformer<K: Reflected> {
    store: Store<K>,
    handlers: Arc<Handlers<K>>,
}

impl<K: Reflected> SharedInformer<K> {
    /// Starts the watch of `api` (objects slimmed by `slim` before they are cached) until `stop`.
    pub fn start(
        api: Api<K>,
        config: watcher::Config,
        slim: fn(&mut K),
        stop: CancellationToken,
    ) -> Self {
        let handlers = Arc::new(Handlers {
            list: Mutex::new(Vec::new()),
            synced: watch::Sender::new(false),
        });
        let store = spawn_reflector(api, config, (), slim, stop, Fanout(handlers.clone()));
        SharedInformer { store, handlers }
    }

    /// The shared store.
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Adds a change handler (handed the cached objects first); returns the shared store.
    pub fn subscribe(&self, on_change: impl FnMut(Change<'_, K>) + Send + 'static) -> Store<K> {
        self.subscribe_with(None, on_change)
    }

    /// [`Self::subscribe`] until `until` is cancelled: the handler is then dropped (with what
    /// it holds) at the next change, for subscribers that restart (the garbage collector's
    /// generations).
    pub fn subscribe_until(
        &self,
        until: CancellationToken,
        on_change: impl FnMut(Change<'_, K>) + Send + 'static,
    ) -> Store<K> {
        self.subscribe_with(Some(until), on_change)
    }

    fn subscribe_with(
        &self,
        until: Option<CancellationToken>,
        mut on_change: impl FnMut(Change<'_, K>) + Send + 'static,
    ) -> Store<K> {
        let mut list = self.handlers.lock();
        for o in self.store.state() {
            on_change(Change {
                old: None,
                new: Some(&o),
            });
        }
        list.push((until, Box::new(on_change)));
        self.store.clone()
    }

    /// Waits until the first list is in the store and every handler has seen it; false when
    /// `stop` fired first. Use this, not the store's `wait_until_ready`: that one wakes only
    /// the last of several concurrent waiters (kube-runtime's `DelayedInit` wraps a oneshot
    /// receiver, which keeps one waker).
    pub async fn wait_synced(&self, stop: &CancellationToken) -> bool {
        let mut rx = self.handlers.synced.subscribe();
        tokio::select! {
            _ = stop.cancelled() => false,
            r = rx.wait_for(|s| *s) => r.is_ok(),
        }
    }
}

/// The shared informers of one controller process (one API client, one stop token); each
/// starts on first use.
#[derive(Clone)]
pub struct Informers {
    client: kube::Client,
    stop: CancellationToken,
    pods: Arc<OnceLock<SharedInformer<SlimPod>>>,
}

impl Informers {
    pub fn new(client: kube::Client, stop: CancellationToken) -> Self {
        Informers {
            client,
            stop,
            pods: Arc::default(),
        }
    }

    /// Every Pod, as the slim projection the controllers read ([`SlimPod`]: decoded straight
    /// from the watch, no full object). Call from within the Tokio runtime.
    pub fn pods(&self) -> &SharedInformer<SlimPod> {
        self.pods.get_or_init(|| {
            SharedInformer::start(
                Api::all(self.client.clone()),
                watcher::Config::default(),
                |_| {},
                self.stop.clone(),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use k8s_openapi::api::core::v1::Pod;
    use kube::runtime::reflector::store::Writer;

    use super::*;

    fn pod(name: &str, rv: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.namespace = Some("ns".into());
        p.metadata.name = Some(name.into());
        p.metadata.resource_version = Some(rv.into());
        p
    }

    /// A shared informer fed by hand: `apply` stands for the reflector loop.
    fn informer() -> (SharedInformer<Pod>, Writer<Pod>, Fanout<Pod>) {
        let writer = Writer::<Pod>::new(());
        let handlers = Arc::new(Handlers {
            list: Mutex::new(Vec::new()),
            synced: watch::Sender::new(false),
        });
        let inf = SharedInformer {
            store: writer.as_reader(),
            handlers: handlers.clone(),
        };
        (inf, writer, Fanout(handlers))
    }

    fn apply(w: &mut Writer<Pod>, f: &mut Fanout<Pod>, old: Option<&Pod>, new: Pod) {
        w.apply_watcher_event(&watcher::Event::Apply(new.clone()));
        f.change(Change {
            old,
            new: Some(&new),
        });
    }

    /// (old, new) resource versions of each change a handler saw.
    type Seen = Arc<Mutex<Vec<(Option<String>, Option<String>)>>>;

    fn recorder() -> (Seen, impl FnMut(Change<'_, Pod>) + Send + 'static) {
        let seen: Seen = Arc::default();
        let s = seen.clone();
        let rv = |p: Option<&Pod>| p.and_then(|p| p.metadata.resource_version.clone());
        (seen, move |ch: Change<'_, Pod>| {
            s.lock().expect("lock").push((rv(ch.old), rv(ch.new)))
        })
    }

    #[tokio::test]
    async fn every_subscriber_sees_every_change_and_late_ones_get_the_cache_first() {
        let (inf, mut w, mut f) = informer();
        w.apply_watcher_event(&watcher::Event::Init);
        w.apply_watcher_event(&watcher::Event::InitDone);
        let (early, h) = recorder();
        inf.subscribe(h);
        apply(&mut w, &mut f, None, pod("a", "1"));
        f.listed();
        let stop = CancellationToken::new();
        assert!(inf.wait_synced(&stop).await);
        // A late subscriber is handed the cached object as a creation, then live changes.
        let (late, h) = recorder();
        let store = inf.subscribe(h);
        assert_eq!(store.state().len(), 1);
        apply(&mut w, &mut f, Some(&pod("a", "1")), pod("a", "2"));
        let e = early.lock().expect("lock").clone();
        let l = late.lock().expect("lock").clone();
        let s = |x: &str| Some(x.to_string());
        assert_eq!(e, vec![(None, s("1")), (s("1"), s("2"))]);
        assert_eq!(l, vec![(None, s("1")), (s("1"), s("2"))]);
    }

    #[tokio::test]
    async fn a_subscription_until_a_token_ends_with_it() {
        let (inf, mut w, mut f) = informer();
        let until = CancellationToken::new();
        let (seen, h) = recorder();
        inf.subscribe_until(until.clone(), h);
        apply(&mut w, &mut f, None, pod("a", "1"));
        until.cancel();
        apply(&mut w, &mut f, Some(&pod("a", "1")), pod("a", "2"));
        assert_eq!(seen.lock().expect("lock").len(), 1);
        assert!(
            inf.handlers.lock().is_empty(),
            "the ended handler is dropped"
        );
    }

    #[tokio::test]
    async fn many_waiters_all_wake_when_synced() {
        let (inf, _w, mut f) = informer();
        let inf = Arc::new(inf);
        let stop = CancellationToken::new();
        let waiters: Vec<_> = (0..5)
            .map(|_| {
                let (inf, stop) = (inf.clone(), stop.clone());
                tokio::spawn(async move { inf.wait_synced(&stop).await })
            })
            .collect();
        tokio::task::yield_now().await;
        f.listed();
        for w in waiters {
            assert!(w.await.expect("join"));
        }
        let stopped = CancellationToken::new();
        stopped.cancel();
        let (never, _w2, _f2) = informer();
        assert!(!never.wait_synced(&stopped).await);
    }
}
