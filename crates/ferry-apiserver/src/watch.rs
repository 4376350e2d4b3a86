//! Watch streams: newline-delimited `{"type":…,"object":…}` events, flushed one by one.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

use crate::api::{Api, Filter, Reply, Resource};
use crate::cache::{CacheEvent, CachedObject, EventType};
use crate::request::{Query, ResourcePath, Want};
use crate::status::ApiError;
use crate::table;

const BOOKMARK_EVERY: Duration = Duration::from_secs(30);

struct Ctx {
    res: Arc<Resource>,
    filter: Filter,
    prefix: String,
    want: Want,
    query: Query,
    bookmarks: bool,
}

impl Ctx {
    fn encode(&self, kind: &str, v: &Value) -> Bytes {
        let object = match self.want {
            Want::Table { v1beta1 } => table::single(self.res.strategy, v, &self.query, v1beta1),
            Want::Metadata { v1beta1, .. } => crate::metadata::partial_value(v, v1beta1),
            Want::Json => v.clone(),
        };
        let mut line =
            serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
        line.push(b'\n');
        Bytes::from(line)
    }

    fn encode_cached(&self, kind: &str, o: &CachedObject) -> Bytes {
        // A custom kind served in another version than stored, or with schema defaults.
        if !self.res.as_stored
            && let Some(v) = self.res.strategy.on_read(&o.value())
        {
            return self.encode(kind, &v);
        }
        let meta_only = match self.want {
            Want::Metadata { v1beta1, .. } => Some(v1beta1),
            _ => None,
        };
        if self.want == Want::Json || meta_only.is_some() {
            // Splice the cached bytes (or only their metadata): no re-serialisation.
            let mut line = Vec::with_capacity(o.bytes.len() + 32);
            line.extend_from_slice(b"{\"type\":\"");
            line.extend_from_slice(kind.as_bytes());
            line.extend_from_slice(b"\",\"object\":");
            match meta_only {
                Some(v1beta1) => crate::metadata::write_partial(&mut line, &o.bytes, v1beta1),
                None => line.extend_from_slice(&o.bytes),
            }
            line.extend_from_slice(b"}\n");
            return Bytes::from(line);
        }
        self.encode(kind, &o.value())
    }

    fn in_scope(&self, o: &CachedObject) -> bool {
        let key_ns = o.namespace();
        if self.res.info().namespaced && self.prefix != self.res.prefix {
            let want_ns = self
                .prefix
                .trim_start_matches(&self.res.prefix)
                .trim_end_matches('/');
            return key_ns == want_ns;
        }
        true
    }

    /// Turns a cache event into the event this watcher sees, honouring selectors: an object that
    /// stops matching is DELETED for this watcher, one that starts matching is ADDED.
    fn translate(&self, ev: &CacheEvent) -> Option<Bytes> {
        if !self.in_scope(&ev.object) {
            return None;
        }
        let now = self.filter.matches_cached(&self.res, &ev.object);
        let before = ev
            .prev
            .as_ref()
            .is_some_and(|p| self.filter.matches_cached(&self.res, p));
        match ev.kind {
            EventType::Added => now.then(|| self.encode_cached("ADDED", &ev.object)),
            EventType::Deleted => {
                (now || before).then(|| self.encode_cached("DELETED", &ev.object))
            }
            EventType::Modified => match (before, now) {
                (true, true) => Some(self.encode_cached("MODIFIED", &ev.object)),
                (false, true) => Some(self.encode_cached("ADDED", &ev.object)),
                (true, false) => Some(self.encode_cached("DELETED", &ev.object)),
                (false, false) => None,
            },
        }
    }

    fn bookmark(&self, rv: i64) -> Bytes {
        let info = self.res.info();
        self.encode(
            "BOOKMARK",
            &json!({"kind": info.kind, "apiVersion": info.api_version(), "metadata": {"resourceVersion": rv.to_string()}}),
        )
    }

    fn initial_end_bookmark(&self, rv: i64) -> Bytes {
        let info = self.res.info();
        self.encode(
            "BOOKMARK",
            &json!({"kind": info.kind, "apiVersion": info.api_version(), "metadata": {"resourceVersion": rv.to_string(), "annotations": {"k8s.io/initial-events-end": "true"}}}),
        )
    }
}

