//! A CNI runtime, per the Container Network Interface specification: network configuration
//! lists (`*.conflist`, or a single `*.conf` wrapped into one), plugins executed with the
//! `CNI_*` environment and the configuration on stdin, ADD in order with each result passed to
//! the next plugin as `prevResult`, DEL in reverse order with the cached result, CHECK, and a
//! result cache on disk so DEL works after the agent restarts.
//!
//! Pure parts: [`ConfList`] parsing, [`plugin_config`] (what one plugin receives),
//! [`default_conflist`] (the reference `bridge` + `host-local` + `portmap` network of a node),
//! [`result_ips`]. IO: [`Cni`].

use std::collections::BTreeMap;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ipnet::IpNet;
use serde_json::{Value, json};

#[derive(Debug, thiserror::Error)]
pub enum CniError {
    #[error("invalid network configuration: {0}")]
    Config(String),
    #[error("plugin type={plugin:?} failed ({command}): {msg}")]
    Plugin {
        plugin: String,
        command: String,
        code: i64,
        msg: String,
    },
    #[error("failed to find plugin {0:?} in path {1}")]
    NotFound(String, String),
    #[error("running plugin {0:?}: {1}")]
    Exec(String, std::io::Error),
}

/// A network configuration list.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfList {
    pub cni_version: String,
    pub name: String,
    pub disable_check: bool,
    pub plugins: Vec<Value>,
}

impl ConfList {
    /// Parses a `.conflist` document, or a single plugin `.conf` (wrapped into a list).
    pub fn parse(text: &str) -> Result<ConfList, CniError> {
        let v: Value = serde_json::from_str(text).map_err(|e| CniError::Config(e.to_string()))?;
        let name = v
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| CniError::Config("missing network name".into()))?
            .to_string();
        let cni_version = v
            .get("cniVersion")
            .and_then(Value::as_str)
            .unwrap_or("0.1.0")
            .to_string();
        let plugins = match v.get("plugins") {
            Some(Value::Array(p)) => p.clone(),
            Some(_) => return Err(CniError::Config("\"plugins\" must be a list".into())),
            None if v.get("type").is_some() => vec![v.clone()],
            None => return Err(CniError::Config("no plugins in the network".into())),
        };
        if plugins.is_empty() {
            return Err(CniError::Config("no plugins in the network".into()));
        }
        for p in &plugins {
            if p.get("type")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                return Err(CniError::Config(format!("a plugin has no type: {p}")));
            }
        }
        Ok(ConfList {
            disable_check: v
                .get("disableCheck")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            cni_version,
            name,
            plugins,
        })
    }

    pub fn to_json(&self) -> Value {
        json!({
            "cniVersion": self.cni_version,
            "name": self.name,
            "disableCheck": self.disable_check,
            "plugins": self.plugins,
        })
    }

    /// The first configuration of a directory, in lexical order of file names, among
    /// `*.conflist`, `*.conf` and `*.json` (as kubelet's and containerd's CNI loaders do).
    pub fn load_dir(dir: &Path) -> Result<Option<(PathBuf, ConfList)>, CniError> {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return Ok(None);
        };
        let mut files: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.extension()
                    .and_then(|e| e.to_str())
                    .is_some_and(|e| ["conflist", "conf", "json"].contains(&e))
            })
            .collect();
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(&f)
                .map_err(|e| CniError::Config(format!("{}: {e}", f.display())))?;
            match ConfList::parse(&text) {
                Ok(c) => return Ok(Some((f, c))),
                Err(e) => tracing::warn!("skipping CNI configuration {}: {e}", f.display()),
            }
        }
        Ok(None)
    }
}

