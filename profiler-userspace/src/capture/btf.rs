//! Struct member offsets from the kernel's BTF (`/sys/kernel/btf/vmlinux`).
//!
//! The BPF programs read `pid`, `tgid` and `flags` of a `task_struct` they are handed (the task
//! switching in, a forked child), and those offsets change with the kernel build. Rust BPF has no
//! CO-RE relocations for such reads, so userspace looks the offsets up and passes them in the
//! config. Hand-written because aya-obj keeps BTF members crate-private and the one standalone
//! BTF crate is LGPL; only struct members are needed, which is a short walk over the type section.

use std::collections::HashMap;

const BTF_MAGIC: u16 = 0xeb9f;
const KIND_PTR: u32 = 2;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC_PROTO: u32 = 13;

#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("reading /sys/kernel/btf/vmlinux: {0}")]
    Read(#[source] std::io::Error),
    #[error("kernel BTF: {0}")]
    Format(&'static str),
    #[error("kernel BTF has no struct {0}")]
    NoStruct(String),
    #[error("kernel BTF: struct {0} has no member {1}")]
    NoMember(String, String),
    #[error("kernel BTF has no tracepoint {0}")]
    NoTracepoint(&'static str),
}

/// One parsed type section: the offset of every type record, by type id (id 0 is `void`).
pub struct Btf<'a> {
    data: &'a [u8],
    strings: usize,
    str_len: usize,
    /// Offset of type `id` at index `id - 1`.
    types: Vec<usize>,
}

/// A type record's common header.
#[derive(Clone, Copy)]
struct Type {
    name_off: u32,
    kind: u32,
    vlen: usize,
    kflag: bool,
    /// `size` or `type`, by kind.
    size_type: u32,
    body: usize,
}

fn u32_at(data: &[u8], o: usize) -> Option<u32> {
    data.get(o..o.checked_add(4)?)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
}

impl<'a> Btf<'a> {
    pub fn parse(data: &'a [u8]) -> Result<Btf<'a>, BtfError> {
        let u16_at = |o: usize| data.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
        let u32_at = |o: usize| u32_at(data, o);
        if u16_at(0) != Some(BTF_MAGIC) {
            return Err(BtfError::Format("bad magic (not little-endian BTF)"));
        }
        let hdr_len = u32_at(4).ok_or(BtfError::Format("short header"))? as usize;
        let type_off = u32_at(8).ok_or(BtfError::Format("short header"))? as usize;
        let type_len = u32_at(12).ok_or(BtfError::Format("short header"))? as usize;
        let str_off = u32_at(16).ok_or(BtfError::Format("short header"))? as usize;
        let str_len = u32_at(20).ok_or(BtfError::Format("short header"))? as usize;
        let start = hdr_len
            .checked_add(type_off)
            .filter(|&t| t.checked_add(type_len).is_some_and(|e| e <= data.len()))
            .ok_or(BtfError::Format("type section out of bounds"))?;
        let strings = hdr_len
            .checked_add(str_off)
            .filter(|&s| s.checked_add(str_len).is_some_and(|e| e <= data.len()))
            .ok_or(BtfError::Format("string section out of bounds"))?;
        let mut types = Vec::new();
        let mut p = start;
        let end = start + type_len;
        while p + 12 <= end {
            let info = u32_at(p + 4).expect("bounded");
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            // Bytes of kind-specific data after the 12-byte common header.
            let extra = match kind {
                1 | 14 | 17 => 4,             // int, var, decl_tag
                3 => 12,                      // array
                4 | 5 | 15 | 19 => 12 * vlen, // struct, union, datasec, enum64
                6 | 13 => 8 * vlen,           // enum, func_proto
                _ => 0,
            };
            types.push(p);
            p += 12 + extra;
        }
        if p > end {
            return Err(BtfError::Format("truncated type"));
        }
        Ok(Btf {
            data,
            strings,
            str_len,
            types,
        })
    }

    fn name(&self, off: u32) -> &'a [u8] {
        let start = self.strings + off as usize;
        let end_max = self.strings + self.str_len;
        if start >= end_max {
            return b"";
        }
        let rest = &self.data[start..end_max];
        &rest[..rest.iter().position(|&b| b == 0).unwrap_or(rest.len())]
    }

    fn ty(&self, id: u32) -> Option<Type> {
        let p = *self.types.get((id as usize).checked_sub(1)?)?;
        let info = u32_at(self.data, p + 4)?;
        Some(Type {
            name_off: u32_at(self.data, p)?,
            kind: (info >> 24) & 0x1f,
            vlen: (info & 0xffff) as usize,
            kflag: info >> 31 != 0,
            size_type: u32_at(self.data, p + 8)?,
            body: p + 12,
        })
    }

    /// Member `i` of struct or union `t`: its name, type id and byte offset (`None` when the
    /// data ends first).
    fn member(&self, t: &Type, i: usize) -> Option<(&'a [u8], u32, u32)> {
        let m = t.body + 12 * i;
        let bits = u32_at(self.data, m + 8)?;
        let bits = if t.kflag { bits & 0x00ff_ffff } else { bits };
        Some((
            self.name(u32_at(self.data, m)?),
            u32_at(self.data, m + 4)?,
            bits / 8,
        ))
    }

    /// The first type of `kind` named `name`.
    fn find(&self, kind: u32, name: &str) -> Option<Type> {
        (1..=self.types.len() as u32)
            .filter_map(|id| self.ty(id))
            .find(|t| t.kind == kind && self.name(t.name_off) == name.as_bytes())
    }

    /// The byte offset of a member reached through nested members, as `task_struct` then
    /// `thread` then `uw` then `tp_value` (anonymous structs included), or `None`.
    pub fn member_path_offset(&self, strukt: &str, path: &[&str]) -> Option<u32> {
        let mut t = self.find(KIND_STRUCT, strukt)?;
        let mut at = 0u32;
        for (i, name) in path.iter().enumerate() {
            let (member_type, offset) = (0..t.vlen)
                .filter_map(|m| self.member(&t, m))
                .find(|m| m.0 == name.as_bytes())
                .map(|(_, ty, off)| (ty, off))?;
            at = at.checked_add(offset)?;
            if i + 1 < path.len() {
                // Through typedefs and qualifiers (volatile, const, restrict) to the struct or
                // union, a bounded number of steps.
                let mut id = member_type;
                let mut next = None;
                for _ in 0..8 {
                    let ty = self.ty(id)?;
                    match ty.kind {
                        KIND_STRUCT | KIND_UNION => {
                            next = Some(ty);
                            break;
                        }
                        KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT => {
                            id = ty.size_type
                        }
                        _ => return None,
                    }
                }
                t = next?;
            }
        }
        Some(at)
    }

    /// The size in bytes of a struct.
    pub fn struct_size(&self, strukt: &str) -> Result<u32, BtfError> {
        self.find(KIND_STRUCT, strukt)
            .map(|t| t.size_type)
            .ok_or_else(|| BtfError::NoStruct(strukt.into()))
    }

    /// Byte offsets of the named members of one struct.
    pub fn struct_offsets(
        &self,
        strukt: &str,
        members: &[&str],
    ) -> Result<HashMap<String, u32>, BtfError> {
        let t = self
            .find(KIND_STRUCT, strukt)
            .ok_or_else(|| BtfError::NoStruct(strukt.into()))?;
        let mut out = HashMap::new();
        for i in 0..t.vlen {
            let (mname, _, offset) = self
                .member(&t, i)
                .ok_or(BtfError::Format("truncated struct"))?;
            let mname = String::from_utf8_lossy(mname).into_owned();
            if members.contains(&mname.as_str()) {
                out.insert(mname, offset);
            }
        }
        for m in members {
            if !out.contains_key(*m) {
                return Err(BtfError::NoMember(strukt.into(), (*m).into()));
            }
        }
        Ok(out)
    }

    /// The offset of the first of `names` that the struct has.
    pub fn member_offset_any(&self, strukt: &str, names: &[&str]) -> Result<u32, BtfError> {
        for n in names {
            if let Ok(m) = self.struct_offsets(strukt, &[n]) {
                return Ok(m[*n]);
            }
        }
        Err(BtfError::NoMember(strukt.into(), names.join(" or ")))
    }

    /// Whether `enum name` has the enumerator `value` (how a kernel says which BPF helpers it
    /// knows: `enum bpf_func_id`).
    pub fn has_enumerator(&self, name: &str, value: &str) -> bool {
        // Every enum of that name: a forward declaration is an enum without values.
        (1..=self.types.len() as u32)
            .filter_map(|id| self.ty(id))
            .filter(|t| t.kind == KIND_ENUM && self.name(t.name_off) == name.as_bytes())
            .any(|t| {
                (0..t.vlen).any(|i| {
                    u32_at(self.data, t.body + 8 * i)
                        .is_some_and(|n| self.name(n) == value.as_bytes())
                })
            })
    }

    /// A BTF blob that gives each raw tracepoint of `tracepoints` (`btf_trace_NAME`, a typedef)
    /// the type id it has in this one, and holds nothing else of use: placeholders (pointers to
    /// `void`) take every other id up to the last one named.
    ///
    /// aya's `BtfTracePoint::load` asks for a whole parsed `aya::Btf` only to look up that
    /// typedef's id. Its parse of the kernel's BTF (130,000 types, members and all) took a sixth
    /// of the profiler's start-up, and the loader makes one of its own anyway; this blob is
    /// parsed in a small fraction of that. `None` when a tracepoint is missing.
    pub fn tracepoint_btf(&self, tracepoints: &[&str]) -> Option<Vec<u8>> {
        let names: Vec<String> = tracepoints
            .iter()
            .map(|tp| format!("btf_trace_{tp}"))
            .collect();
        let mut ids = vec![0u32; names.len()];
        for (i, &p) in self.types.iter().enumerate() {
            let info = u32_at(self.data, p + 4)?;
            if (info >> 24) & 0x1f != KIND_TYPEDEF {
                continue;
            }
            let name = self.name(u32_at(self.data, p)?);
            if let Some(k) = names.iter().position(|n| n.as_bytes() == name) {
                if ids[k] == 0 {
                    ids[k] = i as u32 + 1;
                }
            }
        }
        if ids.contains(&0) {
            return None;
        }
        let last = *ids.iter().max()?;
        let mut strings = vec![0u8];
        let mut name_off = Vec::new();
        for n in &names {
            name_off.push(strings.len() as u32);
            strings.extend_from_slice(n.as_bytes());
            strings.push(0);
        }
        let mut types = Vec::with_capacity(last as usize * 12);
        for id in 1..=last {
            let (name, kind) = match ids.iter().position(|&t| t == id) {
                Some(k) => (name_off[k], KIND_TYPEDEF),
                None => (0, KIND_PTR),
            };
            for word in [name, kind << 24, 0] {
                types.extend_from_slice(&word.to_le_bytes());
            }
        }
        let mut blob = Vec::with_capacity(24 + types.len() + strings.len());
        blob.extend_from_slice(&BTF_MAGIC.to_le_bytes());
        blob.extend_from_slice(&[1, 0]); // version 1, no flags
        for word in [
            24,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            blob.extend_from_slice(&word.to_le_bytes());
        }
        blob.extend_from_slice(&types);
        blob.extend_from_slice(&strings);
        Some(blob)
    }

    /// How many arguments a raw tracepoint passes (`typedef void (*btf_trace_NAME)(void *,
    /// args...)`), not counting the leading context pointer; `None` when the kernel has no such
    /// tracepoint. (The prototype's parameters carry no names in the kernel's BTF.)
    pub fn tracepoint_args(&self, tp: &str) -> Option<usize> {
        let td = self.find(KIND_TYPEDEF, &format!("btf_trace_{tp}"))?;
        let ptr = self.ty(td.size_type).filter(|t| t.kind == KIND_PTR)?;
        let proto = self
            .ty(ptr.size_type)
            .filter(|t| t.kind == KIND_FUNC_PROTO)?;
        Some(proto.vlen.saturating_sub(1))
    }
}

/// Byte offsets of the named members of one struct, as BTF describes it.
pub fn struct_offsets(
    data: &[u8],
    strukt: &str,
    members: &[&str],
) -> Result<HashMap<String, u32>, BtfError> {
    Btf::parse(data)?.struct_offsets(strukt, members)
}

/// Where `task_struct` keeps the user thread pointer (`TPIDR_EL0` on arm64).
#[cfg(not(target_arch = "aarch64"))]
const THREAD_POINTER: &[&str] = &["thread", "fsbase"];
#[cfg(target_arch = "aarch64")]
const THREAD_POINTER: &[&str] = &["thread", "uw", "tp_value"];

/// What the running kernel offers the BPF programs, read from its BTF once at start-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelInfo {
    /// `uname -r`.
    pub release: String,
    /// `task_struct` offsets.
    pub task_pid: u32,
    pub task_tgid: u32,
    pub task_flags: u32,
    pub task_state: u32,
    pub task_stack: u32,
    pub task_signal: u32,
    pub signal_live: u32,
    /// Offset in `task_struct` of the user thread pointer (x86_64's `thread.fsbase`, arm64's
    /// `thread.uw.tp_value`), or 0.
    pub task_fsbase: u32,
    /// `sizeof(struct pt_regs)`: the user registers are that far below a kernel stack's top.
    pub pt_regs_size: u32,
    /// Offsets of `se.sum_exec_runtime` and `se.prev_sum_exec_runtime` in `task_struct`.
    pub task_sum_exec: u32,
    pub task_prev_sum_exec: u32,
    /// Offsets of `mm` in `task_struct` and of `exec_vm` in `mm_struct` (inside its anonymous
    /// struct), or 0 for both when the kernel's layout differs (library loads then go unwatched).
    pub task_mm: u32,
    pub mm_exec_vm: u32,
    /// Offset of `start_stack` in `mm_struct` (inside its anonymous struct), or 0.
    pub mm_start_stack: u32,
    /// BPF helpers the kernel knows.
    pub has_bpf_loop: bool,
    pub has_task_pt_regs: bool,
    pub has_current_task_btf: bool,
    /// `sched_switch` passes `prev_state` (5.18+).
    pub switch_has_prev_state: bool,
    /// BPF ring buffers (5.8+), which nothing can replace.
    pub has_ringbuf: bool,
    /// The `sched_exit_tp` tracepoint (6.16+): the end of `__schedule`, in the thread coming
    /// back on the CPU. Elsewhere a kprobe on `finish_task_switch` does its part.
    pub has_sched_exit_tp: bool,
    /// The modern program set is loaded (see the BPF crate's documentation): the kernel has
    /// every one of its features, and the compat set was not asked for.
    pub modern: bool,
}