fn error_event(e: &ApiError) -> Bytes {
    let mut line =
        serde_json::to_vec(&json!({"type": "ERROR", "object": e.to_status()})).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

pub async fn watch(
    api: &Api,
    res: Arc<Resource>,
    p: &ResourcePath,
    q: &Query,
    want: Want,
) -> Result<Reply, ApiError> {
    let filter = Filter::parse(q)?;
    let timeout = q
        .int("timeoutSeconds")?
        .filter(|t| *t > 0)
        .map(|t| Duration::from_secs(t as u64));
    let at = crate::rv::watch_at(
        q.get("resourceVersion").unwrap_or(""),
        q.get("resourceVersionMatch").unwrap_or(""),
        q.get("sendInitialEvents"),
        q.get("continue"),
    )
    .map_err(|e| match e {
        Err(e) => e,
        Ok(m) => {
            // Upstream: the storage layer's field error, as 422 Invalid on the resource.
            let m = m.to_string();
            ApiError::new(
                422,
                "Invalid",
                format!("{} \"\" is invalid: {m}", res.info().plural),
            )
            .with_details(json!({"kind": res.info().plural, "group": res.info().group, "causes": [{"reason": "FieldValueInvalid", "message": m.trim_start_matches("resourceVersion: "), "field": "resourceVersion"}]}))
        }
    })?;
    let prefix = res.list_prefix(p.namespace.as_deref());
    let rc = api
        .cache
        .resource(&res.prefix)
        .ok_or_else(|| ApiError::internal("no cache"))?;
    // PartialObjectMetadataList cannot answer an event: upstream's per-event transform fails
    // and sends the object as it is.
    let want = match want {
        Want::Metadata { list: true, .. } => Want::Json,
        w => w,
    };
    let ctx = Ctx {
        res: res.clone(),
        filter,
        prefix: prefix.clone(),
        want,
        query: q.clone(),
        bookmarks: q.flag("allowWatchBookmarks"),
    };
    let (tx, rx) = mpsc::channel::<Bytes>(256);

    // Decide the starting point now, so that errors can still be a plain HTTP error.
    enum Start {
        Snapshot(
            Vec<Arc<CachedObject>>,
            broadcast::Receiver<Arc<CacheEvent>>,
            i64,
        ),
        From(
            Vec<Arc<CacheEvent>>,
            broadcast::Receiver<Arc<CacheEvent>>,
            i64,
        ),
        TooOld(i64),
    }
    let wait_until = |rev: i64| async move {
        // A resourceVersion the cache has not reached: wait a little, then 504 (upstream).
        if rev > api.cache.revision() && !api.cache.wait_for(rev, crate::rv::TOO_LARGE_WAIT).await {
            return Err(crate::rv::too_large(rev, api.cache.revision()));
        }
        Ok(())
    };
    let consistent = || async {
        let cur = api.store.current_revision().await?;
        api.cache.wait_for(cur, Duration::from_secs(5)).await;
        Ok::<_, ApiError>(())
    };
    let mut send_initial = false;
    let start = match at {
        crate::rv::WatchAt::Initial {
            fresh,
            end_bookmark,
        } => {
            match fresh {
                crate::rv::Fresh::Consistent => consistent().await?,
                crate::rv::Fresh::Any => {}
                crate::rv::Fresh::NotOlderThan(n) => wait_until(n).await?,
            }
            send_initial = end_bookmark;
            let (items, live, rev) = rc.snapshot_at(&prefix, || api.cache.revision());
            Start::Snapshot(items, live, rev)
        }
        crate::rv::WatchAt::Now { consistent: c } => {
            if c {
                consistent().await?;
            }
            // An empty snapshot: only the subscription and its revision.
            let (_, live, rev) = rc.snapshot_at("\u{0}", || api.cache.revision());
            Start::Snapshot(Vec::new(), live, rev)
        }
        crate::rv::WatchAt::After(after) => {
            wait_until(after).await?;
            match rc.subscribe_from(after) {
                Ok(sub) => Start::From(sub.replay, sub.live, after),
                Err(_) => Start::TooOld(after),
            }
        }
    };

    tokio::spawn(async move {
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let (mut live, mut last) = match start {
            Start::TooOld(after) => {
                let _ = tx.send(error_event(&ApiError::gone_too_old(after))).await;
                return;
            }
            Start::Snapshot(items, live, rev) => {
                for o in items {
                    if ctx.filter.matches_cached(&ctx.res, &o)
                        && tx.send(ctx.encode_cached("ADDED", &o)).await.is_err()
                    {
                        return;
                    }
                }
                if send_initial
                    && ctx.bookmarks
                    && tx.send(ctx.initial_end_bookmark(rev)).await.is_err()
                {
                    return;
                }
                (live, rev)
            }
            Start::From(replay, live, after) => {
                let mut last = after;
                for ev in replay {
                    last = ev.revision;
                    if let Some(b) = ctx.translate(&ev)
                        && tx.send(b).await.is_err()
                    {
                        return;
                    }
                }
                (live, last)
            }
        };
        let mut ticker = tokio::time::interval(BOOKMARK_EVERY);
        ticker.tick().await;
        loop {
            let sleep = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = sleep => return,
                _ = tx.closed() => return,
                _ = ticker.tick() => {
                    if ctx.bookmarks && tx.send(ctx.bookmark(last)).await.is_err() {
                        return;
                    }
                }
                ev = live.recv() => match ev {
                    Ok(ev) => {
                        if ev.revision <= last {
                            continue;
                        }
                        last = ev.revision;
                        if let Some(b) = ctx.translate(&ev)
                            && tx.send(b).await.is_err()
                        {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let _ = tx.send(error_event(&ApiError::gone_too_old(last))).await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        }
    });
    let content_type = match want {
        Want::Table { .. } => "application/json;as=Table;v=v1;g=meta.k8s.io",
        Want::Json | Want::Metadata { .. } => "application/json",
    };
    Ok(Reply::Stream { content_type, rx })
}
