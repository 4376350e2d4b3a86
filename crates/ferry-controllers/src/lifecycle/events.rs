//! Recording core/v1 Events about objects through ferry-kubeclient's one recorder (fire and
//! forget: an Event that cannot be written never holds up a controller).

use ferry_kubeclient::events::{Recorder, Source};
use k8s_openapi::api::core::v1::ObjectReference;

pub(crate) use ferry_kubeclient::events::reference;

/// Writes an Event in the background.
pub(crate) fn record(
    client: &kube::Client,
    about: ObjectReference,
    type_: &str,
    reason: &str,
    message: String,
    component: &'static str,
) {
    Recorder::new(client.clone(), Source::new(component)).record(about, type_, reason, message);
}
