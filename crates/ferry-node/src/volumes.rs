//! Pod volumes: `secret`, `configMap`, `downwardAPI`, `projected` (configMap, secret,
//! downwardAPI and serviceAccountToken sources) and `emptyDir`, mounted into the pod's mount
//! namespace.
//!
//! Pure part: [`references`] (what a pod's volumes read) and [`render`] (the files a volume
//! holds: keys or `items`, `path`, `mode`/`defaultMode`, `optional`, as kubelet's volume plugins
//! decide them). IO: [`write_atomic`], kubelet's atomic writer: the files live in a
//! timestamped `..<n>` directory, `..data` points at it, and every visible entry is a symlink
//! through `..data`, so an update (a new directory and one `rename` of the `..data` link) is
//! seen all at once by readers.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, KeyToPath, Pod, Volume};

/// One file of a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct File {
    /// Relative path (no `..` component, not absolute).
    pub path: String,
    pub data: Vec<u8>,
    pub mode: u32,
}

/// What a pod's volumes read from the API.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct References {
    pub config_maps: BTreeSet<String>,
    pub secrets: BTreeSet<String>,
    /// (audience, expirationSeconds) of projected serviceAccountToken sources.
    pub tokens: BTreeSet<(String, i64)>,
}

/// The API objects a render reads (fetched beforehand).
pub trait Lookup {
    fn config_map(&self, name: &str) -> Option<BTreeMap<String, Vec<u8>>>;
    fn secret(&self, name: &str) -> Option<BTreeMap<String, Vec<u8>>>;
    /// A token for the pod's ServiceAccount (audience "" = the API server's).
    fn token(&self, audience: &str, expiration_seconds: i64) -> Result<String, VolumeError>;
}

pub const DEFAULT_MODE: u32 = 0o644;

/// Every object a pod's volumes refer to.
pub fn references(pod: &Pod) -> References {
    let mut r = References::default();
    for v in pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
    {
        if let Some(s) = &v.secret
            && let Some(n) = &s.secret_name
        {
            r.secrets.insert(n.clone());
        }
        if let Some(c) = &v.config_map {
            r.config_maps.insert(c.name.clone());
        }
        if let Some(p) = &v.projected {
            for src in p.sources.iter().flatten() {
                if let Some(c) = &src.config_map {
                    r.config_maps.insert(c.name.clone());
                }
                if let Some(s) = &src.secret {
                    r.secrets.insert(s.name.clone());
                }
                if let Some(t) = &src.service_account_token {
                    r.tokens.insert((
                        t.audience.clone().unwrap_or_default(),
                        t.expiration_seconds.unwrap_or(3607),
                    ));
                }
            }
        }
    }
    r
}

fn mode_of(m: Option<i32>, default: u32) -> u32 {
    m.map(|m| (m as u32) & 0o7777).unwrap_or(default)
}

/// Why a volume cannot be set up; the texts are kubelet's (`FailedMount` events).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VolumeError {
    #[error("invalid path {0:?}")]
    InvalidPath(String),
    /// A ConfigMap or Secret the volume needs does not exist (`kind`: "configmap", "secret").
    #[error("{kind} \"{name}\" not found")]
    SourceNotFound { kind: &'static str, name: String },
    /// An `items` key that the ConfigMap or Secret lacks.
    #[error(
        "{kind} references non-existent {} key: {key}",
        if *.kind == "secret" { "secret" } else { "config" }
    )]
    MissingKey { kind: &'static str, key: String },
    #[error("unsupported fieldPath {0:?} in a downwardAPI volume")]
    UnsupportedFieldPath(String),
    #[error("downwardAPI item {0:?} has no source")]
    NoSource(String),
    /// The TokenRequest for a projected service-account token failed.
    #[error("failed to fetch token: {0}")]
    Token(String),
    /// Reading a ConfigMap or Secret from the API failed.
    #[error("fetching {kind} {name:?}: {message}")]
    Fetch {
        kind: &'static str,
        name: String,
        message: String,
    },
    /// Writing the volume's files failed.
    #[error("{0}")]
    Write(String),
    /// A `persistentVolumeClaim` volume whose claim is missing, unbound, or bound to a volume
    /// this agent cannot mount (kubelet's message; the pod waits in ContainerCreating).
    #[error("{0}")]
    Claim(String),
    /// One volume of a pod failed.
    #[error("MountVolume.SetUp failed for volume \"{volume}\" : {source}")]
    SetUp {
        volume: String,
        source: Box<VolumeError>,
    },
}

