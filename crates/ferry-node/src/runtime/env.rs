//! A container's environment from the API: the ConfigMaps and Secrets its `env`/`envFrom` refer to
//! and the Service variables (`<SVC>_SERVICE_HOST`...) of its namespace.

use super::*;

pub(super) struct ApiSource {
    pub(super) cms: HashMap<String, Option<BTreeMap<String, String>>>,
    pub(super) secrets: HashMap<String, Option<BTreeMap<String, String>>>,
}

impl EnvSource for ApiSource {
    fn config_map(&self, name: &str) -> Option<BTreeMap<String, String>> {
        self.cms.get(name).cloned().flatten()
    }
    fn secret(&self, name: &str) -> Option<BTreeMap<String, String>> {
        self.secrets.get(name).cloned().flatten()
    }
}

/// Fetches the ConfigMaps and Secrets a container's environment refers to.
pub(super) async fn env_source(client: &kube::Client, ns: &str, c: &Container) -> ApiSource {
    let mut cm_names = Vec::new();
    let mut secret_names = Vec::new();
    for e in c.env.clone().unwrap_or_default() {
        if let Some(f) = e.value_from {
            if let Some(r) = f.config_map_key_ref {
                cm_names.push(r.name);
            }
            if let Some(r) = f.secret_key_ref {
                secret_names.push(r.name);
            }
        }
    }
    for ef in c.env_from.clone().unwrap_or_default() {
        if let Some(r) = ef.config_map_ref {
            cm_names.push(r.name);
        }
        if let Some(r) = ef.secret_ref {
            secret_names.push(r.name);
        }
    }
    let mut src = ApiSource {
        cms: HashMap::new(),
        secrets: HashMap::new(),
    };
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    for n in cm_names {
        let v = cms.get_opt(&n).await.ok().flatten().map(|cm| {
            let mut d = cm.data.unwrap_or_default();
            for (k, v) in cm.binary_data.unwrap_or_default() {
                d.insert(k, String::from_utf8_lossy(&v.0).into_owned());
            }
            d
        });
        src.cms.insert(n, v);
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    for n in secret_names {
        let v = secrets.get_opt(&n).await.ok().flatten().map(|s| {
            let mut d: BTreeMap<String, String> = s
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                .collect();
            for (k, v) in s.string_data.unwrap_or_default() {
                d.insert(k, v);
            }
            d
        });
        src.secrets.insert(n, v);
    }
    src
}

pub(super) async fn service_vars(client: &kube::Client, pod: &Pod) -> Vec<(String, String)> {
    let api: Api<Service> = Api::all(client.clone());
    match api.list(&ListParams::default()).await {
        Ok(l) => envvars::service_env(pod, &l.items),
        Err(e) => {
            crate::node::log_api_error("listing services for env vars", &e);
            Vec::new()
        }
    }
}
