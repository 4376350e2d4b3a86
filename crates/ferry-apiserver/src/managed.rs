//! `metadata.managedFields` bookkeeping for ordinary writes (server-side apply records its own).

use ferry_api::kinds::KindInfo;
use serde_json::Value;

/// Records that `manager` wrote `new` (over `old`) with `operation`.
pub fn record(
    new: &mut Value,
    old: Option<&Value>,
    manager: &str,
    operation: &str,
    subresource: Option<&str>,
    info: &KindInfo,
) {
    if manager.is_empty() {
        return;
    }
    let now = crate::objects::now_rfc3339();
    *new = ferry_api::patch::managed::record_update(
        old,
        new,
        manager,
        operation,
        subresource,
        &info.api_version(),
        &now,
    );
}