fn clean_path(p: &str) -> Result<String, VolumeError> {
    if p.is_empty() || p.starts_with('/') || p.split('/').any(|c| c == ".." || c.starts_with(".."))
    {
        return Err(VolumeError::InvalidPath(p.to_string()));
    }
    Ok(p.to_string())
}

/// Files of a key/value source with optional `items` (configMap and secret volumes and
/// projections). `kind` names the source in errors ("configmap", "secret").
fn keyed(
    kind: &'static str,
    name: &str,
    data: Option<BTreeMap<String, Vec<u8>>>,
    items: Option<&Vec<KeyToPath>>,
    optional: bool,
    default_mode: u32,
) -> Result<Vec<File>, VolumeError> {
    let Some(data) = data else {
        if optional {
            return Ok(Vec::new());
        }
        return Err(VolumeError::SourceNotFound {
            kind,
            name: name.to_string(),
        });
    };
    let mut out = Vec::new();
    match items.filter(|i| !i.is_empty()) {
        None => {
            for (k, v) in data {
                out.push(File {
                    path: clean_path(&k)?,
                    data: v,
                    mode: default_mode,
                });
            }
        }
        Some(items) => {
            for it in items {
                match data.get(&it.key) {
                    Some(v) => out.push(File {
                        path: clean_path(&it.path)?,
                        data: v.clone(),
                        mode: mode_of(it.mode, default_mode),
                    }),
                    None if optional => {}
                    None => {
                        return Err(VolumeError::MissingKey {
                            kind,
                            key: it.key.clone(),
                        });
                    }
                }
            }
        }
    }
    Ok(out)
}

/// `key="value"` lines, sorted by key, as the downward API writes labels and annotations.
fn format_map(m: Option<&BTreeMap<String, String>>) -> String {
    m.into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v:?}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn downward_value(pod: &Pod, f: &DownwardAPIVolumeFile) -> Result<String, VolumeError> {
    if let Some(r) = &f.field_ref {
        let md = &pod.metadata;
        let path = r.field_path.as_str();
        let sub = |prefix: &str, m: Option<&BTreeMap<String, String>>| -> Option<String> {
            let key = path
                .strip_prefix(prefix)?
                .strip_prefix("['")?
                .strip_suffix("']")?;
            Some(m.and_then(|m| m.get(key)).cloned().unwrap_or_default())
        };
        return match path {
            "metadata.name" => Ok(md.name.clone().unwrap_or_default()),
            "metadata.namespace" => Ok(md.namespace.clone().unwrap_or_default()),
            "metadata.uid" => Ok(md.uid.clone().unwrap_or_default()),
            "metadata.labels" => Ok(format_map(md.labels.as_ref())),
            "metadata.annotations" => Ok(format_map(md.annotations.as_ref())),
            _ => sub("metadata.labels", md.labels.as_ref())
                .or_else(|| sub("metadata.annotations", md.annotations.as_ref()))
                .ok_or_else(|| VolumeError::UnsupportedFieldPath(path.to_string())),
        };
    }
    if let Some(r) = &f.resource_field_ref {
        // Processes have no limits: report what kubelet reports without limits (the node's
        // allocatable) only for the divisor-free common case; requests as given.
        let c = pod
            .spec
            .as_ref()
            .and_then(|s| {
                s.containers
                    .iter()
                    .find(|c| Some(&c.name) == r.container_name.as_ref())
            })
            .and_then(|c| c.resources.as_ref());
        let pick = |which: &str| -> Option<String> {
            let m = if which == "limits" {
                c?.limits.as_ref()
            } else {
                c?.requests.as_ref()
            }?;
            m.get(r.resource.split_once('.')?.1).map(|q| q.0.clone())
        };
        let which = r.resource.split('.').next().unwrap_or_default();
        return Ok(pick(which).unwrap_or_else(|| "0".into()));
    }
    Err(VolumeError::NoSource(f.path.clone()))
}

