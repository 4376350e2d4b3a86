//! A pure OCI image writer: layer tars built from in-memory files, gzip, sha256 digests, the
//! image config, the manifest, and the OCI image layout (`oci-layout`, `index.json`,
//! `blobs/sha256/…`) packed into one tar — the archive `ctr images import` and
//! `skopeo copy oci-archive:` read. Output is deterministic (fixed mtimes, sorted entries).

use std::io::Write;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

pub const MEDIA_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MEDIA_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MEDIA_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const MEDIA_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// The annotation containerd's importer names the image by.
pub const ANNOTATION_CONTAINERD_NAME: &str = "io.containerd.image.name";
pub const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OciError {
    #[error("tar entry name {0:?} is too long for a ustar header")]
    NameTooLong(String),
    #[error("tar entry name {0:?} must be relative and non-empty")]
    BadName(String),
    #[error("image reference {0:?} has no tag (want name:tag)")]
    NoTag(String),
    #[error("gzip: {0}")]
    Gzip(String),
}

/// `sha256:<hex>` of `data`.
pub fn digest(data: &[u8]) -> String {
    let sum = Sha256::digest(data);
    let mut s = String::with_capacity(71);
    s.push_str("sha256:");
    for b in sum {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// The hex part of a `sha256:` digest.
pub fn digest_hex(d: &str) -> &str {
    d.strip_prefix("sha256:").unwrap_or(d)
}

/// One tar entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Dir {
        path: String,
        mode: u32,
    },
    File {
        path: String,
        mode: u32,
        data: Vec<u8>,
    },
    Symlink {
        path: String,
        target: String,
    },
}

impl Entry {
    fn path(&self) -> &str {
        match self {
            Entry::Dir { path, .. } | Entry::File { path, .. } | Entry::Symlink { path, .. } => {
                path
            }
        }
    }
}

/// Every entry's modification time (2000-01-01): fixed so that digests are reproducible.
const MTIME: u64 = 946_684_800;

fn octal(field: &mut [u8], value: u64) {
    // width-1 octal digits, then NUL.
    let width = field.len() - 1;
    let s = format!("{value:0width$o}");
    let bytes = s.as_bytes();
    let start = bytes.len().saturating_sub(width);
    field[..width].copy_from_slice(&bytes[start..]);
    field[width] = 0;
}

/// Splits a path into ustar's (prefix, name).
fn split_name(path: &str) -> Result<(&str, &str), OciError> {
    if path.len() <= 100 {
        return Ok(("", path));
    }
    // The prefix ends at a '/', is at most 155 bytes, and the rest at most 100.
    for (i, c) in path.char_indices().rev() {
        if c == '/' && i <= 155 && path.len() - i - 1 <= 100 && i > 0 {
            return Ok((&path[..i], &path[i + 1..]));
        }
    }
    Err(OciError::NameTooLong(path.to_string()))
}

/// One ustar header block.
pub fn tar_header(
    path: &str,
    mode: u32,
    size: u64,
    kind: u8,
    link: &str,
) -> Result<[u8; 512], OciError> {
    if path.is_empty() || path.starts_with('/') || path.split('/').any(|c| c == "..") {
        return Err(OciError::BadName(path.to_string()));
    }
    if link.len() > 100 {
        return Err(OciError::NameTooLong(link.to_string()));
    }
    let (prefix, name) = split_name(path)?;
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    octal(&mut h[100..108], u64::from(mode & 0o7777));
    octal(&mut h[108..116], 0);
    octal(&mut h[116..124], 0);
    octal(&mut h[124..136], size);
    octal(&mut h[136..148], MTIME);
    h[156] = kind;
    h[157..157 + link.len()].copy_from_slice(link.as_bytes());
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[265..269].copy_from_slice(b"root");
    h[297..301].copy_from_slice(b"root");
    h[345..345 + prefix.len()].copy_from_slice(prefix.as_bytes());
    // Checksum: the header's byte sum with the checksum field read as spaces.
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
    let s = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(s.as_bytes());
    Ok(h)
}

/// A tar stream of `entries` (sorted by path, parents before children; directories get a
/// trailing '/').
pub fn tar(entries: &[Entry]) -> Result<Vec<u8>, OciError> {
    let mut sorted: Vec<&Entry> = entries.iter().collect();
    sorted.sort_by(|a, b| a.path().cmp(b.path()));
    let mut out = Vec::new();
    for e in sorted {
        match e {
            Entry::Dir { path, mode } => {
                let p = format!("{}/", path.trim_end_matches('/'));
                out.extend_from_slice(&tar_header(&p, *mode, 0, b'5', "")?);
            }
            Entry::File { path, mode, data } => {
                out.extend_from_slice(&tar_header(path, *mode, data.len() as u64, b'0', "")?);
                out.extend_from_slice(data);
                let pad = (512 - data.len() % 512) % 512;
                out.extend(std::iter::repeat_n(0u8, pad));
            }
            Entry::Symlink { path, target } => {
                out.extend_from_slice(&tar_header(path, 0o777, 0, b'2', target)?);
            }
        }
    }
    out.extend(std::iter::repeat_n(0u8, 1024));
    Ok(out)
}

