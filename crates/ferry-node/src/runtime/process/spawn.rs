//! Starting, signalling and entering container processes, and reaping those a previous agent
//! left running.

use std::process::Stdio;
use std::sync::Arc;

use rustix::process::{Pid, Signal};

use super::mounts;
use crate::runtime::seam::ContainerSpec;

/// The command line that runs `argv` in the pod's context: in a fresh mount + UTS namespace
/// (entered through `enter`, the pod's network namespace prefix) with the pod's resolv.conf,
/// hosts and volumes mounted and its hostname set.
pub(super) fn isolated_argv(enter: &[String], plan: &mounts::Plan, argv: &[String]) -> Vec<String> {
    let mut v: Vec<String> = enter.to_vec();
    v.extend([
        "unshare".into(),
        "--mount".into(),
        "--uts".into(),
        "--propagation".into(),
        "private".into(),
        "--kill-child".into(),
        "--fork".into(),
        "--".into(),
        "sh".into(),
        "-c".into(),
        mounts::script(plan),
        "sh".into(),
    ]);
    v.extend(argv.iter().cloned());
    v
}

/// Starts a container's process; its output goes through the agent into the spec's log path
/// (CRI log format, created 0600: pod logs may hold secrets), its stdin stays open when the
/// container asks for one (`stdin: true`, for attach).
pub(super) fn spawn(
    argv: &[String],
    spec: &ContainerSpec,
) -> std::io::Result<(tokio::process::Child, Arc<crate::logs::ContainerIo>)> {
    let (prog, rest) = argv
        .split_first()
        .ok_or_else(|| std::io::Error::other("empty command"))?;
    let log = spec.log_path.as_path();
    // With `tty: true` the container runs on a terminal of its own (setsid -c makes it the
    // controlling one; the session leader's process group is what stopping signals).
    let mut cmd = if spec.tty {
        let mut cmd = tokio::process::Command::new("setsid");
        cmd.arg("-c").arg(prog).args(rest);
        cmd
    } else {
        let mut cmd = tokio::process::Command::new(prog);
        cmd.args(rest).process_group(0);
        cmd
    };
    cmd.env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .kill_on_drop(true);
    if let Some(wd) = &spec.working_dir {
        cmd.current_dir(wd);
    }
    if spec.tty {
        let pair = nix::pty::openpty(None, None).map_err(std::io::Error::other)?;
        let path = std::fs::read_link(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&pair.slave)
        ))?;
        cmd.stdin(Stdio::from(pair.slave.try_clone()?))
            .stdout(Stdio::from(pair.slave.try_clone()?))
            .stderr(Stdio::from(pair.slave.try_clone()?));
        let child = cmd.spawn()?;
        drop(cmd);
        drop(pair.slave);
        let master = std::fs::File::from(pair.master);
        let writer = tokio::fs::File::from_std(master.try_clone()?);
        let io = crate::logs::ContainerIo::start(
            Some(tokio::fs::File::from_std(master)),
            None::<tokio::fs::File>,
            spec.stdin
                .then(|| Box::new(writer) as crate::logs::StdinWriter),
            spec.stdin_once,
            Some(path),
            log,
        )?;
        Ok((child, io))
    } else {
        cmd.stdin(if spec.stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn()?;
        let io = crate::logs::ContainerIo::start(
            child.stdout.take(),
            child.stderr.take(),
            child
                .stdin
                .take()
                .map(|s| Box::new(s) as crate::logs::StdinWriter),
            spec.stdin_once,
            None,
            log,
        )?;
        Ok((child, io))
    }
}

