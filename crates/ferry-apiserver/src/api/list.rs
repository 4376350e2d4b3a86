//! LIST from the watch cache: one snapshot per paged list (the continue token carries its
//! revision), each page a seek to the continue key plus `limit` matching objects, served as the
//! cached bytes.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::json;

use super::{Api, ApiResult, Filter, Reply, Resource, served_object, table_reply};
use crate::cache::{CachedObject, PageError};
use crate::request::{Query, ResourcePath, Want};
use crate::{rv, table};

impl Api {
    pub async fn list(&self, res: &Resource, p: &ResourcePath, q: &Query, want: Want) -> ApiResult {
        let filter = Filter::parse(q)?;
        rv::check_list_send_initial(q.get("sendInitialEvents"))?;
        let limit = q.int("limit")?.filter(|l| *l > 0);
        let at = rv::list_at(
            q.get("resourceVersion").unwrap_or(""),
            q.get("resourceVersionMatch").unwrap_or(""),
            q.get("continue").filter(|s| !s.is_empty()),
            limit,
        )?;
        // Every page of a paged list is served at one revision: the first page's (carried in
        // the continue token), as etcd serves a range at a revision.
        let revision = match &at {
            rv::ListAt::Consistent => {
                self.consistent().await?;
                self.cache.revision()
            }
            rv::ListAt::Any => self.cache.revision(),
            rv::ListAt::NotOlderThan(n) => {
                self.wait_fresh(*n).await?;
                self.cache.revision()
            }
            // A token an expired list handed out: the rest at the latest revision.
            rv::ListAt::Continue { revision: n, .. } if *n == rv::CONTINUE_LATEST => {
                self.consistent().await?;
                self.cache.revision()
            }
            rv::ListAt::Exact(n) | rv::ListAt::Continue { revision: n, .. } => {
                self.wait_fresh(*n).await?;
                *n
            }
        };
        let limit = if at == rv::ListAt::Any { None } else { limit };
        let rc = self.rc(res)?;
        // Seek to the continue key in the ordered snapshot and take `limit` matching objects:
        // a page costs O(limit), not O(all objects); cached bytes are served as they are.
        let start = match &at {
            rv::ListAt::Continue { start, .. } => Some(format!("{}{}", res.prefix, start)),
            _ => None,
        };
        let page = rc
            .page(
                &res.list_prefix(p.namespace.as_deref()),
                revision,
                start.as_deref(),
                limit.map(|l| l as usize),
                filter.is_empty(),
                |o| filter.try_matches_cached(res, o),
            )
            .map_err(|e| match e {
                PageError::TooOld(_) => rv::too_old(&at),
                PageError::Filter(e) => e,
            })?;
        let items: Vec<Arc<CachedObject>> =
            page.items.iter().map(|o| served_object(res, o)).collect();
        let remaining = page.remaining;
        let cont = page.next.map(|key| {
            rv::encode_continue(revision, key.strip_prefix(&res.prefix).unwrap_or(&key))
        });
        let rv_s = revision.to_string();
        match want {
            Want::Table { v1beta1 } => {
                let mut t = table::build(res.strategy, &items, q, &rv_s, v1beta1);
                if let Some(c) = &cont {
                    t["metadata"]["continue"] = json!(c);
                }
                if let Some(n) = remaining {
                    t["metadata"]["remainingItemCount"] = json!(n);
                }
                Ok(table_reply(&t))
            }
            Want::Metadata { list: false, .. } => Err(crate::metadata::list_not_acceptable(
                res.info().group,
                res.info().kind,
            )),
            Want::Json | Want::Metadata { list: true, .. } => {
                let info = res.info();
                let meta_only = match want {
                    Want::Metadata { v1beta1, .. } => Some(v1beta1),
                    _ => None,
                };
                let mut meta = json!({"resourceVersion": rv_s});
                if let Some(c) = &cont {
                    meta["continue"] = json!(c);
                }
                if let Some(n) = remaining {
                    meta["remainingItemCount"] = json!(n);
                }
                let (list_kind, api_version) = match meta_only {
                    Some(v1beta1) => (
                        "PartialObjectMetadataList".to_string(),
                        crate::metadata::api_version(v1beta1).to_string(),
                    ),
                    None => (info.list_kind(), info.api_version()),
                };
                let size = match meta_only {
                    // A Pod's metadata is about a third of it.
                    Some(_) => items.iter().map(|o| o.bytes.len() / 3 + 64).sum::<usize>(),
                    None => items.iter().map(|o| o.bytes.len() + 1).sum::<usize>(),
                };
                let mut body = Vec::with_capacity(64 + size);
                body.extend_from_slice(
                    format!(
                        "{{\"kind\":\"{list_kind}\",\"apiVersion\":\"{api_version}\",\"metadata\":{meta},\"items\":["
                    )
                    .as_bytes(),
                );
                for (i, o) in items.iter().enumerate() {
                    if i > 0 {
                        body.push(b',');
                    }
                    match meta_only {
                        // Only the metadata's bytes, cut from the cached object.
                        Some(v1beta1) => {
                            crate::metadata::write_partial(&mut body, &o.bytes, v1beta1)
                        }
                        None => body.extend_from_slice(&o.bytes),
                    }
                }
                body.extend_from_slice(b"]}");
                Ok(Reply::Json {
                    code: 200,
                    body: Bytes::from(body),
                    content_type: "application/json",
                    warnings: Vec::new(),
                })
            }
        }
    }
}
