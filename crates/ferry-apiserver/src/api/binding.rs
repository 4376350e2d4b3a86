//! A Pod's `/binding` subresource (upstream's `BindingREST`): the scheduler assigns a pod to a
//! node once.

use serde_json::{Value, json};

use super::retry::{Attempt, Outcome, update_with_retry};
use super::{Api, ApiResult, Reply, Resource};
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
        let decide = |mut v: Value, _rev| {
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
                return Ok(Attempt::Answer(bound()));
            }
            Ok(Attempt::Update(v, ()))
        };
        match update_with_retry(self.store.as_ref(), info, &key, &name, decide).await? {
            Outcome::Answered(reply) => Ok(reply),
            Outcome::Updated(..) | Outcome::Removed(..) => Ok(bound()),
        }
    }
}

/// The answer to a binding: a `Success` Status with code 201.
fn bound() -> Reply {
    Reply::json(
        201,
        &json!({"kind": "Status", "apiVersion": "v1",
            "metadata": {}, "status": "Success", "code": 201}),
    )
}