/// What one plugin receives on stdin: its own object with the list's `cniVersion` and `name`,
/// the previous result (when there is one), and `runtimeConfig` holding those capability
/// arguments the plugin declared in `capabilities`.
pub fn plugin_config(
    list: &ConfList,
    plugin: &Value,
    prev: Option<&Value>,
    capability_args: &BTreeMap<String, Value>,
) -> Value {
    let mut c = plugin.clone();
    if let Some(o) = c.as_object_mut() {
        o.insert("cniVersion".into(), json!(list.cni_version));
        o.insert("name".into(), json!(list.name));
        o.remove("capabilities");
        if let Some(p) = prev {
            o.insert("prevResult".into(), p.clone());
        }
        let mut rc = serde_json::Map::new();
        if let Some(caps) = plugin.get("capabilities").and_then(Value::as_object) {
            for (k, on) in caps {
                if on.as_bool() == Some(true)
                    && let Some(v) = capability_args.get(k)
                {
                    rc.insert(k.clone(), v.clone());
                }
            }
        }
        if !rc.is_empty() {
            o.insert("runtimeConfig".into(), Value::Object(rc));
        }
    }
    c
}

/// The default network of a node: the reference `bridge` plugin on `cni0` (gateway, default
/// routes, hairpin so a pod reaches itself through its Service), `host-local` addresses from
/// the node's pod CIDRs (one range per family), then `portmap` for hostPorts.
pub fn default_conflist(name: &str, pod_cidrs: &[IpNet], ipam_dir: &Path) -> ConfList {
    let ranges: Vec<Value> = pod_cidrs
        .iter()
        .map(|c| json!([{"subnet": c.trunc().to_string()}]))
        .collect();
    let text = json!({
        "cniVersion": "1.0.0",
        "name": name,
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "isDefaultGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": ranges,
                    "dataDir": ipam_dir.display().to_string(),
                }
            },
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    });
    // Built from a literal: parsing cannot fail.
    ConfList::parse(&text.to_string()).unwrap_or(ConfList {
        cni_version: "1.0.0".into(),
        name: name.into(),
        disable_check: false,
        plugins: Vec::new(),
    })
}

/// The addresses of a result (1.0.0 / 0.4.0 / 0.3.x `ips`, or 0.2.0 `ip4`/`ip6`).
pub fn result_ips(result: &Value) -> Vec<IpNet> {
    let mut out = Vec::new();
    if let Some(ips) = result.get("ips").and_then(Value::as_array) {
        for i in ips {
            if let Some(a) = i.get("address").and_then(Value::as_str)
                && let Ok(n) = a.parse::<IpNet>()
            {
                out.push(n);
            }
        }
    }
    for k in ["ip4", "ip6"] {
        if let Some(a) = result.pointer(&format!("/{k}/ip")).and_then(Value::as_str)
            && let Ok(n) = a.parse::<IpNet>()
        {
            out.push(n);
        }
    }
    out
}

/// Pod addresses of a result, IPv4 first (the pod's primary family when both exist).
pub fn pod_ips(result: &Value) -> Vec<IpAddr> {
    let mut v: Vec<IpAddr> = result_ips(result).iter().map(|n| n.addr()).collect();
    v.sort_by_key(|ip| ip.is_ipv6());
    v.dedup();
    v
}

/// One attachment of a container to a network.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Attachment {
    pub container_id: String,
    pub netns: PathBuf,
    pub ifname: String,
    /// `CNI_ARGS` pairs (kubelet passes `K8S_POD_NAMESPACE`, `K8S_POD_NAME`, ...).
    pub args: Vec<(String, String)>,
    pub capability_args: BTreeMap<String, Value>,
}

impl Attachment {
    fn cni_args(&self) -> String {
        let mut v = vec!["IgnoreUnknown=1".to_string()];
        v.extend(self.args.iter().map(|(k, val)| format!("{k}={val}")));
        v.join(";")
    }
}

/// What the cache holds per attachment (as libcni's `cniCacheV1`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CacheEntry {
    pub kind: String,
    #[serde(rename = "networkName")]
    pub network_name: String,
    pub attachment: Attachment,
    /// The configuration list in effect at ADD time (DEL uses it even if the file changed).
    pub config: Value,
    pub result: Value,
}

/// The file name of an attachment's cache entry.
pub fn cache_file_name(network: &str, container_id: &str, ifname: &str) -> String {
    let clean = |s: &str| {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect::<String>()
    };
    format!(
        "{}-{}-{}",
        clean(network),
        clean(container_id),
        clean(ifname)
    )
}