/// A command run "inside" a container: in the namespaces of its process `pid` (nsenter: mount,
/// UTS and root when `isolated`, network when `netns`), with the given environment and working
/// directory. `None` for an empty command.
pub fn nsenter_command(
    pid: Option<u32>,
    isolated: bool,
    netns: bool,
    env: &[(String, String)],
    working_dir: Option<&str>,
    cmd: &[String],
) -> Option<tokio::process::Command> {
    let (first, rest) = cmd.split_first()?;
    let mut c = match pid.filter(|_| isolated || netns) {
        Some(pid) => {
            // An isolated container's process is `unshare`'s only child (which may have
            // chrooted into a new root, see `mounts`): enter that one.
            let target = if isolated {
                only_child(pid).unwrap_or(pid)
            } else {
                pid
            };
            let mut c = tokio::process::Command::new("nsenter");
            c.arg("-t").arg(target.to_string());
            if isolated {
                // The container's root too: a pod whose mount points needed a new root
                // (see `mounts`) runs chrooted.
                c.arg("-m").arg("-u").arg("-r");
            }
            if netns {
                c.arg("-n");
            }
            c.arg("--").arg(first).args(rest);
            c
        }
        None => {
            let mut c = tokio::process::Command::new(first);
            c.args(rest);
            c
        }
    };
    c.env_clear()
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    if let Some(wd) = working_dir {
        c.current_dir(wd);
    }
    Some(c)
}

/// The first child of process `pid`, if it has one.
fn only_child(pid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Sends a signal to the process group `pid` leads (`kill(2)` with `-pid`). Errors (the group
/// is gone) are ignored: the caller waits for the exit either way.
pub fn signal_group(pid: u32, sig: Signal) {
    if let Some(pgid) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
        let _ = rustix::process::kill_process_group(pgid, sig);
    }
}

/// Field 22 of `/proc/<pid>/stat`: the process's start time, which tells a process from a
/// later one that reused its PID.
pub(super) fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; count from the closing parenthesis.
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// CPU time (ns) and resident memory (bytes) of process `pid`.
pub(super) fn usage(pid: u32) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) are at 11 and 12 after the command name, in USER_HZ
    // (100 per second on Linux).
    let ticks: u64 = rest.get(11)?.parse::<u64>().ok()? + rest.get(12)?.parse::<u64>().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Some((ticks * 10_000_000, rss_kib * 1024))
}

/// Kills the process groups that a previous agent (killed without a chance to stop its pods)
/// left running, as recorded under `<state dir>/pods/*/proc-<pid>`; returns how many.
pub fn reap_stale(state_dir: &std::path::Path) -> usize {
    let mut reaped = 0;
    let Ok(pods) = std::fs::read_dir(state_dir.join("pods")) else {
        return 0;
    };
    for pod in pods.flatten() {
        let Ok(entries) = std::fs::read_dir(pod.path()) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(pid) = name
                .strip_prefix("proc-")
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            let recorded = std::fs::read_to_string(e.path())
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok());
            if recorded.is_some() && recorded == process_start_time(pid) {
                signal_group(pid, Signal::KILL);
                reaped += 1;
            }
            let _ = std::fs::remove_file(e.path());
        }
    }
    reaped
}

/// Exit code and signal of a finished process (128 + signal when a signal ended it).
pub(super) fn exit_of(st: std::io::Result<std::process::ExitStatus>) -> (i32, Option<i32>) {
    use std::os::unix::process::ExitStatusExt;
    match st {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(c), _) => (c, None),
            (None, Some(sig)) => (128 + sig, Some(sig)),
            _ => (255, None),
        },
        Err(_) => (255, None),
    }
}

#[cfg(test)]
mod reap_tests {
    use super::*;

    #[test]
    fn reaps_what_a_previous_agent_left_running() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pod = dir.path().join("pods").join("default_p_uid");
        std::fs::create_dir_all(&pod).expect("mkdir");
        let mut child = {
            use std::os::unix::process::CommandExt;
            std::process::Command::new("sleep")
                .arg("30")
                .process_group(0)
                .spawn()
                .expect("sleep")
        };
        let pid = child.id();
        let start = process_start_time(pid).expect("start time");
        std::fs::write(pod.join(format!("proc-{pid}")), start.to_string()).expect("marker");
        // A marker whose start time does not match (a reused PID) is left alone.
        let me = std::process::id();
        std::fs::write(pod.join(format!("proc-{me}")), "1").expect("marker");
        assert_eq!(reap_stale(dir.path()), 1);
        let status = child.wait().expect("wait");
        assert!(!status.success(), "sleep was not killed");
        assert!(
            std::fs::read_dir(&pod).expect("dir").next().is_none(),
            "markers removed"
        );
    }
}
