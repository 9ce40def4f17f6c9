//! Finding a process's CPython runtime: its version and layout, the addresses user space and
//! the BPF frame walk read, and whether it is ready to be walked.

use super::asyncio::state::AsyncState;
use super::code_cache::CodeCache;
use super::layout::{self, Layout};
use super::remote::{le_u64, Remote};
use super::thread_states::ThreadMap;
use super::NotPython;
use crate::process::Process;
use profiler_common::PyProcConfig;

/// The target's CPython runtime as user space reads it: the reader of its memory, its layout,
/// and the addresses of the objects what is read is checked against.
#[derive(Clone)]
pub struct Runtime {
    pub remote: Remote,
    pub layout: Layout,
    /// `_PyRuntime`.
    pub addr: u64,
    /// `_Py_NoneStruct`.
    pub none_addr: u64,
    /// `PyCode_Type` (0 if unknown): a code object read from the target must be one.
    pub code_type: u64,
    /// Address of `PyUnicode_Type` (0 if unknown): a string read from the target must be one.
    pub str_type: u64,
    /// Address of `PyLong_Type` (0 if unknown): a task not named yet is named by its number.
    pub long_type: u64,
}

/// A Python process: its runtime, what the BPF side is configured with, and what is known of
/// its code objects, threads and asyncio.
pub struct PyProcess {
    pub pid: u32,
    /// Its script and version, as processes are labelled.
    pub label: String,
    /// Its script's file name or `-m` module (the command name for `-c` or a bare interpreter):
    /// its service's name when nothing else names one.
    pub program: String,
    pub version: String,
    pub rt: Runtime,
    pub config: PyProcConfig,
    /// Whether the runtime had its interpreter (and GIL) when last looked at. Until then the
    /// BPF side finds the interpreter itself (`PyProcConfig::interp_head`) and no GIL is read.
    pub ready: bool,
    pub cache: CodeCache,
    pub threads: ThreadMap,
    pub asyncio: AsyncState,
    /// A forked child that was gone before it was read, named from its parent (`rt` reads the
    /// parent): its own runtime, whose reads fail, for code that is not the parent's too. See
    /// `PythonRegistry::add_gone_fork`. Nothing is read of its threads or tasks.
    pub gone_fork: Option<Box<Runtime>>,
}