/// The files of a volume; `None` for an `emptyDir` (a plain directory) or a volume type this
/// agent does not populate.
pub fn render(v: &Volume, pod: &Pod, look: &dyn Lookup) -> Result<Option<Vec<File>>, VolumeError> {
    if let Some(s) = &v.secret {
        let name = s.secret_name.clone().unwrap_or_default();
        let dm = mode_of(s.default_mode, DEFAULT_MODE);
        return keyed(
            "secret",
            &name,
            look.secret(&name),
            s.items.as_ref(),
            s.optional.unwrap_or(false),
            dm,
        )
        .map(Some);
    }
    if let Some(c) = &v.config_map {
        let dm = mode_of(c.default_mode, DEFAULT_MODE);
        return keyed(
            "configmap",
            &c.name,
            look.config_map(&c.name),
            c.items.as_ref(),
            c.optional.unwrap_or(false),
            dm,
        )
        .map(Some);
    }
    if let Some(d) = &v.downward_api {
        let dm = mode_of(d.default_mode, DEFAULT_MODE);
        let mut out = Vec::new();
        for f in d.items.iter().flatten() {
            out.push(File {
                path: clean_path(&f.path)?,
                data: downward_value(pod, f)?.into_bytes(),
                mode: mode_of(f.mode, dm),
            });
        }
        return Ok(Some(out));
    }
    if let Some(p) = &v.projected {
        let dm = mode_of(p.default_mode, DEFAULT_MODE);
        let mut out = Vec::new();
        for src in p.sources.iter().flatten() {
            if let Some(c) = &src.config_map {
                out.extend(keyed(
                    "configmap",
                    &c.name,
                    look.config_map(&c.name),
                    c.items.as_ref(),
                    c.optional.unwrap_or(false),
                    dm,
                )?);
            }
            if let Some(s) = &src.secret {
                out.extend(keyed(
                    "secret",
                    &s.name,
                    look.secret(&s.name),
                    s.items.as_ref(),
                    s.optional.unwrap_or(false),
                    dm,
                )?);
            }
            if let Some(d) = &src.downward_api {
                for f in d.items.iter().flatten() {
                    out.push(File {
                        path: clean_path(&f.path)?,
                        data: downward_value(pod, f)?.into_bytes(),
                        mode: mode_of(f.mode, dm),
                    });
                }
            }
            if let Some(t) = &src.service_account_token {
                let token = look.token(
                    t.audience.as_deref().unwrap_or_default(),
                    t.expiration_seconds.unwrap_or(3607),
                )?;
                out.push(File {
                    path: clean_path(&t.path)?,
                    data: token.into_bytes(),
                    mode: dm,
                });
            }
        }
        return Ok(Some(out));
    }
    Ok(None)
}

/// Writes `files` into `dir` as kubelet's atomic writer does; returns whether anything changed.
pub fn write_atomic(dir: &Path, files: &[File]) -> std::io::Result<bool> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    let data_link = dir.join("..data");
    // Unchanged: nothing to do.
    if let Ok(current) = std::fs::read_link(&data_link) {
        let cur = dir.join(current);
        let same = files.iter().all(|f| {
            std::fs::read(cur.join(&f.path)).is_ok_and(|d| d == f.data)
                && std::fs::metadata(cur.join(&f.path))
                    .is_ok_and(|m| m.permissions().mode() & 0o7777 == f.mode)
        }) && count_files(&cur) == files.len();
        if same {
            return Ok(false);
        }
    }
    let stamp = format!(
        "..{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    );
    let ts = dir.join(&stamp);
    std::fs::create_dir_all(&ts)?;
    for f in files {
        let p = ts.join(&f.path);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&p, &f.data)?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(f.mode))?;
    }
    let old = std::fs::read_link(&data_link).ok();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&stamp, &tmp)?;
    std::fs::rename(&tmp, &data_link)?;
    // Visible entries: the first component of every path, through ..data.
    let top: BTreeSet<String> = files
        .iter()
        .filter_map(|f| f.path.split('/').next().map(str::to_string))
        .collect();
    for t in &top {
        let link = dir.join(t);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(PathBuf::from("..data").join(t), &link)?;
        }
    }
    for e in std::fs::read_dir(dir)?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("..") && !top.contains(&name) {
            let _ = std::fs::remove_file(e.path());
        }
    }
    if let Some(o) = old
        && o != Path::new(&stamp)
    {
        let _ = std::fs::remove_dir_all(dir.join(o));
    }
    Ok(true)
}

