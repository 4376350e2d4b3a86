//! Ferry's offline images, built from the host's static busybox, and their import into
//! containerd.
//!
//! **The pause image is busybox-static running a shell loop**, not a Go pause binary: Debian's
//! `busybox-static` package is all `ferry up` needs on a user's machine (no Go toolchain, no
//! internet, no build step), the binary is already static so the image has one file plus
//! symlinks, and the same binary serves as the `busybox` test image. The loop traps TERM and
//! INT and exits 0 at once, as pause does; as PID 1 of the sandbox it gets no other signal
//! (unhandled signals are ignored for PID 1), and `wait` returns immediately when the trap
//! fires, so stop is not delayed by the hour-long `sleep` (which dies with the namespace).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::oci::{self, Entry, Image, OciError, RunConfig};

/// The sandbox image containerd's CRI plugin is configured with.
pub const PAUSE_IMAGE: &str = "ferry.local/pause:1";
/// The busybox test image.
pub const BUSYBOX_IMAGE: &str = "ferry.local/busybox:1";
/// The containerd namespace the CRI plugin uses.
pub const CRI_NAMESPACE: &str = "k8s.io";

/// The pause loop (PID 1 of every sandbox).
pub const PAUSE_SCRIPT: &str =
    "trap 'exit 0' TERM INT; while :; do /bin/busybox sleep 3600 & wait $!; done";

/// Where Debian's busybox-static installs the binary.
pub const BUSYBOX_PATHS: &[&str] = &["/bin/busybox", "/usr/bin/busybox"];

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("no busybox found at {0:?}: install Debian's busybox-static")]
    NoBusybox(Vec<String>),
    #[error("{0} is dynamically linked: install Debian's busybox-static")]
    NotStatic(String),
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Oci(#[from] OciError),
    #[error("running {cmd}: {source}")]
    Spawn { cmd: String, source: std::io::Error },
    #[error("{cmd} failed ({status}): {stderr}")]
    Command {
        cmd: String,
        status: String,
        stderr: String,
    },
    #[error("{cmd} did not finish within {after:?}")]
    Timeout { cmd: String, after: Duration },
}

/// Whether an ELF image has no program interpreter (PT_INTERP), i.e. is statically linked.
/// Returns None for data that is not a 64-bit little-endian ELF file.
pub fn elf_is_static(data: &[u8]) -> Option<bool> {
    if data.len() < 64 || &data[..4] != b"\x7fELF" || data[4] != 2 || data[5] != 1 {
        return None;
    }
    let u16_at = |o: usize| data.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let phoff = data
        .get(0x20..0x28)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_le_bytes)?;
    let phentsize = usize::from(u16_at(0x36)?);
    let phnum = usize::from(u16_at(0x38)?);
    let phoff = usize::try_from(phoff).ok()?;
    for i in 0..phnum {
        let at = phoff.checked_add(i.checked_mul(phentsize)?)?;
        let ty = data
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))?;
        if ty == 3 {
            return Some(false);
        }
    }
    Some(true)
}

/// Finds and reads the host's static busybox.
pub fn read_busybox() -> Result<(PathBuf, Vec<u8>), ImageError> {
    for p in BUSYBOX_PATHS {
        let path = Path::new(p);
        if !path.exists() {
            continue;
        }
        let data = std::fs::read(path).map_err(|source| ImageError::Read {
            path: p.to_string(),
            source,
        })?;
        return match elf_is_static(&data) {
            Some(true) => Ok((path.to_path_buf(), data)),
            _ => Err(ImageError::NotStatic(p.to_string())),
        };
    }
    Err(ImageError::NoBusybox(
        BUSYBOX_PATHS.iter().map(|s| s.to_string()).collect(),
    ))
}

fn base_entries(busybox: &[u8]) -> Vec<Entry> {
    let dir = |p: &str, mode| Entry::Dir {
        path: p.into(),
        mode,
    };
    vec![
        dir("bin", 0o755),
        dir("etc", 0o755),
        dir("tmp", 0o1777),
        dir("proc", 0o555),
        dir("sys", 0o555),
        dir("dev", 0o755),
        Entry::File {
            path: "bin/busybox".into(),
            mode: 0o755,
            data: busybox.to_vec(),
        },
        Entry::File {
            path: "etc/passwd".into(),
            mode: 0o644,
            data: b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"
                .to_vec(),
        },
        Entry::File {
            path: "etc/group".into(),
            mode: 0o644,
            data: b"root:x:0:\nnogroup:x:65534:\n".to_vec(),
        },
    ]
}

/// The pause image: busybox and the [`PAUSE_SCRIPT`] loop.
pub fn pause_image(busybox: &[u8]) -> Result<Image, ImageError> {
    let run = RunConfig {
        entrypoint: vec![
            "/bin/busybox".into(),
            "sh".into(),
            "-c".into(),
            PAUSE_SCRIPT.into(),
        ],
        env: vec!["PATH=/bin".into()],
        working_dir: "/".into(),
        ..Default::default()
    };
    Ok(oci::build_image(
        PAUSE_IMAGE,
        &[base_entries(busybox)],
        &run,
    )?)
}