fn parse_minor_from_path(path: &str) -> Option<u32> {
    let file = path.rsplit('/').next()?;
    let rest = file
        .strip_prefix("libpython3.")
        .or_else(|| file.strip_prefix("python3."))?;
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// A name for the process that shows the script: `app.py`, `-m module` or `-c`.
fn script_label(cmdline: &[String], fallback: &str) -> String {
    let mut it = cmdline.iter().skip(1);
    while let Some(a) = it.next() {
        if a == "-m" {
            return format!("-m {}", it.next().map(String::as_str).unwrap_or(""));
        }
        if a == "-c" {
            return "-c".into();
        }
        if a.starts_with('-') {
            if matches!(a.as_str(), "-W" | "-X" | "--check-hash-based-pycs") {
                it.next();
            }
            continue;
        }
        return a.rsplit('/').next().unwrap_or(a).to_string();
    }
    fallback.to_string()
}

/// What a Python process runs, as a service would be named after it: the script's file name,
/// the `-m` module, or the command name (`-c`, a bare interpreter).
fn program_name(cmdline: &[String], comm: &str) -> String {
    let label = script_label(cmdline, comm);
    match label.strip_prefix("-m ") {
        Some(module) if !module.is_empty() => module.to_string(),
        _ if label == "-c" || label.starts_with('-') => comm.to_string(),
        _ => label,
    }
}

/// arm64: how far below the thread pointer glibc keeps a thread's descriptor, which is what
/// `pthread_self` returns (`TLS_DTV_AT_TP`: the descriptor sits just below the TCB the thread
/// pointer addresses). glibc exports its size for debuggers as `_thread_db_sizeof_pthread`; it
/// is read from the process's own C library, whatever its version. `None` without glibc.
fn thread_descriptor_size(proc: &Process, remote: &Remote) -> Option<u32> {
    proc.modules.iter().find_map(|m| {
        let file_name = m.path.rsplit('/').next().unwrap_or("");
        if !file_name.starts_with("libc.so") && !file_name.starts_with("libc-") {
            return None;
        }
        let elf = m.elf.as_ref()?;
        let at = *elf
            .find_symbols(&["_thread_db_sizeof_pthread"])
            .get("_thread_db_sizeof_pthread")?;
        // A descriptor is some hundreds of bytes to a few KiB: anything else is not glibc's.
        remote
            .u32(at.wrapping_add(m.bias))
            .filter(|&n| (256..=16384).contains(&n))
    })
}

impl PyProcess {
    /// Finds the CPython runtime of `proc` (its mappings must be loaded).
    pub fn discover(proc: &Process) -> Result<PyProcess, NotPython> {
        let remote = Remote { pid: proc.pid };
        let wanted = [
            "_PyRuntime",
            "Py_Version",
            "_Py_NoneStruct",
            "PyCode_Type",
            "PyUnicode_Type",
            "PyLong_Type",
        ];
        for m in &proc.modules {
            let Some(elf) = &m.elf else { continue };
            let file_name = m.path.rsplit('/').next().unwrap_or("");
            if !file_name.contains("python") {
                continue;
            }
            let syms = elf.find_symbols(&wanted);
            let runtime_svma = syms
                .get("_PyRuntime")
                .copied()
                .or_else(|| elf.section_address(".PyRuntime"));
            let Some(runtime_svma) = runtime_svma else {
                continue;
            };
            let runtime = runtime_svma.wrapping_add(m.bias);
            let addr = |n: &str| syms.get(n).map(|a| a.wrapping_add(m.bias)).unwrap_or(0);

            let Some((version, layout)) =
                version_and_layout(&remote, &m.path, runtime, addr("Py_Version"))?
            else {
                continue;
            };
            // A runtime still starting (no interpreter or GIL yet) is profiled already: the BPF
            // side reads the interpreter from the runtime until it is looked at again.
            let interp = remote.u64(runtime + layout.interp_head).unwrap_or(0);
            let gil = match interp {
                0 => Err(NotPython::NotReady),
                _ => gil_words(&layout, runtime, interp, |a| remote.u64(a)),
            };
            let ready = gil.is_ok();
            let gil = match gil {
                Ok(g) => g,
                Err(NotPython::NotReady) => None,
                Err(e) => return Err(e),
            };
            let gc = layout.gc_collecting_runtime.map(|o| runtime + o).or(layout
                .gc_collecting_interp
                .filter(|_| interp != 0)
                .map(|o| interp + o));
            let mut config = layout.proc_config(gil, gc, addr("_Py_NoneStruct"), interp);
            if cfg!(target_arch = "aarch64") {
                config.thread_id_below_tp =
                    thread_descriptor_size(proc, &remote).unwrap_or(profiler_common::NO_OFFSET);
            }
            if !ready {
                config.interp = 0;
                config.interp_head = runtime + layout.interp_head;
            }
            return Ok(PyProcess {
                pid: proc.pid,
                label: format!(
                    "{} (Python {version})",
                    script_label(&proc.cmdline, &proc.comm)
                ),
                program: program_name(&proc.cmdline, &proc.comm),
                version,
                rt: Runtime {
                    remote,
                    layout,
                    addr: runtime,
                    none_addr: addr("_Py_NoneStruct"),
                    code_type: addr("PyCode_Type"),
                    str_type: addr("PyUnicode_Type"),
                    long_type: addr("PyLong_Type"),
                },
                config,
                ready,
                cache: CodeCache::default(),
                threads: ThreadMap::default(),
                asyncio: AsyncState::default(),
                gone_fork: None,
            });
        }
        Err(NotPython::NoRuntime)
    }
}

/// The version of the runtime at `runtime` (from the debug offsets on 3.13+, `Py_Version` at
/// `py_version` on 3.11+, else the file name) and its layout; `None` when not even the file
/// name says.
fn version_and_layout(
    remote: &Remote,
    path: &str,
    runtime: u64,
    py_version: u64,
) -> Result<Option<(String, Layout)>, NotPython> {
    // Version: debug offsets (3.13+), Py_Version (3.11+), the file name.
    let head = remote.read(runtime, 24);
    let mut hex = head
        .as_ref()
        .filter(|h| &h[..8] == layout::DEBUG_COOKIE)
        .and_then(|h| le_u64(h, 8));
    if hex.is_none() && py_version != 0 {
        hex = remote.u32(py_version).map(|v| v as u64);
    }
    let (major, minor, micro) = match hex {
        Some(v) => ((v >> 24) & 0xff, ((v >> 16) & 0xff) as u32, (v >> 8) & 0xff),
        None => match parse_minor_from_path(path) {
            Some(minor) => (3, minor, 0),
            None => return Ok(None),
        },
    };
    let version = if hex.is_some() {
        format!("{major}.{minor}.{micro}")
    } else {
        format!("{major}.{minor}")
    };
    if major != 3 {
        return Err(NotPython::Unsupported(format!("Python {version}")));
    }
    let Some(mut layout) = layout::builtin(minor) else {
        return Err(NotPython::Unsupported(format!("Python {version}")));
    };
    if minor >= 13 {
        match layout::apply_debug_offsets(remote, runtime, &mut layout) {
            Some(d) if d.free_threaded => {
                return Err(NotPython::Unsupported(format!(
                    "free-threaded Python {version}"
                )))
            }
            Some(_) => {}
            None => {
                return Err(NotPython::Unsupported(format!(
                    "Python {version} without debug offsets"
                )))
            }
        }
    }
    Ok(Some((version, layout)))
}

/// The addresses of the GIL's `last_holder` and `locked` words. From 3.12 the interpreter points
/// to its GIL, and that pointer is set a little after the interpreter is linked into the runtime:
/// a process caught in between is not ready yet (taking it then would leave it without GIL state
/// for the whole run).
fn gil_words(
    layout: &Layout,
    runtime: u64,
    interp: u64,
    read_u64: impl Fn(u64) -> Option<u64>,
) -> Result<Option<(u64, u64)>, NotPython> {
    if let Some(off) = layout.gil_in_runtime {
        return Ok(Some((runtime + off, runtime + off + 8)));
    }
    let Some(off) = layout.interp_gil_ptr else {
        return Ok(None);
    };
    match read_u64(interp + off) {
        Some(g) if g != 0 => Ok(Some((g + 8, g + 16))),
        _ => Err(NotPython::NotReady),
    }
}

/// Whether any mapping of the process names a python binary or libpython (a cheap pre-check).
pub fn maps_mention_python(pid: u32) -> bool {
    crate::process::maps::maps_text(pid)
        .map(|m| {
            m.lines().any(|l| {
                l.rsplit('/')
                    .next()
                    .is_some_and(super::native_names::is_interpreter_file)
            })
        })
        .unwrap_or(false)
}

/// Whether a program that has just exec'd is named like a Python interpreter, by the name it
/// was started by (its exec record's `comm`: the executable's file name, or a script's
/// interpreter's): it decides whether the process is watched closely, and the BPF side woke the
/// reader for it by the same test. Nothing is read: a host may exec hundreds of programs a
/// second. An interpreter started by another name (a link named otherwise) is found at the
/// first regular look instead, within a tick.
pub fn python_name(comm: &str) -> bool {
    comm.starts_with("python")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_show_the_script() {
        let c = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            script_label(&c(&["python3", "-u", "/srv/app.py", "x"]), "p"),
            "app.py"
        );
        assert_eq!(
            script_label(&c(&["python3", "-m", "http.server"]), "p"),
            "-m http.server"
        );
        assert_eq!(
            script_label(&c(&["python3", "-X", "dev", "a.py"]), "p"),
            "a.py"
        );
        assert_eq!(script_label(&c(&["python3"]), "p"), "p");
        assert_eq!(
            program_name(&c(&["python3", "-m", "http.server"]), "p"),
            "http.server"
        );
        assert_eq!(
            program_name(&c(&["python3", "-c", "x"]), "python3"),
            "python3"
        );
        assert_eq!(program_name(&c(&["python3", "/srv/app.py"]), "p"), "app.py");
    }

    #[test]
    fn gil_of_an_interpreter_still_starting_is_not_ready() {
        let l312 = layout::builtin(12).unwrap();
        let off = l312.interp_gil_ptr.unwrap();
        let interp = 0x7000_0000;
        let unset = gil_words(&l312, 0x1000, interp, |_| Some(0));
        assert!(matches!(unset, Err(NotPython::NotReady)));
        let unreadable = gil_words(&l312, 0x1000, interp, |_| None);
        assert!(matches!(unreadable, Err(NotPython::NotReady)));
        let set = gil_words(&l312, 0x1000, interp, |a| {
            (a == interp + off).then_some(0x5000)
        });
        assert_eq!(set.ok().flatten(), Some((0x5008, 0x5010)));
        // Up to 3.11 the GIL lives in the runtime: nothing to wait for.
        let l311 = layout::builtin(11).unwrap();
        let g = l311.gil_in_runtime.unwrap();
        let r = gil_words(&l311, 0x1000, interp, |_| None);
        assert_eq!(r.ok().flatten(), Some((0x1000 + g, 0x1000 + g + 8)));
    }

    #[test]
    fn version_from_file_names() {
        assert_eq!(
            parse_minor_from_path("/usr/lib/libpython3.11.so.1.0"),
            Some(11)
        );
        assert_eq!(parse_minor_from_path("/usr/bin/python3.9"), Some(9));
        assert_eq!(parse_minor_from_path("/usr/bin/python3"), None);
    }
}
