//! ClusterIP and NodePort allocation in the API server's write path, atomic in the store.
//!
//! Every allocated address is its own key, `/registry/ipaddresses/<ip>`, and every node port
//! `/registry/servicenodeports/<port>`, each holding the owning Service (namespace, name, uid) and
//! created with the store's create-if-absent: two writers (tasks or API server replicas) can never
//! hold the same one. Keys are claimed before the Service is written and deleted again when that
//! write fails ([`Txn::rollback`]); keys the Service no longer uses are freed after a successful
//! write ([`Txn::commit`]) or delete ([`ServiceAlloc::release`]). [`repair`] frees keys whose
//! Service is gone and reports Services whose keys are missing or held by another Service.
//!
//! The decisions are pure: [`cidr`] (ranges, static band), [`pick`] (free slot, upper band
//! first), [`families`] (ipFamilyPolicy / ipFamilies defaulting), [`ports`] (node port slots).

pub mod cidr;
pub mod families;
pub mod pick;
pub mod ports;
pub mod repair;

use std::collections::HashSet;
use std::net::IpAddr;

use bytes::Bytes;
use ferry_api::errors::{FieldError, Path};
use ferry_store::{RangeOptions, Store, StoreError};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::status::ApiError;
pub use cidr::{Cidr, Family, parse_service_cidrs};
use families::IpFields;
pub use ports::PortRange;

pub const IP_PREFIX: &str = "/registry/ipaddresses/";
pub const PORT_PREFIX: &str = "/registry/servicenodeports/";

/// Random tries before falling back to a scan of the allocated keys.
const RANDOM_TRIES: usize = 8;

/// Who holds an address or a port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl Owner {
    fn of(obj: &Value) -> Owner {
        Owner {
            namespace: crate::objects::namespace(obj).to_string(),
            name: crate::objects::name(obj).to_string(),
            uid: crate::objects::uid(obj).to_string(),
        }
    }
    fn bytes(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }
}

pub fn ip_key(ip: &IpAddr) -> String {
    format!("{IP_PREFIX}{ip}")
}

pub fn port_key(port: i32) -> String {
    format!("{PORT_PREFIX}{port}")
}

/// The allocator configuration: service CIDRs (primary first) and the node port range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAlloc {
    pub cidrs: Vec<Cidr>,
    pub node_ports: PortRange,
}

impl Default for ServiceAlloc {
    fn default() -> Self {
        ServiceAlloc {
            cidrs: parse_service_cidrs("10.96.0.0/12").unwrap_or_default(),
            node_ports: PortRange::default(),
        }
    }
}

/// Keys claimed by one write, to undo on failure, and keys to free once it succeeded.
#[must_use = "commit or roll back"]
pub struct Txn<'a> {
    store: &'a dyn Store,
    owner: Owner,
    created: Vec<String>,
    release: Vec<String>,
}

impl<'a> Txn<'a> {
    fn new(store: &'a dyn Store, owner: Owner) -> Txn<'a> {
        Txn {
            store,
            owner,
            created: Vec::new(),
            release: Vec::new(),
        }
    }
    /// The write succeeded: free what the Service no longer uses.
    pub async fn commit(self) {
        for k in &self.release {
            release_key(self.store, k, &self.owner.uid).await;
        }
    }
    /// The write failed: free what this write claimed.
    pub async fn rollback(self) {
        for k in &self.created {
            release_key(self.store, k, &self.owner.uid).await;
        }
    }
}

/// Deletes `key` if `uid` holds it.
async fn release_key(store: &dyn Store, key: &str, uid: &str) {
    for _ in 0..4 {
        let kv = match store.get(key).await {
            Ok(Some(kv)) => kv,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!("releasing {key}: {e}");
                return;
            }
        };
        let holder: Option<Owner> = serde_json::from_slice(&kv.value).ok();
        if holder.is_some_and(|o| o.uid != uid) {
            return;
        }
        match store.delete(key, Some(kv.mod_revision)).await {
            Ok(_) | Err(StoreError::NotFound) => return,
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => {
                tracing::warn!("releasing {key}: {e}");
                return;
            }
        }
    }
}

