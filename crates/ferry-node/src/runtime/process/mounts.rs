//! The mounts of an isolated container: the script its private mount namespace runs before the
//! container's command.
//!
//! Processes share the host's file system, so a volume's `mountPath` may not exist (a Secret at
//! `/etc/nginx/ssl`, `kubectl debug node/…` at `/host`). Its mount point is then made without
//! writing to the host:
//!
//! - the nearest existing parent `P` of the missing path is covered, inside the container's
//!   private mount namespace only, by a tmpfs (with `P`'s mode) on which every entry of the
//!   original `P` is recreated and bind-mounted back (recursively, so mounts below stay visible;
//!   symbolic links are copied) — the original is reached through a descriptor the script opened
//!   on it before covering it (`/proc/$$/fd/9/…`, not canonicalized by `mount -c`); the missing directories are then made on the tmpfs;
//! - when `P` is `/` (a tmpfs over `/` is not seen by a process whose root it is), the new root
//!   is a tmpfs at `<pod dir>/rootfs` (in the data dir) filled the same way from `/`, and the
//!   container's command is started `chroot`ed into it (in its working directory); exec and
//!   probes enter it with `nsenter --root`.
//!
//! Writes below existing entries still reach the host (as for any process container); new
//! entries directly in a covered directory stay in the tmpfs and go with the namespace.

use std::path::PathBuf;

use crate::runtime::seam::Mount;
use crate::volumes::sh_quote;

/// What an isolated container's namespace is set up with.
pub(super) struct Plan {
    pub(super) resolv_conf: PathBuf,
    pub(super) hosts_file: PathBuf,
    pub(super) hostname: String,
    pub(super) mounts: Vec<Mount>,
    /// Where a new root is built when a mount point is missing right below `/` (in the pod's
    /// dir in the data dir).
    pub(super) scratch: PathBuf,
}

/// Functions of the script (see the module documentation).
const FUNCTIONS: &str = r#"root=
fill() {
  for e in "$1"/* "$1"/.[!.]* "$1"/..?*; do
    [ -e "$e" ] || [ -L "$e" ] || continue
    n=${e##*/}
    if [ -L "$e" ]; then ln -s "$(readlink "$e")" "$2/$n"
    elif [ -d "$e" ]; then mkdir "$2/$n" && mount -c --rbind "$e" "$2/$n"
    else : > "$2/$n" && mount -c --bind "$e" "$2/$n"; fi || return 1
  done
}
mp() {
  t="$root$2"
  if [ -e "$t" ] || [ -L "$t" ]; then return 0; fi
  p=$(dirname "$t")
  while [ ! -e "$p" ]; do p=$(dirname "$p"); done
  [ -d "$p" ] || { echo "mount point $2: $p is not a directory" >&2; return 1; }
  if [ "$p" = / ]; then
    mkdir -p "$3" && mount -t tmpfs -o mode=755 tmpfs "$3" && fill "" "$3" || return 1
    root=$3
  elif [ "$p" != "$root" ]; then
    exec 9<"$p" || return 1
    mount -t tmpfs -o "mode=$(stat -c %a "$p")" tmpfs "$p" && fill "/proc/$$/fd/9" "$p" || return 1
    exec 9<&-
  fi
  t="$root$2"
  if [ -d "$1" ]; then mkdir -p "$t"; else mkdir -p "$(dirname "$t")" && : > "$t"; fi
}
"#;

/// The `sh -c` script: pod files and hostname, volumes (mount points made as above), then
/// `exec "$@"` (chrooted when a new root was needed).
pub(super) fn script(plan: &Plan) -> String {
    let q = |p: &std::path::Path| sh_quote(&p.display().to_string());
    let mut s = String::from(FUNCTIONS);
    s += &format!(
        "mount --bind {} /etc/resolv.conf && mount --bind {} /etc/hosts && hostname {} || exit 1\n",
        q(&plan.resolv_conf),
        q(&plan.hosts_file),
        sh_quote(&plan.hostname)
    );
    let scratch = q(&plan.scratch);
    for m in &plan.mounts {
        let (src, dst) = (q(&m.host_path), sh_quote(&m.container_path));
        s += &format!("mp {src} {dst} {scratch} && mount --bind {src} \"$root\"{dst}");
        if m.read_only {
            s += &format!(" && mount -o remount,bind,ro \"$root\"{dst}");
        }
        s += " || exit 1\n";
    }
    s += "if [ -n \"$root\" ]; then exec chroot \"$root\" sh -c 'cd \"$0\" 2>/dev/null; exec \"$@\"' \"$(pwd)\" \"$@\"; fi\nexec \"$@\"\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(mounts: Vec<Mount>) -> Plan {
        Plan {
            resolv_conf: "/d/pods/p/resolv.conf".into(),
            hosts_file: "/d/pods/p/hosts".into(),
            hostname: "web-0".into(),
            mounts,
            scratch: "/d/pods/p/rootfs".into(),
        }
    }

    #[test]
    fn pod_files_then_volumes_then_the_command() {
        let s = script(&plan(vec![Mount {
            host_path: "/d/pods/p/volumes/tls".into(),
            container_path: "/etc/nginx/ssl".into(),
            read_only: true,
        }]));
        let files = s.find("mount --bind '/d/pods/p/resolv.conf' /etc/resolv.conf");
        let vol = s.find("mp '/d/pods/p/volumes/tls' '/etc/nginx/ssl' '/d/pods/p/rootfs' && mount --bind '/d/pods/p/volumes/tls' \"$root\"'/etc/nginx/ssl' && mount -o remount,bind,ro \"$root\"'/etc/nginx/ssl' || exit 1");
        let exec = s.rfind("exec \"$@\"");
        assert!(files.is_some() && vol.is_some() && exec.is_some(), "{s}");
        assert!(files < vol && vol < exec, "{s}");
        assert!(s.contains("hostname 'web-0'"), "{s}");
    }

    #[test]
    fn nothing_is_made_outside_the_namespace_or_the_pod_dir() {
        // The only mkdir/touch targets are "$t" (inside a tmpfs or a new root), the scratch dir
        // ($3, in the pod dir) and tmpfs entries ("$2/$n").
        for line in FUNCTIONS.lines() {
            for verb in ["mkdir ", ": > "] {
                if let Some(i) = line.find(verb) {
                    let target = &line[i + verb.len()..];
                    assert!(
                        target.starts_with("-p \"$t\"")
                            || target.starts_with("-p \"$(dirname \"$t\")\"")
                            || target.starts_with("\"$t\"")
                            || target.starts_with("-p \"$3\"")
                            || target.starts_with("\"$2/$n\""),
                        "unexpected creation: {line}"
                    );
                }
            }
        }
    }
}