impl KernelInfo {
    /// The program set loaded, in words, for the summary and `meta.tachyon`.
    pub fn variant(&self) -> &'static str {
        if self.modern {
            "modern (bpf_loop, bpf_task_pt_regs, sched_switch prev_state)"
        } else {
            "compat (bounded frame loop, registers from the kernel stack, task state from the task)"
        }
    }

    /// The program set's short name, as profiles record it.
    pub fn programs(&self) -> &'static str {
        if self.modern {
            "modern"
        } else {
            "compat"
        }
    }

    pub fn from_btf(btf: &Btf, release: String) -> Result<KernelInfo, BtfError> {
        let task =
            btf.struct_offsets("task_struct", &["pid", "tgid", "flags", "stack", "signal"])?;
        let task_state = btf.member_offset_any("task_struct", &["__state", "state"])?;
        let signal_live = btf.struct_offsets("signal_struct", &["live"])?["live"];
        // The thread pointer; 0 (no lookup of new threads) where the layout differs.
        let task_fsbase = btf
            .member_path_offset("task_struct", THREAD_POINTER)
            .unwrap_or(0);
        let se = btf.struct_offsets("task_struct", &["se"])?["se"];
        let sums = btf.struct_offsets(
            "sched_entity",
            &["sum_exec_runtime", "prev_sum_exec_runtime"],
        )?;
        let exec_vm = btf
            .member_path_offset("task_struct", &["mm"])
            .zip(
                btf.member_path_offset("mm_struct", &["", "exec_vm"])
                    .or_else(|| btf.member_path_offset("mm_struct", &["exec_vm"])),
            )
            .unwrap_or((0, 0));
        let mm_start_stack = if exec_vm.0 == 0 {
            0
        } else {
            btf.member_path_offset("mm_struct", &["", "start_stack"])
                .or_else(|| btf.member_path_offset("mm_struct", &["start_stack"]))
                .unwrap_or(0)
        };
        let switch = btf
            .tracepoint_args("sched_switch")
            .ok_or(BtfError::NoTracepoint("sched_switch"))?;
        let has = |f: &str| btf.has_enumerator("bpf_func_id", f);
        let has_bpf_loop = has("BPF_FUNC_loop");
        let has_task_pt_regs = has("BPF_FUNC_task_pt_regs");
        let has_current_task_btf = has("BPF_FUNC_get_current_task_btf");
        // (preempt, prev, next) before 5.18; prev_state was added as the fourth.
        let switch_has_prev_state = switch >= 4;
        Ok(KernelInfo {
            release,
            task_pid: task["pid"],
            task_tgid: task["tgid"],
            task_flags: task["flags"],
            task_state,
            task_stack: task["stack"],
            task_signal: task["signal"],
            signal_live,
            task_fsbase,
            pt_regs_size: btf.struct_size("pt_regs")?,
            task_sum_exec: se + sums["sum_exec_runtime"],
            task_prev_sum_exec: se + sums["prev_sum_exec_runtime"],
            task_mm: exec_vm.0,
            mm_exec_vm: exec_vm.1,
            mm_start_stack,
            has_bpf_loop,
            has_task_pt_regs,
            has_current_task_btf,
            switch_has_prev_state,
            has_ringbuf: has("BPF_FUNC_ringbuf_output"),
            has_sched_exit_tp: btf.tracepoint_args(SCHED_EXIT_TP).is_some(),
            modern: has_bpf_loop
                && has_task_pt_regs
                && has_current_task_btf
                && switch_has_prev_state,
        })
    }

    /// The running kernel, from `/sys/kernel/btf/vmlinux`.
    pub fn probe() -> Result<KernelInfo, BtfError> {
        KernelInfo::probe_with_tracepoints(&[]).map(|(info, _)| info)
    }

    /// `probe`, and a BTF blob for loading the raw `tracepoints` (`Btf::tracepoint_btf`; empty
    /// when none is asked for).
    pub fn probe_with_tracepoints(
        tracepoints: &[&'static str],
    ) -> Result<(KernelInfo, Vec<u8>), BtfError> {
        let data = std::fs::read("/sys/kernel/btf/vmlinux").map_err(BtfError::Read)?;
        let btf = Btf::parse(&data)?;
        let info = KernelInfo::from_btf(&btf, kernel_release())?;
        if tracepoints.is_empty() {
            return Ok((info, Vec::new()));
        }
        // `sched_exit_tp` too, where the kernel has it.
        let mut tracepoints = tracepoints.to_vec();
        if info.has_sched_exit_tp {
            tracepoints.push(SCHED_EXIT_TP);
        }
        let tracepoints = &tracepoints[..];
        let blob = btf.tracepoint_btf(tracepoints).ok_or_else(|| {
            let missing = tracepoints
                .iter()
                .find(|tp| btf.tracepoint_btf(&[tp]).is_none())
                .copied()
                .unwrap_or("?");
            BtfError::NoTracepoint(missing)
        })?;
        Ok((info, blob))
    }
}