fn invalid(obj: &Value, errs: Vec<FieldError>) -> ApiError {
    let info = ferry_api::kinds::all()
        .iter()
        .map(|s| s.info())
        .find(|i| i.group.is_empty() && i.kind == "Service");
    match info {
        Some(info) => ApiError::invalid(info, crate::objects::name(obj), &errs),
        None => ApiError::internal("Service kind not registered"),
    }
}

fn full(what: &str) -> ApiError {
    ApiError::new(
        500,
        "InternalError",
        format!("Internal error occurred: failed to allocate a {what}: range is full"),
    )
}

fn spec(obj: &Value) -> &Value {
    obj.get("spec").unwrap_or(&Value::Null)
}

fn str_at<'v>(v: &'v Value, k: &str) -> &'v str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}

fn strings(v: &Value, k: &str) -> Vec<String> {
    v.get(k)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn ip_fields(obj: &Value) -> IpFields {
    let s = spec(obj);
    let mut cluster_ips = strings(s, "clusterIPs");
    let cip = str_at(s, "clusterIP");
    if cluster_ips.is_empty() && !cip.is_empty() {
        cluster_ips.push(cip.to_string());
    }
    IpFields {
        type_: match str_at(s, "type") {
            "" => "ClusterIP".to_string(),
            t => t.to_string(),
        },
        has_selector: s
            .get("selector")
            .and_then(Value::as_object)
            .is_some_and(|m| !m.is_empty()),
        policy: s
            .get("ipFamilyPolicy")
            .and_then(Value::as_str)
            .filter(|p| !p.is_empty())
            .map(String::from),
        families: strings(s, "ipFamilies"),
        cluster_ips,
    }
}

fn spec_mut(obj: &mut Value) -> Option<&mut serde_json::Map<String, Value>> {
    let s = obj
        .as_object_mut()?
        .entry("spec")
        .or_insert_with(|| json!({}));
    if !s.is_object() {
        *s = json!({});
    }
    s.as_object_mut()
}

fn write_ip_fields(obj: &mut Value, f: &IpFields) {
    let Some(s) = spec_mut(obj) else { return };
    if !f.wants_ips() {
        for k in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
            s.remove(k);
        }
        return;
    }
    match f.cluster_ips.first() {
        Some(first) => {
            s.insert("clusterIP".into(), json!(first));
            s.insert("clusterIPs".into(), json!(f.cluster_ips));
        }
        None => {
            s.remove("clusterIP");
            s.remove("clusterIPs");
        }
    }
    s.insert("ipFamilies".into(), json!(f.families));
    match &f.policy {
        Some(p) => s.insert("ipFamilyPolicy".into(), json!(p)),
        None => s.remove("ipFamilyPolicy"),
    };
}

fn needs_node_ports(s: &Value) -> bool {
    matches!(str_at(s, "type"), "NodePort" | "LoadBalancer")
}

fn allocates_new_node_ports(s: &Value) -> bool {
    match str_at(s, "type") {
        "NodePort" => true,
        "LoadBalancer" => {
            s.get("allocateLoadBalancerNodePorts")
                .and_then(Value::as_bool)
                != Some(false)
        }
        _ => false,
    }
}

fn needs_health_check(s: &Value) -> bool {
    str_at(s, "type") == "LoadBalancer" && str_at(s, "externalTrafficPolicy") == "Local"
}

