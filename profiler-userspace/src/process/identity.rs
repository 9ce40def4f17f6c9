//! Reads what a process's identity is made of (`aggregate::Identity`): its cgroup, its
//! `status` (the namespace pid), its executable and, of its environment, only the variables
//! asked for. Each file is the kernel's, read with a bound.

use std::io::Read;

/// Most of `/proc/PID/environ` read: the variables asked for are looked for in it, nothing else
/// is kept. An environment is a few KiB; a larger one is read this far.
const ENVIRON_MAX: u64 = 256 * 1024;
/// Longest value read of one variable (what is kept is shorter still).
const VAR_MAX: usize = 1024;

/// The environment variables a process's identity may come from, before `--env-label`'s.
pub const IDENTITY_VARS: &[&str] = &[
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "PYROSCOPE_APPLICATION_NAME",
];

/// What was read of a process.
#[derive(Default, Debug)]
pub struct Raw {
    pub cgroup: String,
    pub status: String,
    /// The variables found of those asked for, as (`NAME`, `VALUE`).
    pub env: Vec<(String, String)>,
    pub executable: Option<String>,
}

/// Reads process `pid`'s cgroup, status, executable, and the variables `IDENTITY_VARS` and
/// `env_labels` name.
pub fn read(pid: u32, env_labels: &[String]) -> Raw {
    let mut wanted: Vec<&str> = IDENTITY_VARS.to_vec();
    wanted.extend(env_labels.iter().map(String::as_str));
    Raw {
        cgroup: super::procfs::read(&format!("/proc/{pid}/cgroup")).unwrap_or_default(),
        status: super::procfs::read(&format!("/proc/{pid}/status")).unwrap_or_default(),
        env: read_environ(pid, &wanted),
        executable: std::fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .map(|exe| {
                let root = std::fs::read_link(format!("/proc/{pid}/root")).unwrap_or_default();
                inside_root(&exe.to_string_lossy(), &root.to_string_lossy())
                    .chars()
                    .take(VAR_MAX)
                    .collect()
            }),
    }
}

/// A path the kernel gives from the profiler's root, as the process sees it from its own
/// `root` (a container's executable is `/usr/bin/python3`, not the runtime's path to it).
fn inside_root(path: &str, root: &str) -> String {
    let root = root.trim_end_matches('/');
    match path.strip_prefix(root) {
        Some(rest) if !root.is_empty() && rest.starts_with('/') => rest.to_string(),
        _ => path.to_string(),
    }
}

/// The variables of `pid`'s environment named in `wanted` (the first of each), read with a
/// bound; nothing else of it is kept.
fn read_environ(pid: u32, wanted: &[&str]) -> Vec<(String, String)> {
    let mut buf = Vec::new();
    let Ok(f) = std::fs::File::open(format!("/proc/{pid}/environ")) else {
        return Vec::new();
    };
    if f.take(ENVIRON_MAX).read_to_end(&mut buf).is_err() {
        return Vec::new();
    }
    environ_vars(&buf, wanted)
}

fn environ_vars(buf: &[u8], wanted: &[&str]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for entry in buf.split(|&b| b == 0) {
        let Some(eq) = entry.iter().position(|&b| b == b'=') else {
            continue;
        };
        let (name, value) = (&entry[..eq], &entry[eq + 1..]);
        let Ok(name) = std::str::from_utf8(name) else {
            continue;
        };
        if wanted.contains(&name) && !out.iter().any(|(n, _)| n == name) {
            let value = String::from_utf8_lossy(&value[..value.len().min(VAR_MAX)]);
            out.push((name.to_string(), value.into_owned()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environ_keeps_only_what_is_named_and_bounds_it() {
        let long = "v".repeat(10_000);
        let buf = format!("A=1\0SECRET=hunter2\0B=x=y\0A=2\0NOEQ\0C={long}\0");
        let got = environ_vars(buf.as_bytes(), &["A", "B", "C"]);
        assert_eq!(got[0], ("A".into(), "1".into()));
        assert_eq!(got[1], ("B".into(), "x=y".into()));
        assert!(!got.iter().any(|(n, _)| n == "SECRET"));
        assert_eq!(got[2].1.len(), VAR_MAX);
        assert_eq!(got.len(), 3);
    }

    #[test]
    fn a_containers_executable_is_its_own_path() {
        assert_eq!(
            inside_root(
                "/var/lib/docker/overlay2/x/merged/usr/bin/python3",
                "/var/lib/docker/overlay2/x/merged"
            ),
            "/usr/bin/python3"
        );
        assert_eq!(inside_root("/usr/bin/python3", "/"), "/usr/bin/python3");
        assert_eq!(inside_root("/srvx/bin/p", "/srv"), "/srvx/bin/p");
    }

    #[test]
    fn reads_its_own_process() {
        let me = read(std::process::id(), &["PATH".to_string()]);
        assert!(
            me.cgroup.contains("::") || me.cgroup.contains(":/"),
            "{:?}",
            me.cgroup
        );
        assert!(me.status.contains("NSpid:"));
        assert!(me.env.iter().any(|(n, _)| n == "PATH"));
        assert!(me.executable.is_some());
    }
}
