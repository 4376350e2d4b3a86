//! `ClusterCIDRConfig`: per-node pod CIDR pools chosen by node labels, shaped as in the GKE on
//! bare metal documentation (seed 001): `spec.ipv4`/`spec.ipv6` each with `cidr` and
//! `perNodeMaskSize`, and `spec.nodeSelector` (`matchLabels`, `matchExpressions`). Served as
//! `baremetal.cluster.gke.io/v1alpha1`, cluster-scoped, so that manifests written for that
//! document apply unchanged (a `metadata.namespace` in such a manifest is ignored by kubectl).

use std::net::IpAddr;

use ipnet::IpNet;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::errors::{ErrorList, FieldError, Path};
use crate::kinds::{Column, Hooks, KindInfo, StatusOnCreate, Typed};

pub const GROUP: &str = "baremetal.cluster.gke.io";
pub const VERSION: &str = "v1alpha1";
pub const KIND: &str = "ClusterCIDRConfig";
pub const PLURAL: &str = "clustercidrconfigs";

/// One address family's pool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "com.google.gke.cluster.baremetal.v1alpha1.CIDRBlock")]
pub struct CidrBlock {
    /// The pool, e.g. `10.0.0.0/16`.
    #[serde(default)]
    pub cidr: String,
    /// The prefix length of each node's block, e.g. `24`.
    #[serde(default)]
    pub per_node_mask_size: i32,
}

// Optional fields are declared with their plain schema: Kubernetes schemas never allow `null`
// (kubectl 1.20 rejects `type: [T, null]`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "com.google.gke.cluster.baremetal.v1alpha1.ClusterCIDRConfigSpec")]
pub struct ClusterCIDRConfigSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "CidrBlock")]
    pub ipv4: Option<CidrBlock>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "CidrBlock")]
    pub ipv6: Option<CidrBlock>,
    /// The nodes this config serves; empty or absent selects every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "LabelSelector")]
    pub node_selector: Option<LabelSelector>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "com.google.gke.cluster.baremetal.v1alpha1.ClusterCIDRConfig")]
pub struct ClusterCIDRConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub kind: Option<String>,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ClusterCIDRConfigSpec,
}

impl k8s_openapi::Resource for ClusterCIDRConfig {
    const API_VERSION: &'static str = "baremetal.cluster.gke.io/v1alpha1";
    const GROUP: &'static str = GROUP;
    const KIND: &'static str = KIND;
    const VERSION: &'static str = VERSION;
    const URL_PATH_SEGMENT: &'static str = PLURAL;
    type Scope = k8s_openapi::ClusterResourceScope;
}

