//! A Pod's `/binding` subresource (upstream's `BindingREST`): the scheduler assigns a pod to a
//! node once.

use bytes::Bytes;
use serde_json::{Value, json};

use super::{Api, ApiResult, Reply, Resource, cas};
use crate::objects;
use crate::request::{Query, ResourcePath};
use crate::status::ApiError;

impl Api {
    /// `POST pods/<name>/binding`: sets `spec.nodeName` once (409 when already assigned) and the
    /// `PodScheduled` condition, as upstream's binding REST storage.
    pub async fn bind_pod(
        &self,
        res: &Resource,
        p: &ResourcePath,
        q: &Query,
        body: Value,
    ) -> ApiResult {
        let info = res.info();
        let name = p.name.clone().unwrap_or_default();
        let node = body
            .pointer("/target/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if node.is_empty() {
            return Err(ApiError::invalid(
                info,
                &name,
                &[ferry_api::errors::FieldError::required(
                    ferry_api::errors::Path::new("target").child("name"),
                    "",
                )],
            ));
        }
        let key = res.key(p.namespace.as_deref(), &name);
        for _ in 0..16 {
            let Some(kv) = self.store.get(&key).await? else {
                return Err(ApiError::not_found(info, &name));
            };
            let mut v: Value =
                serde_json::from_slice(&kv.value).map_err(|e| ApiError::internal(e.to_string()))?;
            if objects::is_deleting(&v) {
                return Err(ApiError::conflict_msg(
                    info,
                    &name,
                    &format!("pod {name} is being deleted, cannot be assigned to a host"),
                ));
            }
            let cur = v
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .unwrap_or("");
            if !cur.is_empty() {
                return Err(ApiError::conflict_msg(
                    info,
                    &name,
                    &format!("pod {name} is already assigned to node {cur:?}"),
                ));
            }
            v["spec"]["nodeName"] = json!(node);
            if !v.get("status").is_some_and(Value::is_object) {
                v["status"] = json!({});
            }
            let mut conds: Vec<Value> = v["status"]
                .get("conditions")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            conds.retain(|c| c.get("type").and_then(Value::as_str) != Some("PodScheduled"));
            conds.push(json!({"type": "PodScheduled", "status": "True",
                "lastProbeTime": null, "lastTransitionTime": objects::rfc3339_in(0)}));
            v["status"]["conditions"] = json!(conds);
            if q.dry_run()? {
                return Ok(Reply::json(
                    201,
                    &json!({"kind": "Status", "apiVersion": "v1",
                    "metadata": {}, "status": "Success", "code": 201}),
                ));
            }
            let bytes =
                Bytes::from(serde_json::to_vec(&v).map_err(|e| ApiError::internal(e.to_string()))?);
            let Some(_) = cas(
                self.store.update(&key, bytes, kv.mod_revision).await,
                info,
                &name,
            )?
            else {
                continue;
            };
            return Ok(Reply::json(
                201,
                &json!({"kind": "Status", "apiVersion": "v1",
                    "metadata": {}, "status": "Success", "code": 201}),
            ));
        }
        Err(ApiError::conflict(info, &name))
    }
}
