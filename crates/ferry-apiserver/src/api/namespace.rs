//! A Namespace's `/finalize` subresource (upstream's `FinalizeREST`): `spec.finalizers`, the
//! namespace controller's `kubernetes` finalizer among them, hold the deletion of a Namespace
//! besides its `metadata.finalizers`; writing the last one away removes it.

use serde_json::{Value, json};

use super::retry::{Attempt, Outcome, update_with_retry};
use super::{Api, ApiResult, Reply, Resource, deletion};
use crate::cache::set_resource_version;
use crate::objects;
use crate::request::{Query, ResourcePath};
use crate::status::ApiError;

impl Api {
    /// `PUT /api/v1/namespaces/<name>/finalize`: replaces `spec.finalizers`.
    pub async fn finalize_namespace(
        &self,
        res: &Resource,
        p: &ResourcePath,
        q: &Query,
        body: Value,
    ) -> ApiResult {
        let wanted = body
            .pointer("/spec/finalizers")
            .cloned()
            .unwrap_or(json!([]));
        self.write_spec_finalizers(res, p, q, wanted).await
    }

    /// Removes the `kubernetes` finalizer of a terminating Namespace (namespace lifecycle).
    pub async fn finalize(&self, res: &Resource, p: &ResourcePath) -> ApiResult {
        let key = res.key(None, p.name.as_deref().unwrap_or(""));
        let Some(kv) = self.store.get(&key).await? else {
            return Err(ApiError::not_found(
                res.info(),
                p.name.as_deref().unwrap_or(""),
            ));
        };
        let v: Value =
            serde_json::from_slice(&kv.value).map_err(|e| ApiError::internal(e.to_string()))?;
        let rest: Vec<String> = res
            .rest()
            .spec_finalizers(&v)
            .into_iter()
            .filter(|f| f != "kubernetes")
            .collect();
        self.write_spec_finalizers(res, p, &Query::default(), json!(rest))
            .await
    }

    async fn write_spec_finalizers(
        &self,
        res: &Resource,
        p: &ResourcePath,
        q: &Query,
        wanted: Value,
    ) -> ApiResult {
        let info = res.info();
        let name = p.name.clone().unwrap_or_default();
        let key = res.key(None, &name);
        let decide = |mut v: Value, rev| {
            if !v.get("spec").is_some_and(Value::is_object) {
                v["spec"] = json!({});
            }
            v["spec"]["finalizers"] = wanted.clone();
            if q.dry_run()? {
                set_resource_version(&mut v, rev);
                return Ok(Attempt::Answer(Reply::json(200, &v)));
            }
            // Namespaces are never deleted gracefully: their grace period does not count.
            if deletion::finalized(
                objects::is_deleting(&v),
                None,
                &objects::finalizers(&v),
                &res.rest().spec_finalizers(&v),
            ) {
                return Ok(Attempt::Remove(v, ()));
            }
            Ok(Attempt::Update(v, ()))
        };
        match update_with_retry(self.store.as_ref(), info, &key, &name, decide).await? {
            Outcome::Answered(reply) => Ok(reply),
            Outcome::Updated(v, ()) | Outcome::Removed(v, ()) => Ok(Reply::json(200, &v)),
        }
    }
}
