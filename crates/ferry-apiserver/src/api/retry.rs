//! The read–decode–modify–compare-and-swap loop of the writes that change one stored object in
//! place (a Pod's binding, a Namespace's finalize, a deletion's mark or removal): upstream's
//! `GuaranteedUpdate` for callers whose change is a pure function of the object as read.

use bytes::Bytes;
use ferry_api::kinds::KindInfo;
use ferry_store::Store;
use serde_json::Value;

use super::{Reply, cas};
use crate::cache::set_resource_version;
use crate::status::ApiError;

/// How many times another writer may win before the caller gets 409 Conflict.
pub(crate) const ATTEMPTS: usize = 16;

/// What one attempt decided from the object as read. `A` is the caller's note for its answer
/// (a status code, or nothing).
pub(crate) enum Attempt<A> {
    /// Answer at once; nothing is written (a dry run, nothing to change).
    Answer(Reply),
    /// Write this object (compare-and-swap on the revision read).
    Update(Value, A),
    /// Remove the object (compare-and-swap on the revision read); the value is the last one.
    Remove(Value, A),
}

/// What the loop did: the object written or removed carries the revision of that write as its
/// `resourceVersion`.
pub(crate) enum Outcome<A> {
    Answered(Reply),
    Updated(Value, A),
    Removed(Value, A),
}