/// Runs plugins.
#[derive(Debug, Clone)]
pub struct Cni {
    /// Where plugin executables are looked up (`CNI_PATH`).
    pub bin_dirs: Vec<PathBuf>,
    /// The network namespace plugins run in (a node namespace); `None`: this one.
    pub exec_netns: Option<PathBuf>,
    /// The result cache.
    pub cache_dir: PathBuf,
}

impl Cni {
    fn find(&self, plugin: &str) -> Result<PathBuf, CniError> {
        self.bin_dirs
            .iter()
            .map(|d| d.join(plugin))
            .find(|p| p.is_file())
            .ok_or_else(|| CniError::NotFound(plugin.to_string(), self.cni_path()))
    }

    fn cni_path(&self) -> String {
        self.bin_dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(":")
    }

    /// Runs one plugin; returns its parsed stdout (Null for an empty one).
    pub fn exec(&self, command: &str, att: &Attachment, conf: &Value) -> Result<Value, CniError> {
        let ty = conf
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let bin = self.find(&ty)?;
        let mut cmd = match &self.exec_netns {
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net={}", ns.display())).arg("--").arg(&bin);
                c
            }
            None => Command::new(&bin),
        };
        let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into());
        cmd.env_clear()
            .env("PATH", path)
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", &att.container_id)
            .env("CNI_NETNS", &att.netns)
            .env("CNI_IFNAME", &att.ifname)
            .env("CNI_ARGS", att.cni_args())
            .env("CNI_PATH", self.cni_path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| CniError::Exec(ty.clone(), e))?;
        if let Some(mut si) = child.stdin.take() {
            let body = conf.to_string();
            si.write_all(body.as_bytes())
                .map_err(|e| CniError::Exec(ty.clone(), e))?;
        }
        let out = child
            .wait_with_output()
            .map_err(|e| CniError::Exec(ty.clone(), e))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            let (code, msg) = match serde_json::from_str::<Value>(&stdout) {
                Ok(v) => {
                    let mut m = v
                        .get("msg")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string();
                    if let Some(d) = v.get("details").and_then(Value::as_str)
                        && !d.is_empty()
                    {
                        m = format!("{m}: {d}");
                    }
                    (v.get("code").and_then(Value::as_i64).unwrap_or(999), m)
                }
                Err(_) => (
                    999,
                    format!(
                        "{} {}",
                        stdout.trim(),
                        String::from_utf8_lossy(&out.stderr).trim()
                    )
                    .trim()
                    .to_string(),
                ),
            };
            return Err(CniError::Plugin {
                plugin: ty,
                command: command.to_string(),
                code,
                msg,
            });
        }
        if stdout.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&stdout).map_err(|e| CniError::Plugin {
            plugin: ty,
            command: command.to_string(),
            code: 999,
            msg: format!("unreadable result: {e}"),
        })
    }

    /// ADD: every plugin in order, each given the previous result; caches the final result.
    pub fn add(&self, list: &ConfList, att: &Attachment) -> Result<Value, CniError> {
        let mut prev: Option<Value> = None;
        for p in &list.plugins {
            let conf = plugin_config(list, p, prev.as_ref(), &att.capability_args);
            let r = self.exec("ADD", att, &conf)?;
            if !r.is_null() {
                prev = Some(r);
            }
        }
        let result = prev.unwrap_or_else(|| json!({"cniVersion": list.cni_version}));
        self.write_cache(list, att, &result);
        Ok(result)
    }

    /// CHECK: every plugin in order with the cached result (spec 0.4.0 and later).
    pub fn check(&self, list: &ConfList, att: &Attachment) -> Result<(), CniError> {
        if list.disable_check
            || matches!(
                list.cni_version.as_str(),
                "0.1.0" | "0.2.0" | "0.3.0" | "0.3.1"
            )
        {
            return Ok(());
        }
        let prev = self
            .read_cache(&list.name, &att.container_id, &att.ifname)
            .map(|c| c.result);
        for p in &list.plugins {
            let conf = plugin_config(list, p, prev.as_ref(), &att.capability_args);
            self.exec("CHECK", att, &conf)?;
        }
        Ok(())
    }

    /// DEL: every plugin in reverse order with the cached result; the first error is returned
    /// after every plugin ran (so one failing plugin does not leak the others' state).
    pub fn del(&self, list: &ConfList, att: &Attachment) -> Result<(), CniError> {
        let prev = self
            .read_cache(&list.name, &att.container_id, &att.ifname)
            .map(|c| c.result);
        let mut first_err = None;
        for p in list.plugins.iter().rev() {
            let conf = plugin_config(list, p, prev.as_ref(), &att.capability_args);
            if let Err(e) = self.exec("DEL", att, &conf) {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => {
                let _ = std::fs::remove_file(self.cache_dir.join(cache_file_name(
                    &list.name,
                    &att.container_id,
                    &att.ifname,
                )));
                Ok(())
            }
        }
    }

    fn write_cache(&self, list: &ConfList, att: &Attachment, result: &Value) {
        let entry = CacheEntry {
            kind: "cniCacheV1".into(),
            network_name: list.name.clone(),
            attachment: att.clone(),
            config: list.to_json(),
            result: result.clone(),
        };
        let file = self
            .cache_dir
            .join(cache_file_name(&list.name, &att.container_id, &att.ifname));
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(&self.cache_dir)?;
            let tmp = file.with_extension("tmp");
            std::fs::write(&tmp, serde_json::to_vec(&entry)?)?;
            std::fs::rename(&tmp, &file)
        };
        if let Err(e) = write() {
            tracing::warn!("writing CNI cache {}: {e}", file.display());
        }
    }

    pub fn read_cache(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
    ) -> Option<CacheEntry> {
        let text = std::fs::read(self.cache_dir.join(cache_file_name(
            network,
            container_id,
            ifname,
        )))
        .ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Every cached attachment (for DEL after a restart).
    pub fn cached(&self) -> Vec<CacheEntry> {
        let Ok(rd) = std::fs::read_dir(&self.cache_dir) else {
            return Vec::new();
        };
        rd.flatten()
            .filter(|e| e.path().extension().is_none())
            .filter_map(|e| std::fs::read(e.path()).ok())
            .filter_map(|b| serde_json::from_slice(&b).ok())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_lists_and_single_confs() {
        let l = ConfList::parse(
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"},{"type":"portmap","capabilities":{"portMappings":true}}]}"#,
        )
        .expect("list");
        assert_eq!(l.name, "n");
        assert_eq!(l.plugins.len(), 2);
        let single =
            ConfList::parse(r#"{"cniVersion":"0.4.0","name":"s","type":"ptp"}"#).expect("single");
        assert_eq!(single.plugins.len(), 1);
        assert_eq!(single.cni_version, "0.4.0");
        for bad in [
            "{",
            r#"{"name":"x","plugins":[]}"#,
            r#"{"plugins":[{"type":"a"}]}"#,
            r#"{"name":"x","plugins":[{"foo":1}]}"#,
            r#"{"name":"x","plugins":{}}"#,
        ] {
            assert!(ConfList::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn plugin_configs_carry_name_version_prev_and_capabilities() {
        let l = default_conflist(
            "ferry",
            &[
                "10.244.1.0/24".parse().expect("net"),
                "fd00:10:244:1::/64".parse().expect("net"),
            ],
            Path::new("/d/ipam"),
        );
        assert_eq!(
            l.plugins[0]["ipam"]["ranges"],
            json!([[{"subnet": "10.244.1.0/24"}], [{"subnet": "fd00:10:244:1::/64"}]])
        );
        let mut caps = BTreeMap::new();
        caps.insert(
            "portMappings".to_string(),
            json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]),
        );
        caps.insert("bandwidth".to_string(), json!({}));
        let first = plugin_config(&l, &l.plugins[0], None, &caps);
        assert_eq!(first["name"], "ferry");
        assert_eq!(first["cniVersion"], "1.0.0");
        assert!(first.get("prevResult").is_none());
        assert!(first.get("runtimeConfig").is_none(), "bridge declared none");
        let prev = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.244.1.2/24"}]});
        let second = plugin_config(&l, &l.plugins[1], Some(&prev), &caps);
        assert_eq!(second["prevResult"], prev);
        assert_eq!(
            second["runtimeConfig"],
            json!({"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]})
        );
        assert!(second.get("capabilities").is_none());
    }

    #[test]
    fn result_addresses() {
        let r = json!({"cniVersion": "1.0.0", "ips": [
            {"address": "fd00:10:244:1::5/64", "gateway": "fd00:10:244:1::1", "interface": 2},
            {"address": "10.244.1.5/24", "gateway": "10.244.1.1", "interface": 2}]});
        assert_eq!(
            pod_ips(&r),
            vec![
                "10.244.1.5".parse::<IpAddr>().expect("ip"),
                "fd00:10:244:1::5".parse().expect("ip")
            ]
        );
        let old = json!({"cniVersion": "0.2.0", "ip4": {"ip": "10.1.0.3/16"}});
        assert_eq!(
            result_ips(&old),
            vec!["10.1.0.3/16".parse::<IpNet>().expect("net")]
        );
        assert!(pod_ips(&json!({})).is_empty());
    }

    #[test]
    fn cache_names_are_file_safe() {
        assert_eq!(
            cache_file_name("ferry", "a/b c", "eth0"),
            "ferry-a_b_c-eth0"
        );
    }

    #[test]
    fn cache_roundtrip_and_del_after_restart() {
        let dir = tempfile::tempdir().expect("dir");
        // A fake plugin that records each call; a second Cni over the same cache dir (an
        // agent restarted) must DEL with the result cached by the first.
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).expect("mkdir");
        let log = dir.path().join("calls");
        let script = format!(
            "#!/bin/sh\nconf=$(cat)\necho \"$CNI_COMMAND $CNI_CONTAINERID $conf\" >> {}\n\
             if [ \"$CNI_COMMAND\" = ADD ]; then echo '{{\"cniVersion\":\"1.0.0\",\"ips\":[{{\"address\":\"10.9.0.2/24\"}}]}}'; fi\n",
            log.display()
        );
        let plugin = bin.join("fake");
        std::fs::write(&plugin, script).expect("write");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let list =
            ConfList::parse(r#"{"cniVersion":"1.0.0","name":"t","plugins":[{"type":"fake"}]}"#)
                .expect("list");
        let att = Attachment {
            container_id: "c1".into(),
            netns: "/run/netns/x".into(),
            ifname: "eth0".into(),
            args: vec![("K8S_POD_NAME".into(), "p".into())],
            capability_args: BTreeMap::new(),
        };
        let cni = Cni {
            bin_dirs: vec![bin.clone()],
            exec_netns: None,
            cache_dir: dir.path().join("cache"),
        };
        let r = cni.add(&list, &att).expect("add");
        assert_eq!(pod_ips(&r), vec!["10.9.0.2".parse::<IpAddr>().expect("ip")]);
        let again = Cni {
            bin_dirs: vec![bin],
            exec_netns: None,
            cache_dir: dir.path().join("cache"),
        };
        let cached = again.cached();
        assert_eq!(cached.len(), 1);
        assert_eq!(cached[0].attachment, att);
        let l2 = ConfList::parse(&cached[0].config.to_string()).expect("cached list");
        again.del(&l2, &cached[0].attachment).expect("del");
        assert!(again.cached().is_empty(), "DEL clears the cache");
        let calls = std::fs::read_to_string(&log).expect("log");
        let del = calls
            .lines()
            .find(|l| l.starts_with("DEL"))
            .expect("DEL ran");
        assert!(del.contains("\"prevResult\""), "{del}");
        // A missing plugin is an error naming it.
        let missing = ConfList::parse(r#"{"name":"t","plugins":[{"type":"nope"}]}"#).expect("l");
        let e = cni.add(&missing, &att).expect_err("missing");
        assert!(e.to_string().contains("nope"), "{e}");
    }
}
