//! Keeping a pod's volumes in step with the API objects they project (ConfigMaps, Secrets,
//! service-account tokens).

use super::*;
use crate::volumes::VolumeError;

/// Objects a pod's volumes read, fetched from the API.
pub(super) struct VolumeObjects {
    pub(super) cms: HashMap<String, BTreeMap<String, Vec<u8>>>,
    pub(super) secrets: HashMap<String, BTreeMap<String, Vec<u8>>>,
    pub(super) tokens: HashMap<(String, i64), Result<String, VolumeError>>,
}

impl crate::volumes::Lookup for VolumeObjects {
    fn config_map(&self, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
        self.cms.get(name).cloned()
    }
    fn secret(&self, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
        self.secrets.get(name).cloned()
    }
    fn token(&self, audience: &str, exp: i64) -> Result<String, VolumeError> {
        self.tokens
            .get(&(audience.to_string(), exp))
            .cloned()
            .unwrap_or_else(|| Err(VolumeError::Token("not requested".into())))
    }
}

/// A bound ServiceAccount token through the TokenRequest API, as kubelet asks for projected
/// volumes (bound to the pod), with its expiry.
pub(super) async fn request_token(
    client: &kube::Client,
    pod: &Pod,
    audience: &str,
    exp: i64,
) -> Result<crate::volumes::CachedToken, VolumeError> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let sa = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".into());
    let body = json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {
            "audiences": if audience.is_empty() { json!([]) } else { json!([audience]) },
            "expirationSeconds": exp,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
                "name": pod.metadata.name, "uid": pod.metadata.uid},
        }
    });
    let req = http::Request::post(format!(
        "/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token"
    ))
    .header("content-type", "application/json")
    .body(body.to_string().into_bytes())
    .map_err(|e| VolumeError::Token(e.to_string()))?;
    let v: Value = client
        .request(req)
        .await
        .map_err(|e| VolumeError::Token(e.to_string()))?;
    let token = v
        .pointer("/status/token")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| VolumeError::Token("no token in the answer".into()))?;
    let ttl = v
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(exp);
    let now = jiff::Timestamp::now().as_second();
    let expires_unix = v
        .pointer("/status/expirationTimestamp")
        .and_then(Value::as_str)
        .and_then(|s| s.parse::<jiff::Timestamp>().ok())
        .map(|t| t.as_second())
        .unwrap_or(now + ttl);
    Ok(crate::volumes::CachedToken {
        token,
        expires_unix,
        ttl_seconds: ttl,
    })
}

/// Renders and writes every volume of the pod; the first failure, as kubelet words it.
pub(super) async fn sync_volumes(
    rt: &Runtime,
    pod: &Pod,
    dirs: &PodDirs,
    tokens: &crate::volumes::TokenCache,
) -> Result<(), VolumeError> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let refs = crate::volumes::references(pod);
    let mut objs = VolumeObjects {
        cms: HashMap::new(),
        secrets: HashMap::new(),
        tokens: HashMap::new(),
    };
    let cms: Api<ConfigMap> = Api::namespaced(rt.client.clone(), &ns);
    for n in &refs.config_maps {
        match cms.get_opt(n).await {
            Ok(Some(cm)) => {
                let mut d: BTreeMap<String, Vec<u8>> = cm
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.into_bytes()))
                    .collect();
                for (k, v) in cm.binary_data.unwrap_or_default() {
                    d.insert(k, v.0);
                }
                objs.cms.insert(n.clone(), d);
            }
            Ok(None) => {}
            Err(e) => {
                return Err(VolumeError::Fetch {
                    kind: "configmap",
                    name: n.clone(),
                    message: e.to_string(),
                });
            }
        }
    }
    let secrets: Api<Secret> = Api::namespaced(rt.client.clone(), &ns);
    for n in &refs.secrets {
        match secrets.get_opt(n).await {
            Ok(Some(s)) => {
                let mut d: BTreeMap<String, Vec<u8>> = s
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0))
                    .collect();
                for (k, v) in s.string_data.unwrap_or_default() {
                    d.insert(k, v.into_bytes());
                }
                objs.secrets.insert(n.clone(), d);
            }
            Ok(None) => {}
            Err(e) => {
                return Err(VolumeError::Fetch {
                    kind: "secret",
                    name: n.clone(),
                    message: e.to_string(),
                });
            }
        }
    }
    let now = jiff::Timestamp::now().as_second();
    for (aud, exp) in &refs.tokens {
        // A jitter in [0, maxJitter) so pods' refreshes spread out.
        let jitter = i64::from(jiff::Timestamp::now().subsec_nanosecond())
            % crate::volumes::MAX_TOKEN_JITTER_SECONDS;
        let t = match tokens.fresh(aud, *exp, now, jitter) {
            Some(t) => Ok(t),
            None => match request_token(&rt.client, pod, aud, *exp).await {
                Ok(t) => {
                    let token = t.token.clone();
                    tokens.put(aud, *exp, t);
                    Ok(token)
                }
                // A failed refresh keeps the previous token while it is still valid.
                Err(e) => match tokens.last(aud, *exp).filter(|t| t.expires_unix > now) {
                    Some(t) => {
                        tracing::warn!("refreshing a projected token: {e}");
                        Ok(t.token)
                    }
                    None => Err(e),
                },
            },
        };
        objs.tokens.insert((aud.clone(), *exp), t);
    }
    for v in pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
    {
        let dir = dirs.volume(&v.name);
        let fail = |e: VolumeError| VolumeError::SetUp {
            volume: v.name.clone(),
            source: Box::new(e),
        };
        // A claim's volume is its bound PersistentVolume's path (the pod waits, FailedMount,
        // while the claim is unbound).
        if crate::volumes::set_up_claim(&rt.client, &ns, v, &dir)
            .await
            .map_err(fail)?
        {
            continue;
        }
        match crate::volumes::render(v, pod, &objs).map_err(fail)? {
            Some(files) => {
                crate::volumes::write_atomic(&dir, &files)
                    .map_err(|e| fail(VolumeError::Write(e.to_string())))?;
            }
            None => {
                tokio::fs::create_dir_all(&dir)
                    .await
                    .map_err(|e| fail(VolumeError::Write(e.to_string())))?;
            }
        }
    }
    Ok(())
}
