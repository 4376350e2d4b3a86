//! ferry-openapi: the OpenAPI documents of Ferry's API server, built once at start from the
//! registry of served kinds ([`ferry_api::kinds::all`]).
//!
//! * `/openapi/v3` is an index of per group-version documents (`api/v1`, `apis/apps/v1`, …), each
//!   an OpenAPI 3.0 document with every path and operation of its kinds and the schemas they reach.
//!   kubectl 1.29+ reads it to check for the `fieldValidation` parameter (apply, create), for
//!   `explain` and for client-side apply's patch computation.
//! * `/openapi/v2` is one Swagger 2.0 document for everything, served as gnostic protobuf (kubectl
//!   1.20, 1.27, 1.28) or as JSON.
//!
//! The library is pure: the API server mounts the bytes. Serve `?hash=` v3 URLs with
//! `Cache-Control: public, immutable`, and the v2 protobuf with `Content-Type:
//! application/octet-stream` (never echo kubectl's Accept value).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock};

use ferry_api::kinds::{KindInfo, Strategy};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

pub mod gnostic;
mod ops;
mod render;
mod schemas;
pub use schemas::REVIEWS;

/// The `Content-Type` to answer `/openapi/v2` protobuf requests with. kubectl asks with
/// `application/com.github.proto-openapi.spec.v2@v1.0+protobuf`, but Go's media type parser rejects
/// that value in a response.
pub const V2_PROTOBUF_CONTENT_TYPE: &str = "application/octet-stream";

/// The version written in the documents' `info`.
pub const INFO_VERSION: &str = "v1.33.0";

/// The OpenAPI documents, immutable once built: v3 by [`OpenApi::build`], v2 on first use.
#[derive(Debug, Clone)]
pub struct OpenApi {
    index: Vec<u8>,
    /// Keyed by `api/v1`, `apis/apps/v1`, …: (document, hash).
    v3: BTreeMap<String, (Vec<u8>, String)>,
    /// The v2 document is only fetched by old kubectl (1.20, 1.27, 1.28): it is built on first use
    /// from `sources`, keeping server start short.
    v2: OnceLock<V2>,
    sources: Arc<Sources>,
}

#[derive(Debug, Clone)]
struct V2 {
    protobuf: Vec<u8>,
    json: Vec<u8>,
    etag: String,
}

/// What the v2 document is built from.
#[derive(Debug)]
struct Sources {
    defs: BTreeMap<String, Value>,
    gvs: Vec<ops::GroupVersion>,
}

fn hex_sha256(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for b in digest {
        let _ = write!(out, "{b:02X}");
    }
    out
}

fn to_string(v: &Value) -> String {
    // `Value`'s Display is its compact JSON text.
    v.to_string()
}

/// `head` + a JSON object of the `names` schemas (pre-serialised in `text`) + `tail`.
fn assemble(
    mut head: String,
    names: &BTreeSet<String>,
    text: &BTreeMap<&str, String>,
    tail: &str,
) -> String {
    head.reserve(
        names
            .iter()
            .filter_map(|n| text.get(n.as_str()))
            .map(|t| t.len() + 64)
            .sum(),
    );
    head.push('{');
    let mut first = true;
    for name in names {
        let Some(schema) = text.get(name.as_str()) else {
            continue;
        };
        if !first {
            head.push(',');
        }
        first = false;
        head.push_str(&Value::String(name.clone()).to_string());
        head.push(':');
        head.push_str(schema);
    }
    head.push('}');
    head.push_str(tail);
    head
}

/// The v2 document: everything in one Swagger document.
fn build_v2(sources: &Sources) -> V2 {
    let graph = schemas::ref_graph(&sources.defs);
    let info = json!({"title": "Kubernetes", "version": INFO_VERSION});
    let mut paths = Map::new();
    for gv in &sources.gvs {
        render::v2_paths(&gv.paths, &mut paths);
    }
    let paths = Value::Object(paths);
    let mut roots = BTreeSet::new();
    schemas::collect_refs(&paths, schemas::V2_REF, &mut roots);
    let reached = schemas::closure(&graph, roots);
    let v2_values: BTreeMap<&str, Value> = reached
        .iter()
        .filter_map(|name| {
            sources
                .defs
                .get_key_value(name)
                .map(|(k, v)| (k.as_str(), schemas::to_v2(v)))
        })
        .collect();
    let v2_text: BTreeMap<&str, String> =
        v2_values.iter().map(|(k, v)| (*k, to_string(v))).collect();
    let head = json!({"swagger": "2.0", "info": info, "paths": paths});
    let mut document = gnostic::document(&head);
    document.definitions = Some(gnostic::Definitions {
        additional_properties: v2_values
            .iter()
            .map(|(name, v)| gnostic::NamedSchema {
                name: name.to_string(),
                value: v.as_object().map(gnostic::schema),
            })
            .collect(),
    });
    let v2_protobuf = prost::Message::encode_to_vec(&document);
    let head = format!(
        r#"{{"swagger":"2.0","info":{},"paths":{},"definitions":"#,
        info, paths
    );
    let v2_json = assemble(head, &reached, &v2_text, "}").into_bytes();
    let v2_etag = format!("\"{}\"", hex_sha256(&v2_json));
    V2 {
        protobuf: v2_protobuf,
        json: v2_json,
        etag: v2_etag,
    }
}