impl k8s_openapi::Metadata for ClusterCIDRConfig {
    type Ty = ObjectMeta;
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The registry entry.
pub fn strategy() -> Typed<ClusterCIDRConfig> {
    Typed {
        info: KindInfo {
            group: GROUP,
            version: VERSION,
            kind: KIND,
            plural: PLURAL,
            singular: "clustercidrconfig",
            namespaced: false,
            short_names: &["ccc"],
            categories: &[],
            status_subresource: false,
            status_on_create: StatusOnCreate::Keep,
            generation: true,
            delete_returns_object: false,
            scale_subresource: false,
        },
        hooks: Hooks {
            default,
            prepare_create: |_| {},
            prepare_update: |_, _| {},
            validate,
            validate_status: |_, _| Vec::new(),
            columns,
            row,
            field: |_, _| None,
        },
    }
}

/// Defaulting: nothing beyond the generic metadata.
pub fn default(_obj: &mut ClusterCIDRConfig) {}

fn block(b: &CidrBlock, v6: bool, path: &Path) -> (ErrorList, Option<IpNet>) {
    let mut errs = Vec::new();
    let max = if v6 { 128 } else { 32 };
    let net = match b.cidr.parse::<IpNet>() {
        Ok(n) if matches!(n.addr(), IpAddr::V6(_)) == v6 => Some(n),
        Ok(_) => {
            errs.push(FieldError::invalid_str(
                path.child("cidr"),
                &b.cidr,
                if v6 {
                    "must be an IPv6 CIDR"
                } else {
                    "must be an IPv4 CIDR"
                },
            ));
            None
        }
        Err(_) => {
            if b.cidr.is_empty() {
                errs.push(FieldError::required(path.child("cidr"), ""));
            } else {
                errs.push(FieldError::invalid_str(
                    path.child("cidr"),
                    &b.cidr,
                    "must be a valid CIDR (e.g. 10.0.0.0/16 or fd00::/48)",
                ));
            }
            None
        }
    };
    let min = net.map(|n| i32::from(n.prefix_len())).unwrap_or(0);
    if b.per_node_mask_size < min || b.per_node_mask_size > max {
        errs.push(FieldError::invalid(
            path.child("perNodeMaskSize"),
            b.per_node_mask_size.to_string(),
            format!("must be between the CIDR's prefix length ({min}) and {max}"),
        ));
    }
    (errs, net)
}

/// Validation: at least one family; valid CIDRs of the right family; per-node masks within the
/// CIDR; equal host bits across families; a valid node selector; the spec is immutable.
pub fn validate(obj: &ClusterCIDRConfig, old: Option<&ClusterCIDRConfig>) -> ErrorList {
    let mp = Path::new("metadata");
    let mut errs = match old {
        None => crate::validation::validate_object_meta(
            &obj.metadata,
            false,
            crate::names::name_is_dns_subdomain,
            &mp,
        ),
        Some(o) => crate::validation::validate_object_meta_update(&obj.metadata, &o.metadata, &mp),
    };
    let sp = Path::new("spec");
    if let Some(o) = old
        && o.spec != obj.spec
    {
        errs.push(FieldError::invalid(
            sp.clone(),
            serde_json::to_string(&obj.spec).unwrap_or_default(),
            "field is immutable",
        ));
        return errs;
    }
    let s = &obj.spec;
    if s.ipv4.is_none() && s.ipv6.is_none() {
        errs.push(FieldError::required(
            sp.clone(),
            "at least one of ipv4 and ipv6 is required",
        ));
    }
    if let Some(b) = &s.ipv4 {
        errs.extend(block(b, false, &sp.child("ipv4")).0);
    }
    if let Some(b) = &s.ipv6 {
        errs.extend(block(b, true, &sp.child("ipv6")).0);
    }
    if let (Some(a), Some(b)) = (&s.ipv4, &s.ipv6)
        && 32 - a.per_node_mask_size != 128 - b.per_node_mask_size
    {
        errs.push(FieldError::invalid(
            sp.child("ipv6").child("perNodeMaskSize"),
            b.per_node_mask_size.to_string(),
            format!(
                "must give as many addresses per node as ipv4: 32 - {} != 128 - {}",
                a.per_node_mask_size, b.per_node_mask_size
            ),
        ));
    }
    errs.extend(crate::validation::validate_label_selector(
        s.node_selector.as_ref(),
        &sp.child("nodeSelector"),
    ));
    errs
}

pub fn columns() -> Vec<Column> {
    vec![
        Column::name_column(),
        Column::new("IPv4", "string", 0),
        Column::new("IPv4 Mask", "string", 0),
        Column::new("IPv6", "string", 0),
        Column::new("IPv6 Mask", "string", 0),
        Column::new("Node Selector", "string", 1),
        Column::new("Age", "string", 0),
    ]
}

pub fn row(obj: &ClusterCIDRConfig) -> Vec<Value> {
    row_at(obj, Timestamp::now())
}

pub fn row_at(obj: &ClusterCIDRConfig, now: Timestamp) -> Vec<Value> {
    let fam = |b: &Option<CidrBlock>| match b {
        Some(b) => (
            Value::String(b.cidr.clone()),
            Value::String(format!("/{}", b.per_node_mask_size)),
        ),
        None => (
            Value::String("<none>".into()),
            Value::String("<none>".into()),
        ),
    };
    let (v4, m4) = fam(&obj.spec.ipv4);
    let (v6, m6) = fam(&obj.spec.ipv6);
    vec![
        Value::String(obj.metadata.name.clone().unwrap_or_default()),
        v4,
        m4,
        v6,
        m6,
        Value::String(crate::selectors::format_label_selector(
            obj.spec.node_selector.as_ref(),
        )),
        Value::String(crate::printers::since(
            obj.metadata.creation_timestamp.as_ref().map(|t| t.0),
            now,
        )),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(spec: Value) -> ClusterCIDRConfig {
        serde_json::from_value(json!({"metadata": {"name": "c"}, "spec": spec})).expect("object")
    }

    #[test]
    fn validation_table() {
        let cases: Vec<(&str, Value, Vec<&str>)> = vec![
            (
                "dual stack, equal host bits",
                json!({"ipv4": {"cidr": "10.0.0.0/16", "perNodeMaskSize": 24},
                       "ipv6": {"cidr": "fd00::/112", "perNodeMaskSize": 120}}),
                vec![],
            ),
            (
                "v4 only with selector",
                json!({"ipv4": {"cidr": "192.168.0.0/20", "perNodeMaskSize": 22},
                       "nodeSelector": {"matchLabels": {"rack": "rack1"}}}),
                vec![],
            ),
            ("no family", json!({}), vec!["spec"]),
            (
                "host bits differ",
                json!({"ipv4": {"cidr": "10.0.0.0/16", "perNodeMaskSize": 24},
                       "ipv6": {"cidr": "fd00::/112", "perNodeMaskSize": 116}}),
                vec!["spec.ipv6.perNodeMaskSize"],
            ),
            (
                "wrong family",
                json!({"ipv4": {"cidr": "fd00::/64", "perNodeMaskSize": 80}}),
                vec!["spec.ipv4.cidr", "spec.ipv4.perNodeMaskSize"],
            ),
            (
                "mask shorter than the cidr",
                json!({"ipv4": {"cidr": "10.0.0.0/16", "perNodeMaskSize": 8}}),
                vec!["spec.ipv4.perNodeMaskSize"],
            ),
            (
                "bad cidr",
                json!({"ipv6": {"cidr": "nope", "perNodeMaskSize": 64}}),
                vec!["spec.ipv6.cidr"],
            ),
            (
                "bad selector",
                json!({"ipv4": {"cidr": "10.0.0.0/8", "perNodeMaskSize": 24},
                       "nodeSelector": {"matchLabels": {"bad key!": "x"}}}),
                vec!["spec.nodeSelector.matchLabels"],
            ),
        ];
        for (name, spec, want) in cases {
            let errs = validate(&obj(spec), None);
            let fields: Vec<String> = errs.iter().map(|e| e.field.clone()).collect();
            assert_eq!(fields.len(), want.len(), "{name}: {fields:?}");
            for w in want {
                assert!(
                    fields.iter().any(|f| f.starts_with(w)),
                    "{name}: {fields:?} lacks {w}"
                );
            }
        }
    }

    #[test]
    fn spec_is_immutable() {
        let mut a = obj(json!({"ipv4": {"cidr": "10.0.0.0/16", "perNodeMaskSize": 24}}));
        a.metadata.resource_version = Some("5".into());
        let mut b = a.clone();
        b.metadata.labels = Some([("x".to_string(), "y".to_string())].into());
        let errs = validate(&b, Some(&a));
        assert!(errs.is_empty(), "{errs:?}");
        b.spec.ipv4 = Some(CidrBlock {
            cidr: "10.1.0.0/16".into(),
            per_node_mask_size: 24,
        });
        let errs = validate(&b, Some(&a));
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "spec");
    }

    #[test]
    fn row_cells() {
        let o = obj(json!({"ipv4": {"cidr": "10.0.0.0/16", "perNodeMaskSize": 24}}));
        let r = row_at(&o, Timestamp::UNIX_EPOCH);
        assert_eq!(r[1], json!("10.0.0.0/16"));
        assert_eq!(r[2], json!("/24"));
        assert_eq!(r[3], json!("<none>"));
        assert_eq!(r.len(), columns().len());
    }
}