/// The tracepoint at the end of `__schedule` (6.16+).
pub const SCHED_EXIT_TP: &str = "sched_exit_tp";

/// The running kernel's release (`uname -r`).
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob with one struct `s { a at byte 0; b at byte 8 }` and a leading int type.
    fn blob() -> Vec<u8> {
        let strings = b"\0s\0a\0b\0int\0";
        let mut types = Vec::new();
        // int "int": name 7, kind 1, size 4, then 4 bytes of encoding.
        for v in [7u32, 1 << 24, 4, 32] {
            types.extend_from_slice(&v.to_le_bytes());
        }
        // struct "s": name 1, kind 4, vlen 2, size 16; members (name, type, bit offset).
        for v in [1u32, (4 << 24) | 2, 16, 3, 1, 0, 5, 1, 64] {
            types.extend_from_slice(&v.to_le_bytes());
        }
        let mut out = Vec::new();
        out.extend_from_slice(&BTF_MAGIC.to_le_bytes());
        out.extend_from_slice(&[1, 0]);
        for v in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&types);
        out.extend_from_slice(strings);
        out
    }

    #[test]
    fn the_tracepoint_blob_gives_aya_the_kernels_ids() {
        use aya::{Btf as AyaBtf, Endianness};
        let data = std::fs::read("/sys/kernel/btf/vmlinux").unwrap();
        let full = AyaBtf::parse(&data, Endianness::default()).unwrap();
        let tps = ["sched_switch", "sched_process_exit", "sched_process_fork"];
        let blob = Btf::parse(&data).unwrap().tracepoint_btf(&tps).unwrap();
        let small = AyaBtf::parse(&blob, Endianness::default()).unwrap();
        for tp in tps {
            let name = format!("btf_trace_{tp}");
            let id = |b: &AyaBtf| b.id_by_type_name_kind(&name, aya_obj::btf::BtfKind::Typedef);
            let want = id(&full).unwrap();
            assert!(want > 0);
            assert_eq!(id(&small).unwrap(), want, "{tp}");
        }
        // A blob a fraction of the kernel's, and no tracepoint the kernel lacks.
        assert!(
            blob.len() < data.len() / 2,
            "{} of {}",
            blob.len(),
            data.len()
        );
        assert!(Btf::parse(&data)
            .unwrap()
            .tracepoint_btf(&["sched_switch", "no_such_tracepoint"])
            .is_none());
    }

    #[test]
    fn finds_members_and_reports_missing_ones() {
        let b = blob();
        let m = struct_offsets(&b, "s", &["a", "b"]).unwrap();
        assert_eq!((m["a"], m["b"]), (0, 8));
        assert!(matches!(
            struct_offsets(&b, "s", &["c"]),
            Err(BtfError::NoMember(s, c)) if s == "s" && c == "c"
        ));
        assert!(matches!(
            struct_offsets(&b, "t", &["a"]),
            Err(BtfError::NoStruct(t)) if t == "t"
        ));
        assert!(struct_offsets(&b[..30], "s", &["a"]).is_err());
        assert!(struct_offsets(b"garbage", "s", &["a"]).is_err());
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn nested_members_are_followed_through_named_and_anonymous_structs() {
        let data = std::fs::read("/sys/kernel/btf/vmlinux").unwrap();
        let btf = Btf::parse(&data).unwrap();
        let thread = btf.struct_offsets("task_struct", &["thread"]).unwrap()["thread"];
        let fsbase = btf.struct_offsets("thread_struct", &["fsbase"]).unwrap()["fsbase"];
        assert_eq!(
            btf.member_path_offset("task_struct", &["thread", "fsbase"]),
            Some(thread + fsbase)
        );
        // `se.sum_exec_runtime` as the scheduler accounting reads it.
        let k = KernelInfo::probe().unwrap();
        assert_eq!(
            btf.member_path_offset("task_struct", &["se", "sum_exec_runtime"]),
            Some(k.task_sum_exec)
        );
        // x86_64's `thread_struct` has no arm64 `uw`; a missing step is `None`.
        assert_eq!(
            btf.member_path_offset("task_struct", &["thread", "uw", "tp_value"]),
            None
        );
        assert_eq!(btf.member_path_offset("no_such_struct", &["a"]), None);
    }

    #[test]
    fn running_kernel_is_probed() {
        let k = KernelInfo::probe().unwrap();
        assert_eq!(k.task_tgid, k.task_pid + 4);
        assert!(k.task_flags < k.task_pid);
        assert!(
            k.task_prev_sum_exec > k.task_sum_exec && k.task_prev_sum_exec <= k.task_sum_exec + 16
        );
        // `start_stack` follows `exec_vm` in `mm_struct` (the counters, then the bounds of the
        // code, data, heap and stack).
        assert!(k.mm_exec_vm != 0 && k.mm_start_stack > k.mm_exec_vm);
        assert!(k.mm_start_stack < k.mm_exec_vm + 256);
        assert!(
            k.signal_live < 64,
            "live is near the start of signal_struct"
        );
        // This machine's kernel (6.18) has every feature of the modern set.
        assert!(k.has_bpf_loop && k.has_task_pt_regs && k.switch_has_prev_state);
        assert!(k.modern);
        let btf_data = std::fs::read("/sys/kernel/btf/vmlinux").unwrap();
        let btf = Btf::parse(&btf_data).unwrap();
        assert_eq!(btf.tracepoint_args("sched_switch"), Some(4));
        assert_eq!(btf.tracepoint_args("sched_process_fork"), Some(2));
        assert!(!btf.has_enumerator("bpf_func_id", "BPF_FUNC_no_such_helper"));
        assert!(btf.tracepoint_args("no_such_tracepoint").is_none());
    }
}