impl OpenApi {
    /// Builds every document from [`ferry_api::kinds::all`] and the custom kinds served now
    /// ([`ferry_api::custom::resource::served`]).
    pub fn build() -> OpenApi {
        let mut kinds: Vec<&dyn Strategy> =
            ferry_api::kinds::all().iter().map(|b| b.as_ref()).collect();
        kinds.extend(
            ferry_api::custom::resource::served()
                .into_iter()
                .map(|k| k as &dyn Strategy),
        );
        OpenApi::for_kinds(&kinds)
    }

    /// Builds every document for the given kinds.
    pub fn for_kinds(kinds: &[&dyn Strategy]) -> OpenApi {
        let defs = schemas::generate(kinds);
        let infos: Vec<&KindInfo> = kinds.iter().map(|s| s.info()).collect();
        let pairs: Vec<(&KindInfo, &schemas::KindDefs)> =
            infos.iter().copied().zip(defs.kinds.iter()).collect();
        let mut gvs = ops::build(&pairs);
        ops::add_reviews(&mut gvs, &defs.reviews);
        let graph = schemas::ref_graph(&defs.defs);
        let info = json!({"title": "Kubernetes", "version": INFO_VERSION});

        // v3: one document per group version, with the schemas its paths reach. Each definition is
        // serialised once and shared by the documents that need it.
        let v3_defs: BTreeMap<&str, String> = defs
            .defs
            .iter()
            .map(|(k, v)| (k.as_str(), to_string(&schemas::to_v3(v))))
            .collect();
        let mut v3 = BTreeMap::new();
        let mut index = Map::new();
        for gv in &gvs {
            let paths = Value::Object(render::v3_paths(&gv.paths));
            let mut roots = BTreeSet::new();
            schemas::collect_refs(&paths, schemas::V3_REF, &mut roots);
            let reached = schemas::closure(&graph, roots);
            let head = format!(
                r#"{{"openapi":"3.0.0","info":{},"paths":{},"components":{{"schemas":"#,
                info, paths
            );
            let bytes = assemble(head, &reached, &v3_defs, "}}").into_bytes();
            let hash = hex_sha256(&bytes);
            index.insert(
                gv.key.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{}?hash={hash}", gv.key)}),
            );
            v3.insert(gv.key.clone(), (bytes, hash));
        }
        let index = to_string(&json!({ "paths": index })).into_bytes();

        let sources = Arc::new(Sources {
            defs: defs.defs,
            gvs,
        });
        OpenApi {
            index,
            v3,
            v2: OnceLock::new(),
            sources,
        }
    }

    /// The body of `GET /openapi/v3`:
    /// `{"paths":{"api/v1":{"serverRelativeURL":"/openapi/v3/api/v1?hash=<HASH>"},…}}`.
    pub fn v3_index(&self) -> &[u8] {
        &self.index
    }

    /// The document of one group version (`api/v1`, `apis/apps/v1`; a leading `/` is ignored) and
    /// its hash (the `?hash=` of the index URL, also usable as an ETag).
    pub fn v3_document(&self, gv_path: &str) -> Option<(&[u8], &str)> {
        let key = gv_path.trim_start_matches('/');
        self.v3
            .get(key)
            .map(|(bytes, hash)| (bytes.as_slice(), hash.as_str()))
    }

    /// The keys of the v3 index (`api/v1`, `apis/apps/v1`, …).
    pub fn v3_group_versions(&self) -> impl Iterator<Item = &str> {
        self.v3.keys().map(String::as_str)
    }

    /// The body of `GET /openapi/v2` as a gnostic `openapi_v2.Document` protobuf.
    pub fn v2_protobuf(&self) -> &[u8] {
        &self.v2().protobuf
    }

    /// The same document as Swagger 2.0 JSON (`Accept: application/json`).
    pub fn v2_json(&self) -> &[u8] {
        &self.v2().json
    }

    /// The ETag of the v2 document, quoted, ready for the header.
    pub fn v2_etag(&self) -> &str {
        &self.v2().etag
    }

    fn v2(&self) -> &V2 {
        self.v2.get_or_init(|| build_v2(&self.sources))
    }
}

#[cfg(test)]
mod tests;