/// Reads `key` (404 when absent), decodes it, lets `decide` choose with the object and its
/// revision, and writes that choice with compare-and-swap on the revision read. When another
/// writer changed the object in between, reads again and decides anew, at most [`ATTEMPTS`]
/// times (then 409 Conflict). Errors of `decide` end the loop as they are.
pub(crate) async fn update_with_retry<A>(
    store: &dyn Store,
    info: &KindInfo,
    key: &str,
    name: &str,
    mut decide: impl FnMut(Value, i64) -> Result<Attempt<A>, ApiError>,
) -> Result<Outcome<A>, ApiError> {
    for _attempt in 0..ATTEMPTS {
        let Some(kv) = store.get(key).await? else {
            return Err(ApiError::not_found(info, name));
        };
        let obj: Value =
            serde_json::from_slice(&kv.value).map_err(|e| ApiError::internal(e.to_string()))?;
        match decide(obj, kv.mod_revision)? {
            Attempt::Answer(reply) => return Ok(Outcome::Answered(reply)),
            Attempt::Update(mut obj, note) => {
                let bytes = Bytes::from(
                    serde_json::to_vec(&obj).map_err(|e| ApiError::internal(e.to_string()))?,
                );
                let written = store.update(key, bytes, kv.mod_revision).await;
                let Some(nkv) = cas(written, info, name)? else {
                    continue;
                };
                set_resource_version(&mut obj, nkv.mod_revision);
                return Ok(Outcome::Updated(obj, note));
            }
            Attempt::Remove(mut obj, note) => {
                let removed = store.delete(key, Some(kv.mod_revision)).await;
                let Some((_, rev)) = cas(removed, info, name)? else {
                    continue;
                };
                set_resource_version(&mut obj, rev);
                return Ok(Outcome::Removed(obj, note));
            }
        }
    }
    Err(ApiError::conflict(info, name))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use ferry_store::{KeyValue, RangeOptions, RangeResult, Revision, WatchStream};
    use serde_json::json;

    use super::*;

    const KEY: &str = "/registry/configmaps/default/cm";

    fn info() -> &'static KindInfo {
        ferry_api::kinds::all()
            .iter()
            .map(|s| s.info())
            .find(|i| i.group.is_empty() && i.kind == "ConfigMap")
            .expect("a served kind")
    }

    /// A store where another writer gets in before the next `races` compare-and-swap writes:
    /// it bumps `data.racer` of the object between the caller's read and its write.
    struct Racing {
        inner: Arc<dyn Store>,
        races: AtomicUsize,
    }

    impl Racing {
        async fn race(&self, key: &str) {
            let left = self.races.load(Ordering::SeqCst);
            if left == 0 {
                return;
            }
            self.races.store(left - 1, Ordering::SeqCst);
            let kv = self.inner.get(key).await.unwrap().unwrap();
            let mut v: Value = serde_json::from_slice(&kv.value).unwrap();
            let n = v["data"]["racer"]
                .as_str()
                .unwrap_or("0")
                .parse::<u32>()
                .unwrap();
            v["data"]["racer"] = json!((n + 1).to_string());
            let bytes = Bytes::from(serde_json::to_vec(&v).unwrap());
            self.inner
                .update(key, bytes, kv.mod_revision)
                .await
                .unwrap();
        }
    }

    #[async_trait::async_trait]
    impl Store for Racing {
        async fn current_revision(&self) -> ferry_store::Result<Revision> {
            self.inner.current_revision().await
        }
        async fn get(&self, key: &str) -> ferry_store::Result<Option<KeyValue>> {
            self.inner.get(key).await
        }
        async fn range(&self, prefix: &str, o: RangeOptions) -> ferry_store::Result<RangeResult> {
            self.inner.range(prefix, o).await
        }
        async fn create(&self, key: &str, value: Bytes) -> ferry_store::Result<KeyValue> {
            self.inner.create(key, value).await
        }
        async fn update(
            &self,
            key: &str,
            value: Bytes,
            expected: Revision,
        ) -> ferry_store::Result<KeyValue> {
            self.race(key).await;
            self.inner.update(key, value, expected).await
        }
        async fn delete(
            &self,
            key: &str,
            expected: Option<Revision>,
        ) -> ferry_store::Result<(KeyValue, Revision)> {
            self.race(key).await;
            self.inner.delete(key, expected).await
        }
        async fn watch(&self, prefix: &str, after: Revision) -> ferry_store::Result<WatchStream> {
            self.inner.watch(prefix, after).await
        }
        async fn compact(&self, revision: Revision) -> ferry_store::Result<()> {
            self.inner.compact(revision).await
        }
        async fn compacted_revision(&self) -> ferry_store::Result<Revision> {
            self.inner.compacted_revision().await
        }
        async fn shutdown(&self) -> ferry_store::Result<()> {
            self.inner.shutdown().await
        }
    }

    /// A store holding one ConfigMap, whose writes lose `races` times to another writer.
    async fn store(races: usize) -> (tempfile::TempDir, Racing) {
        let dir = tempfile::tempdir().unwrap();
        let inner: Arc<dyn Store> =
            Arc::new(ferry_store::RedbStore::open(&dir.path().join("s.redb")).unwrap());
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cm", "namespace": "default"}, "data": {}});
        inner
            .create(KEY, Bytes::from(serde_json::to_vec(&cm).unwrap()))
            .await
            .unwrap();
        let races = AtomicUsize::new(races);
        (dir, Racing { inner, races })
    }

    async fn stored(s: &Racing) -> Option<(Value, i64)> {
        let kv = s.inner.get(KEY).await.unwrap()?;
        Some((serde_json::from_slice(&kv.value).unwrap(), kv.mod_revision))
    }

    /// Sets `data.mine` on the object read, counting the attempts.
    fn set_mine(calls: &AtomicUsize) -> impl FnMut(Value, i64) -> Result<Attempt<u16>, ApiError> {
        move |mut v, _rev| {
            calls.fetch_add(1, Ordering::SeqCst);
            v["data"]["mine"] = json!("yes");
            Ok(Attempt::Update(v, 201))
        }
    }

    #[tokio::test]
    async fn writes_the_decided_object_with_its_new_revision() {
        let (_dir, s) = store(0).await;
        let calls = AtomicUsize::new(0);
        let out = update_with_retry(&s, info(), KEY, "cm", set_mine(&calls)).await;
        let Ok(Outcome::Updated(v, note)) = out else {
            panic!("not updated")
        };
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(note, 201);
        let (now, rev) = stored(&s).await.unwrap();
        assert_eq!(now["data"], json!({"mine": "yes"}));
        assert_eq!(v["metadata"]["resourceVersion"], json!(rev.to_string()));
    }

    #[tokio::test]
    async fn a_conflict_reads_again_and_keeps_the_other_writers_change() {
        let (_dir, s) = store(2).await;
        let calls = AtomicUsize::new(0);
        let seen = std::sync::Mutex::new(Vec::new());
        let out = update_with_retry(&s, info(), KEY, "cm", |v, rev| {
            seen.lock().unwrap().push((v["data"]["racer"].clone(), rev));
            set_mine(&calls)(v, rev)
        })
        .await;
        assert!(matches!(out, Ok(Outcome::Updated(_, 201))));
        // Two lost races, then the third read (with both of the other writer's changes) wins.
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        let seen = seen.into_inner().unwrap();
        assert_eq!(
            seen.iter().map(|(r, _)| r.clone()).collect::<Vec<_>>(),
            [Value::Null, json!("1"), json!("2")]
        );
        assert!(seen.windows(2).all(|w| w[0].1 < w[1].1), "{seen:?}");
        let (now, _) = stored(&s).await.unwrap();
        assert_eq!(now["data"], json!({"racer": "2", "mine": "yes"}));
    }

    #[tokio::test]
    async fn losing_every_race_is_a_conflict() {
        let (_dir, s) = store(usize::MAX).await;
        let calls = AtomicUsize::new(0);
        let out = update_with_retry(&s, info(), KEY, "cm", set_mine(&calls)).await;
        let Err(e) = out else { panic!("written") };
        assert_eq!(e.code, 409);
        assert_eq!(calls.load(Ordering::SeqCst), ATTEMPTS);
        let (now, _) = stored(&s).await.unwrap();
        assert_eq!(now["data"]["mine"], Value::Null);
    }

    #[tokio::test]
    async fn removal_retries_too_and_answers_with_the_delete_revision() {
        let (_dir, s) = store(1).await;
        let calls = AtomicUsize::new(0);
        let out = update_with_retry(&s, info(), KEY, "cm", |v, _| {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok(Attempt::Remove(v, ()))
        })
        .await;
        let Ok(Outcome::Removed(last, ())) = out else {
            panic!("not removed")
        };
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert_eq!(last["data"]["racer"], json!("1"));
        let rev = s.inner.current_revision().await.unwrap();
        assert_eq!(last["metadata"]["resourceVersion"], json!(rev.to_string()));
        assert!(stored(&s).await.is_none());
    }

    #[tokio::test]
    async fn an_answer_writes_nothing_and_errors_pass_through() {
        let (_dir, s) = store(0).await;
        let (_, before) = stored(&s).await.unwrap();
        let out = update_with_retry(&s, info(), KEY, "cm", |v, _| {
            Ok(Attempt::<()>::Answer(Reply::json(200, &v)))
        })
        .await;
        assert!(matches!(
            out,
            Ok(Outcome::Answered(Reply::Json { code: 200, .. }))
        ));
        let out = update_with_retry(&s, info(), KEY, "cm", |_, _| {
            Err::<Attempt<()>, _>(ApiError::conflict(info(), "cm"))
        })
        .await;
        assert!(matches!(out, Err(ApiError { code: 409, .. })));
        let (_, after) = stored(&s).await.unwrap();
        assert_eq!(before, after);
    }

    #[tokio::test]
    async fn a_missing_object_is_not_found() {
        let (_dir, s) = store(0).await;
        let calls = AtomicUsize::new(0);
        let out = update_with_retry(&s, info(), "/registry/configmaps/default/gone", "gone", {
            set_mine(&calls)
        })
        .await;
        assert!(matches!(out, Err(ApiError { code: 404, .. })));
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }
}