/// A busybox image named `reference`: `/bin/busybox`, a symlink per applet in `/bin`, and
/// `sh` as the default command.
pub fn busybox_image(
    reference: &str,
    busybox: &[u8],
    applets: &[String],
) -> Result<Image, ImageError> {
    let mut entries = base_entries(busybox);
    for a in applets {
        if a.is_empty() || a == "busybox" || a.contains('/') {
            continue;
        }
        entries.push(Entry::Symlink {
            path: format!("bin/{a}"),
            target: "busybox".into(),
        });
    }
    entries.dedup_by(|a, b| a == b);
    let run = RunConfig {
        cmd: vec!["sh".into()],
        env: vec!["PATH=/bin".into()],
        ..Default::default()
    };
    Ok(oci::build_image(reference, &[entries], &run)?)
}

/// The applets of a busybox binary (`busybox --list`).
pub fn busybox_applets(busybox: &Path) -> Result<Vec<String>, ImageError> {
    let cmd = format!("{} --list", busybox.display());
    let out = std::process::Command::new(busybox)
        .arg("--list")
        .output()
        .map_err(|source| ImageError::Spawn {
            cmd: cmd.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(ImageError::Command {
            cmd,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect())
}

/// Writes an image's OCI archive to `path`.
pub fn write_archive(image: &Image, path: &Path) -> Result<(), ImageError> {
    let data = image.archive()?;
    std::fs::write(path, data).map_err(|source| ImageError::Write {
        path: path.display().to_string(),
        source,
    })
}

/// Imports an OCI archive into containerd's CRI namespace with `ctr` (Debian's containerd
/// ships it), unpacked for `snapshotter` so that the CRI plugin can create containers from it.
pub async fn import_image(
    socket: &Path,
    archive: &Path,
    snapshotter: &str,
) -> Result<(), ImageError> {
    let args = import_args(socket, archive, snapshotter);
    let cmd = format!("ctr {}", args.join(" "));
    let child = tokio::process::Command::new("ctr")
        .args(&args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let after = Duration::from_secs(300);
    let out = match tokio::time::timeout(after, child).await {
        Ok(r) => r.map_err(|source| ImageError::Spawn {
            cmd: cmd.clone(),
            source,
        })?,
        Err(_) => return Err(ImageError::Timeout { cmd, after }),
    };
    if !out.status.success() {
        return Err(ImageError::Command {
            cmd,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(())
}

/// The `ctr` arguments of [`import_image`].
pub fn import_args(socket: &Path, archive: &Path, snapshotter: &str) -> Vec<String> {
    vec![
        "--address".into(),
        socket.display().to_string(),
        "--namespace".into(),
        CRI_NAMESPACE.into(),
        "images".into(),
        "import".into(),
        "--snapshotter".into(),
        snapshotter.into(),
        archive.display().to_string(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elf(interp: bool) -> Vec<u8> {
        let mut d = vec![0u8; 64 + 2 * 56];
        d[..4].copy_from_slice(b"\x7fELF");
        d[4] = 2;
        d[5] = 1;
        d[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        d[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        d[0x38..0x3a].copy_from_slice(&2u16.to_le_bytes());
        d[64..68].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
        let second: u32 = if interp { 3 } else { 1 };
        d[120..124].copy_from_slice(&second.to_le_bytes());
        d
    }

    #[test]
    fn elf_static_table() {
        let mut truncated = elf(false);
        truncated.truncate(100);
        let cases: Vec<(&str, Vec<u8>, Option<bool>)> = vec![
            ("static", elf(false), Some(true)),
            ("dynamic", elf(true), Some(false)),
            ("not elf", b"#!/bin/sh\n".repeat(10), None),
            ("truncated phdrs", truncated, None),
        ];
        for (name, data, want) in cases {
            assert_eq!(elf_is_static(&data), want, "{name}");
        }
    }

    #[test]
    fn images_have_expected_config() {
        let fake = elf(false);
        let p = pause_image(&fake).expect("pause");
        let cfg: serde_json::Value = serde_json::from_slice(&p.config.data).expect("json");
        assert_eq!(cfg["config"]["Entrypoint"][0], "/bin/busybox");
        assert_eq!(cfg["config"]["Entrypoint"][3], PAUSE_SCRIPT);
        let b = busybox_image(
            BUSYBOX_IMAGE,
            &fake,
            &["sh".into(), "echo".into(), "busybox".into(), "".into()],
        )
        .expect("busybox");
        let cfg: serde_json::Value = serde_json::from_slice(&b.config.data).expect("json");
        assert_eq!(cfg["config"]["Cmd"], serde_json::json!(["sh"]));
        assert_ne!(p.layers[0].digest, b.layers[0].digest);
    }

    #[test]
    fn import_uses_the_cri_namespace_and_snapshotter() {
        let a = import_args(Path::new("/d/c.sock"), Path::new("/d/i.tar"), "native");
        assert_eq!(a[..4], ["--address", "/d/c.sock", "--namespace", "k8s.io"]);
        assert!(a.windows(2).any(|w| w == ["--snapshotter", "native"]));
        assert_eq!(a.last().map(String::as_str), Some("/d/i.tar"));
    }
}