fn count_files(dir: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                count_files(&e.path())
            } else {
                1
            }
        })
        .sum()
}

/// Single-quotes a string for `sh`.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// A ServiceAccount token a projected volume holds, with what its refresh depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedToken {
    pub token: String,
    /// When it expires (Unix seconds, from the TokenRequest's `status.expirationTimestamp`).
    pub expires_unix: i64,
    /// Its lifetime (the TokenRequest's `spec.expirationSeconds`).
    pub ttl_seconds: i64,
}

/// Longest a token is kept, whatever its lifetime (kubelet's token manager `maxTTL`).
pub const MAX_TOKEN_TTL_SECONDS: i64 = 24 * 3600;
/// Upper bound of the random jitter added to refresh times (kubelet's `maxJitter`).
pub const MAX_TOKEN_JITTER_SECONDS: i64 = 10;

/// Whether a token must be requested again at `now` (Unix seconds), as kubelet's token manager
/// decides: once 80% of its lifetime has passed (less `jitter` seconds), or once it is older
/// than [`MAX_TOKEN_TTL_SECONDS`].
pub fn token_requires_refresh(now: i64, t: &CachedToken, jitter: i64) -> bool {
    let issued = t.expires_unix - t.ttl_seconds;
    if now > issued + MAX_TOKEN_TTL_SECONDS - jitter {
        return true;
    }
    now > t.expires_unix - t.ttl_seconds * 20 / 100 - jitter
}

/// The tokens of one pod's projected volumes, by (audience, expirationSeconds): reused by every
/// volume resync until [`token_requires_refresh`] says otherwise.
#[derive(Debug, Default)]
pub struct TokenCache {
    entries: std::sync::Mutex<BTreeMap<(String, i64), CachedToken>>,
}

