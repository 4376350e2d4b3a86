//! A Namespace's `/finalize` subresource (upstream's `FinalizeREST`): `spec.finalizers`, the
//! namespace controller's `kubernetes` finalizer among them, hold the deletion of a Namespace
//! besides its `metadata.finalizers`; writing the last one away removes it.

use bytes::Bytes;
use serde_json::{Value, json};

use super::{Api, ApiResult, Reply, Resource, cas, deletion};
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
        for _ in 0..16 {
            let Some(kv) = self.store.get(&key).await? else {
                return Err(ApiError::not_found(info, &name));
            };
            let mut v: Value =
                serde_json::from_slice(&kv.value).map_err(|e| ApiError::internal(e.to_string()))?;
            if !v.get("spec").is_some_and(Value::is_object) {
                v["spec"] = json!({});
            }
            v["spec"]["finalizers"] = wanted.clone();
            if q.dry_run()? {
                set_resource_version(&mut v, kv.mod_revision);
                return Ok(Reply::json(200, &v));
            }
            // Namespaces are never deleted gracefully: their grace period does not count.
            if deletion::finalized(
                objects::is_deleting(&v),
                None,
                &objects::finalizers(&v),
                &res.rest().spec_finalizers(&v),
            ) {
                let Some((_, rev)) = cas(
                    self.store.delete(&key, Some(kv.mod_revision)).await,
                    info,
                    &name,
                )?
                else {
                    continue;
                };
                set_resource_version(&mut v, rev);
                return Ok(Reply::json(200, &v));
            }
            let bytes =
                Bytes::from(serde_json::to_vec(&v).map_err(|e| ApiError::internal(e.to_string()))?);
            let Some(nkv) = cas(
                self.store.update(&key, bytes, kv.mod_revision).await,
                info,
                &name,
            )?
            else {
                continue;
            };
            set_resource_version(&mut v, nkv.mod_revision);
            return Ok(Reply::json(200, &v));
        }
        Err(ApiError::conflict(info, &name))
    }
}
