//! Label and field selectors of lists and watches, on values and on cached objects.

use std::sync::Arc;

use serde_json::Value;

use super::Resource;
use crate::cache::CachedObject;
use crate::objects;
use crate::request::Query;
use crate::status::ApiError;

/// Label and field selectors of a list or watch.
pub struct Filter {
    labels: Option<ferry_api::selectors::LabelSelector>,
    fields: Option<ferry_api::selectors::FieldSelector>,
}

impl Filter {
    pub fn parse(q: &Query) -> Result<Filter, ApiError> {
        let labels =
            match q.get("labelSelector").filter(|s| !s.trim().is_empty()) {
                Some(s) => Some(ferry_api::selectors::parse_label_selector(s).map_err(|e| {
                    ApiError::bad_request(format!("unable to parse requirement: {e}"))
                })?),
                None => None,
            };
        let fields = match q.get("fieldSelector").filter(|s| !s.trim().is_empty()) {
            Some(s) => Some(
                ferry_api::selectors::parse_field_selector(s)
                    .map_err(|e| ApiError::bad_request(format!("invalid field selector: {e}")))?,
            ),
            None => None,
        };
        Ok(Filter { labels, fields })
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_none() && self.fields.is_none()
    }

    /// Whether `v` matches; `Err` (a 400) when a field selector names a field the kind lacks.
    pub fn try_matches(&self, res: &Resource, v: &Value) -> Result<bool, ApiError> {
        if let Some(l) = &self.labels
            && !l.matches(&objects::labels(v))
        {
            return Ok(false);
        }
        if let Some(f) = &self.fields {
            return f
                .matches(|field| field_value(res, v, field))
                .map_err(ApiError::bad_request);
        }
        Ok(true)
    }

    pub fn matches(&self, res: &Resource, v: &Value) -> bool {
        self.try_matches(res, v).unwrap_or(false)
    }

    /// [`Filter::try_matches`] on a cached object: labels, `metadata.name` and
    /// `metadata.namespace` from its compact metadata; the object is decoded (once) only for
    /// other fields.
    pub fn try_matches_cached(&self, res: &Resource, o: &CachedObject) -> Result<bool, ApiError> {
        if let Some(l) = &self.labels
            && !l.is_empty()
            && !l.matches(&o.labels())
        {
            return Ok(false);
        }
        if let Some(f) = &self.fields {
            let decoded: std::cell::OnceCell<Value> = std::cell::OnceCell::new();
            return f
                .matches(|field| match field {
                    "metadata.name" => Some(o.name().to_string()),
                    "metadata.namespace" if res.info().namespaced => {
                        Some(o.namespace().to_string())
                    }
                    _ => field_value(res, decoded.get_or_init(|| o.value()), field),
                })
                .map_err(ApiError::bad_request);
        }
        Ok(true)
    }

    pub fn matches_cached(&self, res: &Resource, o: &CachedObject) -> bool {
        self.try_matches_cached(res, o).unwrap_or(false)
    }

    /// Keeps the matching objects; a 400 for an unsupported field.
    pub fn apply(
        &self,
        res: &Resource,
        items: Vec<Arc<CachedObject>>,
    ) -> Result<Vec<Arc<CachedObject>>, ApiError> {
        if self.is_empty() {
            return Ok(items);
        }
        let mut out = Vec::with_capacity(items.len());
        for o in items {
            if self.try_matches_cached(res, &o)? {
                out.push(o);
            }
        }
        Ok(out)
    }
}

fn field_value(res: &Resource, v: &Value, field: &str) -> Option<String> {
    match field {
        "metadata.name" => Some(objects::name(v).to_string()),
        "metadata.namespace" if res.info().namespaced => Some(objects::namespace(v).to_string()),
        _ => res.strategy.field(v, field),
    }
}