pub fn gzip(data: &[u8]) -> Result<Vec<u8>, OciError> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(data)
        .map_err(|e| OciError::Gzip(e.to_string()))?;
    enc.finish().map_err(|e| OciError::Gzip(e.to_string()))
}

/// The runtime settings of an image (the `config` object of the image config).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunConfig {
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub env: Vec<String>,
    pub working_dir: String,
    pub user: String,
}

/// OCI's name of this machine's architecture.
pub fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "arm",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        other => other,
    }
}

/// A blob: media type, bytes, digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    pub media_type: &'static str,
    pub data: Vec<u8>,
    pub digest: String,
}

impl Blob {
    fn new(media_type: &'static str, data: Vec<u8>) -> Blob {
        let digest = digest(&data);
        Blob {
            media_type,
            data,
            digest,
        }
    }

    fn descriptor(&self) -> Value {
        json!({"mediaType": self.media_type, "digest": self.digest, "size": self.data.len()})
    }
}

/// A built single-platform image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// Full reference, e.g. `ferry.local/pause:1`.
    pub reference: String,
    pub config: Blob,
    pub manifest: Blob,
    pub layers: Vec<Blob>,
    /// Uncompressed layer digests (the config's `rootfs.diff_ids`).
    pub diff_ids: Vec<String>,
}

/// The tag of `name:tag` (the part after the last ':' that follows the last '/').
pub fn tag_of(reference: &str) -> Option<&str> {
    let last = reference.rsplit('/').next().unwrap_or(reference);
    last.rsplit_once(':')
        .map(|(_, t)| t)
        .filter(|t| !t.is_empty())
}

/// Builds an image from layers given as entry lists.
pub fn build_image(
    reference: &str,
    layers: &[Vec<Entry>],
    run: &RunConfig,
) -> Result<Image, OciError> {
    if tag_of(reference).is_none() {
        return Err(OciError::NoTag(reference.to_string()));
    }
    let mut blobs = Vec::new();
    let mut diff_ids = Vec::new();
    for entries in layers {
        let raw = tar(entries)?;
        diff_ids.push(digest(&raw));
        blobs.push(Blob::new(MEDIA_LAYER_GZIP, gzip(&raw)?));
    }
    let mut cfg = serde_json::Map::new();
    if !run.entrypoint.is_empty() {
        cfg.insert("Entrypoint".into(), json!(run.entrypoint));
    }
    if !run.cmd.is_empty() {
        cfg.insert("Cmd".into(), json!(run.cmd));
    }
    if !run.env.is_empty() {
        cfg.insert("Env".into(), json!(run.env));
    }
    if !run.working_dir.is_empty() {
        cfg.insert("WorkingDir".into(), json!(run.working_dir));
    }
    if !run.user.is_empty() {
        cfg.insert("User".into(), json!(run.user));
    }
    let config = json!({
        "created": "2000-01-01T00:00:00Z",
        "architecture": oci_arch(),
        "os": "linux",
        "config": Value::Object(cfg),
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": blobs.iter().map(|_| json!({"created": "2000-01-01T00:00:00Z", "created_by": "ferry"})).collect::<Vec<_>>(),
    });
    let config = Blob::new(MEDIA_CONFIG, config.to_string().into_bytes());
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": config.descriptor(),
        "layers": blobs.iter().map(Blob::descriptor).collect::<Vec<_>>(),
    });
    let manifest = Blob::new(MEDIA_MANIFEST, manifest.to_string().into_bytes());
    Ok(Image {
        reference: reference.to_string(),
        config,
        manifest,
        layers: blobs,
        diff_ids,
    })
}

impl Image {
    /// `index.json` of a layout holding this image alone.
    pub fn index_json(&self) -> Value {
        let mut desc = self.manifest.descriptor();
        desc["platform"] = json!({"architecture": oci_arch(), "os": "linux"});
        desc["annotations"] = json!({
            ANNOTATION_CONTAINERD_NAME: self.reference,
            ANNOTATION_REF_NAME: tag_of(&self.reference).unwrap_or("latest"),
        });
        json!({"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": [desc]})
    }

