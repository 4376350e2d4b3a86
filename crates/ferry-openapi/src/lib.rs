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

use ferry_api::kinds::{KindInfo, Strategy};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

pub mod gnostic;
mod ops;
mod render;
mod schemas;

/// The version written in the documents' `info`.
pub const INFO_VERSION: &str = "v1.33.0";

/// The prebuilt, immutable OpenAPI documents.
#[derive(Debug, Clone)]
pub struct OpenApi {
    index: Vec<u8>,
    /// Keyed by `api/v1`, `apis/apps/v1`, …: (document, hash).
    v3: BTreeMap<String, (Vec<u8>, String)>,
    v2_protobuf: Vec<u8>,
    v2_json: Vec<u8>,
    v2_etag: String,
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

fn to_bytes(v: &Value) -> Vec<u8> {
    // Serialising a `Value` cannot fail (its map keys are strings).
    serde_json::to_vec(v).unwrap_or_default()
}

impl OpenApi {
    /// Builds every document from [`ferry_api::kinds::all`].
    pub fn build() -> OpenApi {
        let kinds: Vec<&dyn Strategy> =
            ferry_api::kinds::all().iter().map(|b| b.as_ref()).collect();
        OpenApi::for_kinds(&kinds)
    }

    /// Builds every document for the given kinds.
    pub fn for_kinds(kinds: &[&dyn Strategy]) -> OpenApi {
        let defs = schemas::generate(kinds);
        let infos: Vec<&KindInfo> = kinds.iter().map(|s| s.info()).collect();
        let pairs: Vec<(&KindInfo, &schemas::KindDefs)> =
            infos.iter().copied().zip(defs.kinds.iter()).collect();
        let gvs = ops::build(&pairs);

        // v3: one document per group version, with the schemas its paths reach.
        let v3_defs: BTreeMap<&str, Value> = defs
            .defs
            .iter()
            .map(|(k, v)| (k.as_str(), schemas::to_v3(v)))
            .collect();
        let mut v3 = BTreeMap::new();
        let mut index = Map::new();
        for gv in &gvs {
            let paths = Value::Object(render::v3_paths(&gv.paths));
            let mut roots = BTreeSet::new();
            schemas::collect_refs(&paths, schemas::V3_REF, &mut roots);
            let reached = schemas::closure(&defs.defs, roots);
            let components: Map<String, Value> = reached
                .iter()
                .filter_map(|name| {
                    v3_defs
                        .get(name.as_str())
                        .map(|s| (name.clone(), s.clone()))
                })
                .collect();
            let doc = json!({
                "openapi": "3.0.0",
                "info": {"title": "Kubernetes", "version": INFO_VERSION},
                "paths": paths,
                "components": {"schemas": components},
            });
            let bytes = to_bytes(&doc);
            let hash = hex_sha256(&bytes);
            index.insert(
                gv.key.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{}?hash={hash}", gv.key)}),
            );
            v3.insert(gv.key.clone(), (bytes, hash));
        }
        let index = to_bytes(&json!({ "paths": index }));

        // v2: everything in one Swagger document.
        let mut paths = Map::new();
        for gv in &gvs {
            render::v2_paths(&gv.paths, &mut paths);
        }
        let paths = Value::Object(paths);
        let mut roots = BTreeSet::new();
        schemas::collect_refs(&paths, schemas::V2_REF, &mut roots);
        let definitions: Map<String, Value> = schemas::closure(&defs.defs, roots)
            .iter()
            .filter_map(|name| {
                defs.defs
                    .get(name)
                    .map(|s| (name.clone(), schemas::to_v2(s)))
            })
            .collect();
        let doc = json!({
            "swagger": "2.0",
            "info": {"title": "Kubernetes", "version": INFO_VERSION},
            "paths": paths,
            "definitions": definitions,
        });
        let v2_json = to_bytes(&doc);
        let v2_protobuf = prost::Message::encode_to_vec(&gnostic::document(&doc));
        let v2_etag = format!("\"{}\"", hex_sha256(&v2_json));
        OpenApi {
            index,
            v3,
            v2_protobuf,
            v2_json,
            v2_etag,
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
        &self.v2_protobuf
    }

    /// The same document as Swagger 2.0 JSON (`Accept: application/json`).
    pub fn v2_json(&self) -> &[u8] {
        &self.v2_json
    }

    /// The ETag of the v2 document, quoted, ready for the header.
    pub fn v2_etag(&self) -> &str {
        &self.v2_etag
    }
}

#[cfg(test)]
mod tests;
