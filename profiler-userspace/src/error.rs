//! The errors a user sees: one line each, with an exit code that follows from its kind
//! (docs/troubleshooting.md, "Exit codes"). Layers report kinds (`capture::ErrorKind`); nothing here reads
//! message text.

use tachyon_bpf::capture::{self, CaptureError};
use tachyon_bpf::output;

/// What went wrong, as far as the exit code is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Other,
    /// A bad command line.
    Usage,
    /// Not root, or capabilities missing.
    Permission,
    /// The kernel cannot run the profiler.
    Kernel,
    /// A target process: unknown pid, a kernel thread, a command that cannot start.
    Target,
    /// An output file or directory.
    Output,
    /// An input file (a recording).
    Input,
}

/// The error of a run: its kind (the exit code), one line for the user, and the error it came
/// from (`source()`), whose chain `-v` prints.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct AppError {
    pub kind: Kind,
    pub message: String,
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl AppError {
    pub fn new(kind: Kind, message: impl Into<String>) -> AppError {
        AppError {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// The same error, caused by `source`.
    pub fn because(mut self, source: impl std::error::Error + Send + Sync + 'static) -> AppError {
        self.source = Some(Box::new(source));
        self
    }

    /// The causes below the message, outermost first (`source()`'s chain).
    pub fn causes(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut at = std::error::Error::source(self);
        while let Some(e) = at {
            if out.len() == 16 {
                break;
            }
            out.push(e.to_string());
            at = e.source();
        }
        out
    }

    pub fn code(&self) -> i32 {
        match self.kind {
            Kind::Other => 1,
            Kind::Usage => 2,
            Kind::Permission => 3,
            Kind::Kernel => 4,
            Kind::Target => 5,
            Kind::Output => 6,
            Kind::Input => 7,
        }
    }
}

/// Shorthands: `usage("...")` and so on.
pub fn usage(m: impl Into<String>) -> AppError {
    AppError::new(Kind::Usage, m)
}
pub fn target(m: impl Into<String>) -> AppError {
    AppError::new(Kind::Target, m)
}
pub fn output(m: impl Into<String>) -> AppError {
    AppError::new(Kind::Output, m)
}
pub fn other(m: impl Into<String>) -> AppError {
    AppError::new(Kind::Other, m)
}

const PRIVILEGE: &str =
    "needs root, or CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH and CAP_SYSLOG";

impl From<CaptureError> for AppError {
    fn from(e: CaptureError) -> Self {
        let error = AppError::from_capture(&e);
        error.because(e)
    }
}

impl AppError {
    /// The kind and message of a capture error, with what the user can do about it.
    fn from_capture(e: &CaptureError) -> AppError {
        if let (CaptureError::Attach { .. }, Some(os)) = (e, os_error(e)) {
            // The kernel's own reason, which the error's text leaves out.
            let denied = matches!(os.raw_os_error(), Some(libc::EACCES | libc::EPERM));
            return if denied {
                AppError::new(
                    Kind::Permission,
                    format!("{e} ({os}): {}", perf_hint(cap_eff(), perf_paranoid())),
                )
            } else {
                AppError::new(Kind::Kernel, format!("{e} ({os})"))
            };
        }
        match (e.kind(), e) {
            (capture::ErrorKind::Permission, _) => AppError::new(
                Kind::Permission,
                format!("{e}: {}", permission_hint(cap_eff(), memlock_limit())),
            ),
            (capture::ErrorKind::Kernel, CaptureError::Refused { .. }) => AppError::new(
                Kind::Kernel,
                format!(
                    "{e} (run with --verbose for the verifier's log; tachyon-bpf needs Linux {} \
                     or newer with BTF)",
                    capture::MIN_KERNEL
                ),
            ),
            (
                capture::ErrorKind::Kernel,
                CaptureError::Load { .. } | CaptureError::Attach { .. },
            ) => AppError::new(
                Kind::Kernel,
                format!(
                    "{e} (tachyon-bpf needs Linux {} or newer with BTF, BPF ring buffers and \
                         perf_event BPF programs)",
                    capture::MIN_KERNEL
                ),
            ),
            (capture::ErrorKind::Kernel, _) => AppError::new(Kind::Kernel, e.to_string()),
            (capture::ErrorKind::Other, _) => AppError::new(Kind::Other, e.to_string()),
        }
    }
}

impl From<output::Error> for AppError {
    fn from(e: output::Error) -> Self {
        let kind = match e.kind {
            output::ErrorKind::Output => Kind::Output,
            output::ErrorKind::Input => Kind::Input,
            output::ErrorKind::Usage => Kind::Usage,
            output::ErrorKind::Encode => Kind::Other,
        };
        AppError {
            kind,
            message: e.message,
            source: e.source,
        }
    }
}

/// What a refusal to load needs. With the capabilities all there, it is the locked-memory
/// limit: kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK, which only root or
/// CAP_SYS_RESOURCE may raise (the loader tries), and a service's default is 64 KiB or 8 MiB.
fn permission_hint(caps: u64, memlock: Option<u64>) -> String {
    match memlock {
        Some(limit) if missing_caps(caps).is_empty() => format!(
            "the locked-memory limit ({} KiB) is too small for the BPF maps, which kernels \
             before 5.11 count against it: raise it (`ulimit -l unlimited`, or \
             `LimitMEMLOCK=infinity` in a systemd unit) or add CAP_SYS_RESOURCE",
            limit / 1024
        ),
        _ => PRIVILEGE.to_string(),
    }
}

/// The OS error at the bottom of an error's sources.
fn os_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a std::io::Error> {
    let mut cur = Some(e);
    // Bounded: error chains are a few links deep.
    for _ in 0..16 {
        let c = cur?;
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            return Some(io);
        }
        cur = c.source();
    }
    None
}

/// What a refused perf event needs. Debian's and Ubuntu's kernels add level 3 to
/// `kernel.perf_event_paranoid`, their default, at which only CAP_SYS_ADMIN opens perf events
/// (CAP_PERFMON does not).
fn perf_hint(caps: u64, paranoid: Option<i64>) -> String {
    match paranoid {
        Some(p) if p > 2 && caps & (1u64 << CAP_SYS_ADMIN) == 0 => format!(
            "kernel.perf_event_paranoid is {p}, at which this kernel opens perf events for \
             CAP_SYS_ADMIN only (Debian's and Ubuntu's default): set it to 2 (`sysctl \
             kernel.perf_event_paranoid=2`; CAP_PERFMON is still needed) or run as root"
        ),
        _ => PRIVILEGE.to_string(),
    }
}

fn perf_paranoid() -> Option<i64> {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// This process's locked-memory limit in bytes; `None` when unlimited.
fn memlock_limit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct it is given, which lives for the call.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } == 0;
    (ok && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// Effective capabilities of this process.
fn cap_eff() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

const CAP_DAC_READ_SEARCH: u32 = 2;
const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_SYSLOG: u32 = 34;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// The capabilities tachyon-bpf needs instead of root, and what each is for (docs/permissions.md: "Least
/// privilege"). CAP_SYS_ADMIN stands in for CAP_BPF and CAP_PERFMON, as the kernel allows.
const NEEDED: [(u32, &str, bool); 5] = [
    (CAP_BPF, "CAP_BPF", true),
    (CAP_PERFMON, "CAP_PERFMON", true),
    (CAP_SYS_PTRACE, "CAP_SYS_PTRACE", false),
    (CAP_DAC_READ_SEARCH, "CAP_DAC_READ_SEARCH", false),
    (CAP_SYSLOG, "CAP_SYSLOG", false),
];

/// The capabilities of `NEEDED` missing from `caps` (a CapEff mask).
fn missing_caps(caps: u64) -> Vec<&'static str> {
    let has = |c: u32| caps & (1u64 << c) != 0;
    NEEDED
        .iter()
        .filter(|(c, _, admin_ok)| !(has(*c) || (*admin_ok && has(CAP_SYS_ADMIN))))
        .map(|(_, name, _)| *name)
        .collect()
}

/// Privileges and kernel BTF, checked before anything is loaded.
pub fn check_environment() -> Result<(), AppError> {
    let missing = missing_caps(cap_eff());
    if !missing.is_empty() {
        return Err(AppError::new(
            Kind::Permission,
            format!(
                "tachyon-bpf needs root, or the capabilities CAP_BPF, CAP_PERFMON, \
                 CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH and CAP_SYSLOG; missing: {}",
                missing.join(", ")
            ),
        ));
    }
    if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Err(AppError::new(
            Kind::Kernel,
            "this kernel has no BTF (/sys/kernel/btf/vmlinux is missing): tachyon-bpf needs \
             CONFIG_DEBUG_INFO_BTF=y",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An output error's cause stays reachable through the run's error, for `-v`'s chain.
    #[test]
    fn causes_are_kept_to_the_exit_message() {
        let io = std::io::Error::new(std::io::ErrorKind::StorageFull, "no space left");
        let e = output::Error::caused(output::ErrorKind::Output, "writing p.json", io);
        let app: AppError = e.into();
        assert_eq!(app.code(), 6);
        assert_eq!(app.to_string(), "writing p.json");
        assert_eq!(app.causes(), ["no space left"]);
        let encode = output::Error::encode("pprof", std::io::Error::other("broken pipe"));
        assert_eq!(encode.to_string(), "pprof: broken pipe");
        assert!(std::error::Error::source(&encode).is_some());
    }

    #[test]
    fn capability_check() {
        assert!(missing_caps(u64::MAX).is_empty());
        assert_eq!(missing_caps(0).len(), 5);
        // CAP_SYS_ADMIN stands in for CAP_BPF and CAP_PERFMON, not for the others.
        let admin = 1u64 << CAP_SYS_ADMIN;
        assert_eq!(
            missing_caps(admin),
            ["CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH", "CAP_SYSLOG"]
        );
    }

    #[test]
    fn a_refusal_with_every_capability_names_the_locked_memory_limit() {
        let all = u64::MAX;
        assert!(permission_hint(all, Some(65536)).contains("(64 KiB)"));
        assert!(permission_hint(all, Some(65536)).contains("LimitMEMLOCK=infinity"));
        assert_eq!(permission_hint(all, None), PRIVILEGE);
        assert_eq!(permission_hint(0, Some(65536)), PRIVILEGE);
    }

    #[test]
    fn a_refused_perf_event_at_paranoid_3_says_what_to_set() {
        let perfmon_only = 1u64 << CAP_PERFMON;
        assert!(perf_hint(perfmon_only, Some(3)).contains("kernel.perf_event_paranoid=2"));
        assert_eq!(perf_hint(perfmon_only, Some(2)), PRIVILEGE);
        assert_eq!(perf_hint(1u64 << CAP_SYS_ADMIN, Some(3)), PRIVILEGE);
        assert_eq!(perf_hint(perfmon_only, None), PRIVILEGE);
    }

    #[test]
    fn exit_code_follows_the_kind_not_the_text() {
        let e: AppError = CaptureError::Load {
            message: "Operation not permitted".into(),
            permission: false,
        }
        .into();
        assert_eq!(e.code(), 4);
        let e: AppError = CaptureError::Load {
            message: "map SAMPLES".into(),
            permission: true,
        }
        .into();
        assert_eq!((e.code(), e.kind), (3, Kind::Permission));
    }
}