    /// The OCI layout as a tar archive (`oci-archive`).
    pub fn archive(&self) -> Result<Vec<u8>, OciError> {
        let mut entries = vec![
            Entry::File {
                path: "oci-layout".into(),
                mode: 0o644,
                data: br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
            },
            Entry::File {
                path: "index.json".into(),
                mode: 0o644,
                data: self.index_json().to_string().into_bytes(),
            },
            Entry::Dir {
                path: "blobs".into(),
                mode: 0o755,
            },
            Entry::Dir {
                path: "blobs/sha256".into(),
                mode: 0o755,
            },
        ];
        let mut seen = std::collections::BTreeSet::new();
        for b in std::iter::once(&self.config)
            .chain(std::iter::once(&self.manifest))
            .chain(self.layers.iter())
        {
            if seen.insert(b.digest.clone()) {
                entries.push(Entry::File {
                    path: format!("blobs/sha256/{}", digest_hex(&b.digest)),
                    mode: 0o644,
                    data: b.data.clone(),
                });
            }
        }
        tar(&entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_of_empty() {
        assert_eq!(
            digest(b""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn header_fields_and_checksum() {
        let h = tar_header("bin/sh", 0o755, 10, b'0', "").expect("header");
        assert_eq!(&h[..6], b"bin/sh");
        assert_eq!(&h[100..108], b"0000755\0");
        assert_eq!(&h[124..136], b"00000000012\0");
        assert_eq!(h[156], b'0');
        assert_eq!(&h[257..263], b"ustar\0");
        // The stored checksum equals the sum with the field as spaces.
        let stored = std::str::from_utf8(&h[148..154]).expect("ascii");
        let stored = u32::from_str_radix(stored, 8).expect("octal");
        let mut copy = h;
        copy[148..156].copy_from_slice(b"        ");
        assert_eq!(stored, copy.iter().map(|b| u32::from(*b)).sum::<u32>());
    }

    #[test]
    fn names_table() {
        let long_dir = "d".repeat(120);
        let long = format!("{long_dir}/file");
        type Split = Result<(String, String), OciError>;
        let cases: Vec<(String, Split)> = vec![
            ("a/b".into(), Ok(("".into(), "a/b".into()))),
            (long.clone(), Ok((long_dir.clone(), "file".into()))),
            ("x".repeat(101), Err(OciError::NameTooLong("x".repeat(101)))),
        ];
        for (path, want) in cases {
            let got = split_name(&path).map(|(p, n)| (p.to_string(), n.to_string()));
            assert_eq!(got, want, "{path}");
        }
        assert_eq!(
            tar_header("/abs", 0o644, 0, b'0', ""),
            Err(OciError::BadName("/abs".into()))
        );
        assert_eq!(
            tar_header("a/../b", 0o644, 0, b'0', ""),
            Err(OciError::BadName("a/../b".into()))
        );
    }

    #[test]
    fn tar_layout_is_blocked_and_sorted() {
        let t = tar(&[
            Entry::File {
                path: "b".into(),
                mode: 0o644,
                data: b"hi".to_vec(),
            },
            Entry::Dir {
                path: "a".into(),
                mode: 0o755,
            },
        ])
        .expect("tar");
        assert_eq!(t.len(), 512 + 512 + 512 + 1024);
        assert_eq!(&t[..2], b"a/");
        assert_eq!(&t[512..513], b"b");
        assert_eq!(&t[1024..1026], b"hi");
    }

    #[test]
    fn tags_table() {
        let cases = [
            ("ferry.local/pause:1", Some("1")),
            ("127.0.0.1:5000/test/busybox:1", Some("1")),
            ("127.0.0.1:5000/test/busybox", None),
            ("busybox", None),
        ];
        for (r, want) in cases {
            assert_eq!(tag_of(r), want, "{r}");
        }
    }

    #[test]
    fn image_is_consistent_and_reproducible() {
        let layer = vec![Entry::File {
            path: "hello".into(),
            mode: 0o644,
            data: b"world".to_vec(),
        }];
        let run = RunConfig {
            cmd: vec!["/hello".into()],
            env: vec!["PATH=/bin".into()],
            ..Default::default()
        };
        let img = build_image("ferry.local/t:1", std::slice::from_ref(&layer), &run).expect("img");
        let again = build_image("ferry.local/t:1", &[layer], &run).expect("img");
        assert_eq!(img, again);
        let manifest: Value = serde_json::from_slice(&img.manifest.data).expect("json");
        assert_eq!(manifest["config"]["digest"], json!(img.config.digest));
        assert_eq!(manifest["layers"][0]["digest"], json!(img.layers[0].digest));
        assert_eq!(
            manifest["layers"][0]["size"],
            json!(img.layers[0].data.len())
        );
        let config: Value = serde_json::from_slice(&img.config.data).expect("json");
        assert_eq!(config["rootfs"]["diff_ids"][0], json!(img.diff_ids[0]));
        assert_eq!(config["config"]["Cmd"], json!(["/hello"]));
        assert!(config["config"].get("Entrypoint").is_none());
        let idx = img.index_json();
        assert_eq!(idx["manifests"][0]["digest"], json!(img.manifest.digest));
        assert_eq!(
            idx["manifests"][0]["annotations"][ANNOTATION_CONTAINERD_NAME],
            json!("ferry.local/t:1")
        );
        let ar = img.archive().expect("archive");
        assert_eq!(ar.len() % 512, 0);
        assert!(build_image("ferry.local/t", &[], &run).is_err());
    }
}