impl TokenCache {
    /// The cached token, unless it is due for a refresh at `now`.
    pub fn fresh(&self, audience: &str, expiration: i64, now: i64, jitter: i64) -> Option<String> {
        let map = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&(audience.to_string(), expiration))
            .filter(|t| !token_requires_refresh(now, t, jitter))
            .map(|t| t.token.clone())
    }

    /// The token (cached or not) for (audience, expiration), if any.
    pub fn last(&self, audience: &str, expiration: i64) -> Option<CachedToken> {
        let map = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&(audience.to_string(), expiration)).cloned()
    }

    pub fn put(&self, audience: &str, expiration: i64, t: CachedToken) {
        let mut map = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        map.insert((audience.to_string(), expiration), t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn token_refresh_at_eighty_percent() {
        // Issued at 1000 for 3600 s: refreshed after 1000 + 2880 (80%), earlier by the jitter.
        let t = CachedToken {
            token: "t".into(),
            expires_unix: 4600,
            ttl_seconds: 3600,
        };
        let table = [
            (1000, 0, false),
            (3880, 0, false),
            (3881, 0, true),
            (3875, 10, true),
            (3869, 10, false),
            (4700, 0, true),
        ];
        for (now, jitter, want) in table {
            assert_eq!(
                token_requires_refresh(now, &t, jitter),
                want,
                "{now} {jitter}"
            );
        }
        // A token living longer than a day is refreshed after a day at most.
        let long = CachedToken {
            token: "t".into(),
            expires_unix: 10 * 86400,
            ttl_seconds: 10 * 86400,
        };
        assert!(!token_requires_refresh(86400 - 1, &long, 0));
        assert!(token_requires_refresh(86400 + 1, &long, 0));

        let cache = TokenCache::default();
        assert_eq!(cache.fresh("", 3607, 1000, 0), None);
        cache.put("", 3607, t.clone());
        assert_eq!(cache.fresh("", 3607, 2000, 0), Some("t".into()));
        assert_eq!(cache.fresh("aud", 3607, 2000, 0), None);
        assert_eq!(cache.fresh("", 3607, 4000, 0), None);
        assert_eq!(cache.last("", 3607), Some(t));
    }

    struct Objs;
    impl Lookup for Objs {
        fn config_map(&self, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
            (name == "cm").then(|| {
                BTreeMap::from([
                    ("nginx.conf".to_string(), b"server {}".to_vec()),
                    ("other".to_string(), b"x".to_vec()),
                ])
            })
        }
        fn secret(&self, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
            (name == "s").then(|| {
                BTreeMap::from([
                    ("tls.crt".to_string(), b"CRT".to_vec()),
                    ("tls.key".to_string(), b"KEY".to_vec()),
                ])
            })
        }
        fn token(&self, audience: &str, exp: i64) -> Result<String, VolumeError> {
            Ok(format!("tok-{audience}-{exp}"))
        }
    }

    fn pod(volumes: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1",
                         "labels": {"b": "2", "a": "1"}},
            "spec": {"containers": [{"name": "c"}], "volumes": volumes}
        }))
        .expect("pod")
    }

    fn vol(p: &Pod, i: usize) -> Volume {
        p.spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .and_then(|v| v.get(i))
            .cloned()
            .expect("volume")
    }

    #[test]
    fn render_table() {
        let p = pod(json!([
            {"name": "s", "secret": {"secretName": "s"}},
            {"name": "c", "configMap": {"name": "cm", "items": [{"key": "nginx.conf", "path": "conf/nginx.conf", "mode": 0o600}], "defaultMode": 0o640}},
            {"name": "missing", "secret": {"secretName": "nope"}},
            {"name": "opt", "secret": {"secretName": "nope", "optional": true}},
            {"name": "badkey", "configMap": {"name": "cm", "items": [{"key": "zzz", "path": "z"}]}},
            {"name": "d", "downwardAPI": {"items": [
                {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                {"path": "a", "fieldRef": {"fieldPath": "metadata.labels['a']"}}]}},
            {"name": "proj", "projected": {"defaultMode": 0o400, "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 600}},
                {"configMap": {"name": "cm", "items": [{"key": "other", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}},
            {"name": "e", "emptyDir": {}},
            {"name": "trav", "configMap": {"name": "cm", "items": [{"key": "other", "path": "../x"}]}}
        ]));
        let files = |i: usize| render(&vol(&p, i), &p, &Objs).map_err(|e| e.to_string());
        let s = files(0).expect("ok").expect("files");
        assert_eq!(
            s,
            vec![
                File {
                    path: "tls.crt".into(),
                    data: b"CRT".to_vec(),
                    mode: 0o644
                },
                File {
                    path: "tls.key".into(),
                    data: b"KEY".to_vec(),
                    mode: 0o644
                }
            ]
        );
        let c = files(1).expect("ok").expect("files");
        assert_eq!(c.len(), 1);
        assert_eq!((c[0].path.as_str(), c[0].mode), ("conf/nginx.conf", 0o600));
        assert_eq!(files(2), Err("secret \"nope\" not found".into()));
        assert_eq!(files(3), Ok(Some(Vec::new())));
        assert_eq!(
            files(4),
            Err("configmap references non-existent config key: zzz".into())
        );
        let d = files(5).expect("ok").expect("files");
        assert_eq!(d[0].data, b"a=\"1\"\nb=\"2\"".to_vec());
        assert_eq!(d[1].data, b"p".to_vec());
        assert_eq!(d[2].data, b"1".to_vec());
        let pr = files(6).expect("ok").expect("files");
        assert_eq!(pr[0].data, b"tok--600".to_vec());
        assert_eq!(pr[0].mode, 0o400);
        assert_eq!(pr[1].path, "ca.crt");
        assert_eq!(pr[2].data, b"ns".to_vec());
        assert_eq!(files(7), Ok(None));
        assert!(files(8).is_err());
        let r = references(&p);
        assert!(r.secrets.contains("s") && r.secrets.contains("nope"));
        assert!(r.config_maps.contains("cm"));
        assert_eq!(r.tokens.len(), 1);
    }

    #[test]
    fn atomic_writer_swaps_data() {
        let dir = tempfile::tempdir().expect("dir");
        let v = dir.path().join("vol");
        let f = |path: &str, data: &str| File {
            path: path.into(),
            data: data.as_bytes().to_vec(),
            mode: 0o644,
        };
        assert!(write_atomic(&v, &[f("a", "1"), f("sub/b", "2")]).expect("write"));
        assert_eq!(std::fs::read_to_string(v.join("a")).expect("a"), "1");
        assert_eq!(std::fs::read_to_string(v.join("sub/b")).expect("b"), "2");
        assert!(
            std::fs::symlink_metadata(v.join("a"))
                .expect("meta")
                .file_type()
                .is_symlink()
        );
        assert!(!write_atomic(&v, &[f("a", "1"), f("sub/b", "2")]).expect("same"));
        assert!(write_atomic(&v, &[f("a", "3")]).expect("update"));
        assert_eq!(std::fs::read_to_string(v.join("a")).expect("a"), "3");
        assert!(!v.join("sub").exists(), "a removed key disappears");
        let stamped = std::fs::read_dir(&v)
            .expect("dir")
            .flatten()
            .filter(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.starts_with("..") && n != "..data"
            })
            .count();
        assert_eq!(stamped, 1, "old data directories are removed");
        assert_eq!(sh_quote("a'b"), "'a'\\''b'");
    }
}

/// Where a `persistentVolumeClaim` volume lives on this node: the claim → its bound
/// PersistentVolume → the volume's `hostPath` or `local` path (mounted like a hostPath
/// volume). `Err` while the claim is missing or not bound yet, with kubelet's words.
pub fn claim_host_path(
    namespace: &str,
    claim_name: &str,
    claim: Option<&k8s_openapi::api::core::v1::PersistentVolumeClaim>,
    volume: Option<&k8s_openapi::api::core::v1::PersistentVolume>,
) -> Result<PathBuf, VolumeError> {
    let Some(c) = claim else {
        return Err(VolumeError::Claim(format!(
            "persistentvolumeclaim \"{claim_name}\" not found"
        )));
    };
    let phase = c
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("");
    let volume_name = c
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .unwrap_or("");
    if phase != "Bound" || volume_name.is_empty() {
        return Err(VolumeError::Claim(format!(
            "PVC {namespace}/{claim_name} has non-bound phase ({phase:?}) or empty pvc.Spec.VolumeName ({volume_name:?})"
        )));
    }
    let Some(v) = volume.filter(|v| v.metadata.name.as_deref() == Some(volume_name)) else {
        return Err(VolumeError::Claim(format!(
            "persistentvolume \"{volume_name}\" not found"
        )));
    };
    let spec = v.spec.as_ref();
    let path = spec
        .and_then(|s| s.host_path.as_ref().map(|h| h.path.clone()))
        .or_else(|| spec.and_then(|s| s.local.as_ref().map(|l| l.path.clone())));
    match path {
        Some(p) if p.starts_with('/') => Ok(PathBuf::from(p)),
        _ => Err(VolumeError::Claim(format!(
            "persistentvolume \"{volume_name}\": only hostPath and local volumes can be mounted by this node"
        ))),
    }
}

/// IO edge for a `persistentVolumeClaim` volume: reads the claim and its volume, then points
/// the pod's volume directory `dir` at the volume's path (a symlink, which the pod's bind
/// mount follows), creating a `DirectoryOrCreate` path. `Ok(false)`: `v` is no claim volume.
/// The pod worker calls it before rendering the other volume types; an `Err` keeps the pod
/// in ContainerCreating with a FailedMount event, as kubelet does while a claim is unbound.
pub async fn set_up_claim(
    client: &kube::Client,
    namespace: &str,
    v: &Volume,
    dir: &Path,
) -> Result<bool, VolumeError> {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    let Some(src) = &v.persistent_volume_claim else {
        return Ok(false);
    };
    let name = src.claim_name.as_str();
    let fetch = |e: kube::Error, kind: &'static str, n: &str| VolumeError::Fetch {
        kind,
        name: n.to_string(),
        message: e.to_string(),
    };
    let claims: kube::Api<PersistentVolumeClaim> = kube::Api::namespaced(client.clone(), namespace);
    let claim = claims
        .get_opt(name)
        .await
        .map_err(|e| fetch(e, "persistentvolumeclaim", name))?;
    let volume_name = claim
        .as_ref()
        .and_then(|c| c.spec.as_ref())
        .and_then(|s| s.volume_name.clone())
        .unwrap_or_default();
    let volume = if volume_name.is_empty() {
        None
    } else {
        let pvs: kube::Api<PersistentVolume> = kube::Api::all(client.clone());
        pvs.get_opt(&volume_name)
            .await
            .map_err(|e| fetch(e, "persistentvolume", &volume_name))?
    };
    let path = claim_host_path(namespace, name, claim.as_ref(), volume.as_ref())?;
    let create = volume
        .as_ref()
        .and_then(|v| v.spec.as_ref())
        .and_then(|s| s.host_path.as_ref())
        .and_then(|h| h.type_.as_deref())
        == Some("DirectoryOrCreate");
    let io = |e: std::io::Error| VolumeError::Write(e.to_string());
    if create {
        tokio::fs::create_dir_all(&path).await.map_err(io)?;
    }
    if let Ok(current) = tokio::fs::read_link(dir).await {
        if current == path {
            return Ok(true);
        }
        tokio::fs::remove_file(dir).await.map_err(io)?;
    } else if tokio::fs::symlink_metadata(dir).await.is_ok() {
        // An empty directory from before the claim was bound.
        tokio::fs::remove_dir(dir).await.map_err(io)?;
    }
    if let Some(parent) = dir.parent() {
        tokio::fs::create_dir_all(parent).await.map_err(io)?;
    }
    tokio::fs::symlink(&path, dir).await.map_err(io)?;
    Ok(true)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod claim_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn claim_host_path_table() {
        let claim = |phase: &str, vol: &str| -> k8s_openapi::api::core::v1::PersistentVolumeClaim {
            serde_json::from_value(json!({"metadata": {"name": "data"}, "spec": {"volumeName": vol}, "status": {"phase": phase}})).unwrap()
        };
        let pv = |src: serde_json::Value| -> k8s_openapi::api::core::v1::PersistentVolume {
            let mut spec = json!({});
            if let (Some(m), Some(s)) = (spec.as_object_mut(), src.as_object()) {
                m.extend(s.clone());
            }
            serde_json::from_value(json!({"metadata": {"name": "pv1"}, "spec": spec})).unwrap()
        };
        let host = pv(json!({"hostPath": {"path": "/data/storage/pv1"}}));
        let local = pv(json!({"local": {"path": "/mnt/disk"}}));
        let nfs = pv(json!({"nfs": {"server": "s", "path": "/x"}}));
        let bound = claim("Bound", "pv1");
        let pending = claim("Pending", "");
        let err = |r: Result<PathBuf, VolumeError>| r.unwrap_err().to_string();
        assert_eq!(
            claim_host_path("ns", "data", Some(&bound), Some(&host)).unwrap(),
            PathBuf::from("/data/storage/pv1")
        );
        assert_eq!(
            claim_host_path("ns", "data", Some(&bound), Some(&local)).unwrap(),
            PathBuf::from("/mnt/disk")
        );
        assert_eq!(
            err(claim_host_path("ns", "data", None, None)),
            "persistentvolumeclaim \"data\" not found"
        );
        assert_eq!(
            err(claim_host_path("ns", "data", Some(&pending), None)),
            "PVC ns/data has non-bound phase (\"Pending\") or empty pvc.Spec.VolumeName (\"\")"
        );
        assert_eq!(
            err(claim_host_path("ns", "data", Some(&bound), None)),
            "persistentvolume \"pv1\" not found"
        );
        assert!(
            err(claim_host_path("ns", "data", Some(&bound), Some(&nfs)))
                .contains("only hostPath and local")
        );
    }
}