fn port_list(s: &Value) -> Vec<(String, String, i32, i32)> {
    s.get("ports")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|p| {
                    (
                        str_at(p, "name").to_string(),
                        match str_at(p, "protocol") {
                            "" => "TCP".to_string(),
                            x => x.to_string(),
                        },
                        p.get("port").and_then(Value::as_i64).unwrap_or(0) as i32,
                        p.get("nodePort").and_then(Value::as_i64).unwrap_or(0) as i32,
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn set_node_port(obj: &mut Value, i: usize, np: i32) {
    if let Some(p) = spec_mut(obj)
        .and_then(|s| s.get_mut("ports"))
        .and_then(Value::as_array_mut)
        .and_then(|a| a.get_mut(i))
        .and_then(Value::as_object_mut)
    {
        if np == 0 {
            p.remove("nodePort");
        } else {
            p.insert("nodePort".into(), json!(np));
        }
    }
}

fn health_check_port(s: &Value) -> i32 {
    s.get("healthCheckNodePort")
        .and_then(Value::as_i64)
        .unwrap_or(0) as i32
}

/// Everything a stored Service holds: addresses and node ports (incl. the health check port).
pub fn held_keys(obj: &Value) -> Vec<String> {
    let s = spec(obj);
    let mut keys = Vec::new();
    if str_at(s, "type") != "ExternalName" {
        for ip in strings(s, "clusterIPs") {
            if let Ok(ip) = ip.parse::<IpAddr>() {
                keys.push(ip_key(&ip));
            }
        }
    }
    for (_, _, _, np) in port_list(s) {
        if np != 0 {
            keys.push(port_key(np));
        }
    }
    let hc = health_check_port(s);
    if hc != 0 {
        keys.push(port_key(hc));
    }
    let mut seen = HashSet::new();
    keys.retain(|k| seen.insert(k.clone()));
    keys
}

impl ServiceAlloc {
    pub fn families(&self) -> Vec<Family> {
        self.cidrs.iter().map(|c| c.family).collect()
    }

    fn cidr(&self, f: Family) -> Option<&Cidr> {
        self.cidrs.iter().find(|c| c.family == f)
    }

    /// Claims `key` for the owner; `Ok(false)` when another Service holds it. Holding it already
    /// is success (an update re-claiming its own key).
    async fn claim<'a>(
        &self,
        txn: &mut Txn<'a>,
        key: &str,
        dry_run: bool,
    ) -> Result<bool, ApiError> {
        if dry_run {
            return Ok(match txn.store.get(key).await? {
                None => true,
                Some(kv) => {
                    serde_json::from_slice::<Owner>(&kv.value).is_ok_and(|o| o.uid == txn.owner.uid)
                }
            });
        }
        match txn.store.create(key, txn.owner.bytes()).await {
            Ok(_) => {
                txn.created.push(key.to_string());
                Ok(true)
            }
            Err(StoreError::AlreadyExists) => Ok(match txn.store.get(key).await? {
                // Freed meanwhile: try once more.
                None => match txn.store.create(key, txn.owner.bytes()).await {
                    Ok(_) => {
                        txn.created.push(key.to_string());
                        true
                    }
                    Err(StoreError::AlreadyExists) => false,
                    Err(e) => return Err(e.into()),
                },
                Some(kv) => {
                    serde_json::from_slice::<Owner>(&kv.value).is_ok_and(|o| o.uid == txn.owner.uid)
                }
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// Claims a free index of a range: random picks in the dynamic band, then a scan of the
    /// keys in use.
    #[allow(clippy::too_many_arguments)]
    async fn claim_next<'a>(
        &self,
        txn: &mut Txn<'a>,
        size: u128,
        band: u128,
        key_of: impl Fn(u128) -> Option<String>,
        used_of_key: impl Fn(&str) -> Option<u128>,
        prefix: &str,
        dry_run: bool,
    ) -> Result<Option<u128>, ApiError> {
        for _ in 0..RANDOM_TRIES {
            let Some(i) = pick::random_dynamic(size, band, &mut rand::rng()) else {
                return Ok(None);
            };
            if let Some(k) = key_of(i)
                && self.claim(txn, &k, dry_run).await?
            {
                return Ok(Some(i));
            }
        }
        for _ in 0..4 {
            let used: HashSet<u128> = txn
                .store
                .range(prefix, RangeOptions::default())
                .await?
                .kvs
                .iter()
                .filter_map(|kv| used_of_key(&kv.key))
                .collect();
            let scan = used.len() as u128 + 1;
            let Some(i) =
                pick::pick_free(size, band, scan, |i| used.contains(&i), &mut rand::rng())
            else {
                return Ok(None);
            };
            if let Some(k) = key_of(i)
                && self.claim(txn, &k, dry_run).await?
            {
                return Ok(Some(i));
            }
        }
        Ok(None)
    }

    async fn next_ip<'a>(
        &self,
        txn: &mut Txn<'a>,
        fam: Family,
        dry_run: bool,
    ) -> Result<IpAddr, ApiError> {
        let Some(c) = self.cidr(fam).copied() else {
            return Err(ApiError::internal(format!(
                "{} is not configured on this cluster",
                fam.as_str()
            )));
        };
        let got = self
            .claim_next(
                txn,
                c.usable(),
                c.static_band(),
                |i| c.at(i).map(|ip| ip_key(&ip)),
                |k| {
                    k.strip_prefix(IP_PREFIX)
                        .and_then(|s| s.parse::<IpAddr>().ok())
                        .and_then(|ip| c.index_of(&ip))
                },
                IP_PREFIX,
                dry_run,
            )
            .await?;
        got.and_then(|i| c.at(i)).ok_or_else(|| full("serviceIP"))
    }

    async fn next_port<'a>(&self, txn: &mut Txn<'a>, dry_run: bool) -> Result<i32, ApiError> {
        let r = self.node_ports;
        let base = i32::from(r.base);
        let got = self
            .claim_next(
                txn,
                u128::from(r.size),
                r.static_band(),
                |i| Some(port_key(base + i as i32)),
                |k| {
                    k.strip_prefix(PORT_PREFIX)
                        .and_then(|s| s.parse::<i32>().ok())
                        .filter(|p| r.contains(*p))
                        .map(|p| (p - base) as u128)
                },
                PORT_PREFIX,
                dry_run,
            )
            .await?;
        got.map(|i| base + i as i32).ok_or_else(|| full("nodePort"))
    }

    async fn specific_ip<'a>(
        &self,
        txn: &mut Txn<'a>,
        obj: &Value,
        i: usize,
        ip: &str,
        dry_run: bool,
    ) -> Result<(), ApiError> {
        let field = Path::new("spec").child("clusterIPs").index(i);
        let Ok(addr) = ip.parse::<IpAddr>() else {
            return Err(invalid(
                obj,
                vec![FieldError::invalid_str(
                    field,
                    ip,
                    "must be a valid IP address",
                )],
            ));
        };
        let Some(c) = self.cidr(Family::of(&addr)) else {
            return Err(invalid(
                obj,
                vec![FieldError::invalid_str(
                    field,
                    ip,
                    format!(
                        "{} is not configured on this cluster",
                        Family::of(&addr).as_str()
                    ),
                )],
            ));
        };
        if c.index_of(&addr).is_none() {
            return Err(invalid(
                obj,
                vec![FieldError::invalid_str(
                    field,
                    ip,
                    format!(
                        "failed to allocate IP {ip}: provided IP ({ip}) is not in the valid range. The range of valid IPs is {c}"
                    ),
                )],
            ));
        }
        if !self.claim(txn, &ip_key(&addr), dry_run).await? {
            return Err(invalid(
                obj,
                vec![FieldError::invalid_str(
                    field,
                    ip,
                    format!("failed to allocate IP {ip}: provided IP ({ip}) is already allocated"),
                )],
            ));
        }
        Ok(())
    }

    async fn specific_port<'a>(
        &self,
        txn: &mut Txn<'a>,
        obj: &Value,
        field: Path,
        port: i32,
        dry_run: bool,
    ) -> Result<(), ApiError> {
        if !self.node_ports.contains(port) {
            return Err(invalid(
                obj,
                vec![FieldError::invalid(
                    field,
                    port.to_string(),
                    format!(
                        "provided port is not in the valid range. The range of valid ports is {}",
                        self.node_ports
                    ),
                )],
            ));
        }
        if !self.claim(txn, &port_key(port), dry_run).await? {
            return Err(invalid(
                obj,
                vec![FieldError::invalid(
                    field,
                    port.to_string(),
                    "provided port is already allocated",
                )],
            ));
        }
        Ok(())
    }

    /// Allocation for a create: fills `ipFamilyPolicy`, `ipFamilies`, `clusterIP(s)`, node ports
    /// and `healthCheckNodePort` of `obj` (a defaulted, validated Service with its uid set).
    pub async fn allocate_create<'a>(
        &self,
        store: &'a dyn Store,
        obj: &mut Value,
        dry_run: bool,
    ) -> Result<Txn<'a>, ApiError> {
        let mut txn = Txn::new(store, Owner::of(obj));
        match self.allocate(&mut txn, obj, None, dry_run).await {
            Ok(()) => Ok(txn),
            Err(e) => {
                txn.rollback().await;
                Err(e)
            }
        }
    }

    /// Allocation for an update of `old` to `new` (type changes, dual-stack upgrades and
    /// downgrades, new or removed ports), after [`prepare_update`].
    pub async fn allocate_update<'a>(
        &self,
        store: &'a dyn Store,
        new: &mut Value,
        old: &Value,
        dry_run: bool,
    ) -> Result<Txn<'a>, ApiError> {
        let mut txn = Txn::new(store, Owner::of(old));
        match self.allocate(&mut txn, new, Some(old), dry_run).await {
            Ok(()) => {
                let keep: HashSet<String> = held_keys(new).into_iter().collect();
                txn.release = held_keys(old)
                    .into_iter()
                    .filter(|k| !keep.contains(k))
                    .collect();
                Ok(txn)
            }
            Err(e) => {
                txn.rollback().await;
                Err(e)
            }
        }
    }

    /// Frees everything a deleted Service held.
    pub async fn release(&self, store: &dyn Store, obj: &Value) {
        let uid = crate::objects::uid(obj);
        for k in held_keys(obj) {
            release_key(store, &k, uid).await;
        }
    }

    async fn allocate<'a>(
        &self,
        txn: &mut Txn<'a>,
        obj: &mut Value,
        old: Option<&Value>,
        dry_run: bool,
    ) -> Result<(), ApiError> {
        let old_fields = old.map(ip_fields);
        let mut f = ip_fields(obj);
        let errs = families::init_ip_families(&mut f, old_fields.as_ref(), &self.families());
        if !errs.is_empty() {
            return Err(invalid(obj, errs));
        }
        if f.wants_ips() && !f.headless() {
            let old_ips = old_fields
                .as_ref()
                .filter(|o| o.wants_ips())
                .map(|o| o.cluster_ips.clone())
                .unwrap_or_default();
            for i in 0..f.families.len().max(f.cluster_ips.len()) {
                if let Some(ip) = f.cluster_ips.get(i).cloned() {
                    if old_ips.contains(&ip) {
                        continue;
                    }
                    self.specific_ip(txn, obj, i, &ip, dry_run).await?;
                } else if let Some(fam) = f.families.get(i).and_then(|s| Family::parse(s)) {
                    let ip = self.next_ip(txn, fam, dry_run).await?;
                    f.cluster_ips.push(ip.to_string());
                }
            }
        } else if f.wants_ips() && f.headless() {
            f.cluster_ips = vec!["None".to_string()];
        }
        write_ip_fields(obj, &f);

        // Node ports.
        let s = spec(obj).clone();
        let old_ports: HashSet<i32> = old
            .map(|o| {
                port_list(spec(o))
                    .into_iter()
                    .map(|p| p.3)
                    .chain([health_check_port(spec(o))])
                    .filter(|p| *p != 0)
                    .collect()
            })
            .unwrap_or_default();
        if needs_node_ports(&s) {
            let ports = port_list(&s);
            let pairs: Vec<(i32, i32)> = ports.iter().map(|p| (p.2, p.3)).collect();
            for slot in ports::node_port_slots(&pairs, allocates_new_node_ports(&s)) {
                let np = match slot.requested {
                    Some(np) => {
                        if !old_ports.contains(&np) {
                            let field = Path::new("spec")
                                .child("ports")
                                .index(slot.members[0])
                                .child("nodePort");
                            self.specific_port(txn, obj, field, np, dry_run).await?;
                        }
                        np
                    }
                    None => self.next_port(txn, dry_run).await?,
                };
                for m in slot.members {
                    set_node_port(obj, m, np);
                }
            }
        }
        if needs_health_check(&s) {
            let hc = health_check_port(&s);
            let hc = if hc != 0 {
                if !old_ports.contains(&hc) {
                    let field = Path::new("spec").child("healthCheckNodePort");
                    self.specific_port(txn, obj, field, hc, dry_run).await?;
                }
                hc
            } else {
                self.next_port(txn, dry_run).await?
            };
            if let Some(sm) = spec_mut(obj) {
                sm.insert("healthCheckNodePort".into(), json!(hc));
            }
        }
        Ok(())
    }
}

