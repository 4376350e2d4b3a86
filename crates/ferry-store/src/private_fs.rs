//! Files only the owner may read: the data directory (`0700`), the store, keys, tokens and logs
//! (`0600`).
//!
//! Everything is created with its final mode (`mkdir`/`open` with the mode, never "create then
//! chmod"), so no other user can open it in between whatever the umask is. What already exists
//! with a looser mode (an older Ferry made it, or someone ran `chmod`) is tightened when Ferry
//! starts, with a warning naming the path and both modes.
//!
//! [`tightened`] is the decision (a pure function of the mode found and the mode wanted); the
//! rest applies it.

use std::io;
use std::path::Path;

/// The mode of the data directory and the directories under it that hold secrets.
pub const DIR_MODE: u32 = 0o700;
/// The mode of the store, keys, tokens, kubeconfigs and logs.
pub const FILE_MODE: u32 = 0o600;

/// The mode `found` should be changed to so that it grants nothing beyond `wanted`, or `None`
/// when it already does not. Bits the owner lacks are not added (a file someone made read-only
/// stays read-only), and the file type bits are ignored.
pub fn tightened(found: u32, wanted: u32) -> Option<u32> {
    let perms = found & 0o7777;
    let next = perms & wanted;
    (next != perms).then_some(next)
}

#[cfg(unix)]
fn mode_of(path: &Path) -> io::Result<u32> {
    use std::os::unix::fs::PermissionsExt;
    Ok(std::fs::metadata(path)?.permissions().mode())
}

/// Tightens `path` to at most `wanted` (warning when it changes anything); returns whether it
/// changed anything.
#[cfg(unix)]
pub fn enforce_mode(path: &Path, wanted: u32) -> io::Result<bool> {
    use std::os::unix::fs::PermissionsExt;
    let found = mode_of(path)?;
    let Some(next) = tightened(found, wanted) else {
        return Ok(false);
    };
    tracing::warn!(
        path = %path.display(),
        "{} was readable by other users (mode {:04o}); changing it to {:04o}",
        path.display(),
        found & 0o7777,
        next
    );
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(next))?;
    Ok(true)
}

#[cfg(not(unix))]
pub fn enforce_mode(_path: &Path, _wanted: u32) -> io::Result<bool> {
    Ok(false)
}

/// Creates the directory `path` (and missing parents) with mode `0700`, or tightens an existing
/// one to it.
pub fn ensure_private_dir(path: &Path) -> io::Result<()> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        b.mode(DIR_MODE);
    }
    b.create(path)?;
    enforce_mode(path, DIR_MODE)?;
    Ok(())
}

/// Opens options that create a file with mode `0600` (the umask can only take bits away).
pub fn private_open_options() -> std::fs::OpenOptions {
    let mut o = std::fs::OpenOptions::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(FILE_MODE);
    }
    o
}

/// Makes sure the file `path` exists with at most mode `0600`: creates it empty with that mode
/// when missing, tightens it when looser.
pub fn ensure_private_file(path: &Path) -> io::Result<()> {
    private_open_options()
        .create(true)
        .append(true)
        .open(path)?;
    enforce_mode(path, FILE_MODE)?;
    Ok(())
}

/// Tightens `path` to `0600` if it exists (a missing file is fine).
pub fn tighten_if_present(path: &Path) -> io::Result<()> {
    match enforce_mode(path, FILE_MODE) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Writes `contents` to `path` atomically (a temporary file beside it, renamed over it), the
/// file being `0600` from its creation.
pub fn write_private(path: &Path, contents: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp{}", std::process::id()));
    let tmp = path.with_file_name(name);
    let _ = std::fs::remove_file(&tmp);
    let mut f = private_open_options()
        .write(true)
        .create_new(true)
        .open(&tmp)?;
    f.write_all(contents)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)
}

#[cfg(all(test, unix))]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn tightening_decisions() {
        let cases = [
            (0o100644, FILE_MODE, Some(0o600)),
            (0o100600, FILE_MODE, None),
            (0o100400, FILE_MODE, None),
            (0o100666, FILE_MODE, Some(0o600)),
            (0o100640, FILE_MODE, Some(0o600)),
            (0o104755, FILE_MODE, Some(0o600)),
            (0o040755, DIR_MODE, Some(0o700)),
            (0o040700, DIR_MODE, None),
            (0o040711, DIR_MODE, Some(0o700)),
            (0o040500, DIR_MODE, None),
        ];
        for (found, wanted, want) in cases {
            assert_eq!(tightened(found, wanted), want, "{found:o} -> {wanted:o}");
        }
    }

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    /// Whatever the umask, new files and directories get exactly the private modes (a umask
    /// only takes bits away), and looser existing ones are tightened.
    #[test]
    fn created_private_and_tightened() {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("data/nested");
        ensure_private_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        let file = dir.join("store.redb");
        ensure_private_file(&file).unwrap();
        assert_eq!(mode(&file), 0o600);
        write_private(&dir.join("key"), b"secret").unwrap();
        assert_eq!(mode(&dir.join("key")), 0o600);
        assert_eq!(std::fs::read(dir.join("key")).unwrap(), b"secret");
        // Loosened by someone: tightened again at the next start.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        ensure_private_dir(&dir).unwrap();
        ensure_private_file(&file).unwrap();
        assert_eq!((mode(&dir), mode(&file)), (0o700, 0o600));
        tighten_if_present(&dir.join("absent")).unwrap();
    }
}