/// Before validation of an update: keeps allocated values the user left out and clears fields
/// the new type does not use.
pub fn prepare_update(new: &mut Value, old: &Value) {
    patch_allocated_values(new, old);
    drop_type_dependent_fields(new, old);
}

/// Values a PUT may leave out (as `kubectl replace` or `apply` do) are kept from the stored
/// Service while the type still needs them (upstream's `patchAllocatedValues`).
fn patch_allocated_values(new: &mut Value, old: &Value) {
    let (ns, os) = (spec(new).clone(), spec(old).clone());
    let wants = |s: &Value| str_at(s, "type") != "ExternalName";
    if wants(&ns)
        && wants(&os)
        && let Some(sm) = spec_mut(new)
    {
        if str_at(&ns, "clusterIP").is_empty()
            && let Some(v) = os.get("clusterIP")
        {
            sm.insert("clusterIP".into(), v.clone());
        }
        if strings(&ns, "clusterIPs").is_empty()
            && let Some(v) = os.get("clusterIPs")
        {
            sm.insert("clusterIPs".into(), v.clone());
        }
    }
    if needs_node_ports(&ns) && needs_node_ports(&os) {
        let old_ports = port_list(&os);
        let new_ports = port_list(&ns);
        let used: HashSet<i32> = new_ports.iter().map(|p| p.3).filter(|p| *p != 0).collect();
        for (i, p) in new_ports.iter().enumerate() {
            if p.3 != 0 {
                continue;
            }
            if let Some(o) = old_ports.iter().find(|o| o.0 == p.0)
                && o.3 != 0
                && !used.contains(&o.3)
            {
                set_node_port(new, i, o.3);
            }
        }
    }
    if needs_health_check(&ns) && needs_health_check(&os) && health_check_port(&ns) == 0 {
        let hc = health_check_port(&os);
        if hc != 0
            && let Some(sm) = spec_mut(new)
        {
            sm.insert("healthCheckNodePort".into(), json!(hc));
        }
    }
}

/// Fields the new type does not use are cleared when the user left them as they were
/// (upstream's `dropTypeDependentFields`).
fn drop_type_dependent_fields(new: &mut Value, old: &Value) {
    let (ns, os) = (spec(new).clone(), spec(old).clone());
    if str_at(&ns, "type") == str_at(&os, "type") {
        return;
    }
    if str_at(&ns, "type") == "ExternalName"
        && strings(&ns, "clusterIPs") == strings(&os, "clusterIPs")
        && let Some(sm) = spec_mut(new)
    {
        for k in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
            sm.remove(k);
        }
    }
    if !needs_node_ports(&ns) {
        let old_np: Vec<i32> = port_list(&os).iter().map(|p| p.3).collect();
        let new_np: Vec<i32> = port_list(&ns).iter().map(|p| p.3).collect();
        if old_np == new_np || new_np.iter().all(|n| old_np.contains(n) || *n == 0) {
            for i in 0..new_np.len() {
                set_node_port(new, i, 0);
            }
        }
    }
    if !needs_health_check(&ns)
        && health_check_port(&ns) == health_check_port(&os)
        && let Some(sm) = spec_mut(new)
    {
        sm.remove("healthCheckNodePort");
    }
    if str_at(&ns, "type") != "LoadBalancer"
        && str_at(&os, "type") == "LoadBalancer"
        && let Some(sm) = spec_mut(new)
    {
        if ns.get("allocateLoadBalancerNodePorts") == os.get("allocateLoadBalancerNodePorts") {
            sm.remove("allocateLoadBalancerNodePorts");
        }
        if ns.get("loadBalancerClass") == os.get("loadBalancerClass") {
            sm.remove("loadBalancerClass");
        }
    }
    let accessible = matches!(str_at(&ns, "type"), "NodePort" | "LoadBalancer")
        || ns
            .get("externalIPs")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty());
    if !accessible
        && ns.get("externalTrafficPolicy") == os.get("externalTrafficPolicy")
        && let Some(sm) = spec_mut(new)
    {
        sm.remove("externalTrafficPolicy");
    }
}

#[cfg(test)]
mod tests;
