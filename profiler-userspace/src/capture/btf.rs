//! Struct member offsets from the kernel's BTF (`/sys/kernel/btf/vmlinux`).
//!
//! The BPF programs read `pid`, `tgid` and `flags` of a `task_struct` they are handed (the task
//! switching in, a forked child), and those offsets change with the kernel build. Rust BPF has no
//! CO-RE relocations for such reads, so userspace looks the offsets up and passes them in the
//! config. Hand-written because aya-obj keeps BTF members crate-private and the one standalone
//! BTF crate is LGPL; only struct members are needed, which is a short walk over the type section.

use std::collections::HashMap;

const BTF_MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BtfError {
    #[error("kernel BTF: {0}")]
    Format(&'static str),
    #[error("kernel BTF has no struct {0}")]
    NoStruct(String),
    #[error("kernel BTF: struct {0} has no member {1}")]
    NoMember(String, String),
}

/// Byte offsets of the named members of one struct, as BTF describes it.
pub fn struct_offsets(
    data: &[u8],
    strukt: &str,
    members: &[&str],
) -> Result<HashMap<String, u32>, BtfError> {
    let u16_at = |o: usize| data.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| {
        data.get(o..o + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    };
    if u16_at(0) != Some(BTF_MAGIC) {
        return Err(BtfError::Format("bad magic (not little-endian BTF)"));
    }
    let hdr_len = u32_at(4).ok_or(BtfError::Format("short header"))? as usize;
    let type_off = u32_at(8).ok_or(BtfError::Format("short header"))? as usize;
    let type_len = u32_at(12).ok_or(BtfError::Format("short header"))? as usize;
    let str_off = u32_at(16).ok_or(BtfError::Format("short header"))? as usize;
    let str_len = u32_at(20).ok_or(BtfError::Format("short header"))? as usize;
    let types = hdr_len
        .checked_add(type_off)
        .filter(|&t| t.checked_add(type_len).is_some_and(|e| e <= data.len()))
        .ok_or(BtfError::Format("type section out of bounds"))?;
    let strings = hdr_len
        .checked_add(str_off)
        .filter(|&s| s.checked_add(str_len).is_some_and(|e| e <= data.len()))
        .ok_or(BtfError::Format("string section out of bounds"))?;
    let name = |off: u32| -> &[u8] {
        let start = strings + off as usize;
        let end_max = strings + str_len;
        if start >= end_max {
            return b"";
        }
        let rest = &data[start..end_max];
        &rest[..rest.iter().position(|&b| b == 0).unwrap_or(rest.len())]
    };
    let mut p = types;
    let end = types + type_len;
    while p + 12 <= end {
        let name_off = u32_at(p).expect("bounded");
        let info = u32_at(p + 4).expect("bounded");
        let kind = (info >> 24) & 0x1f;
        let vlen = (info & 0xffff) as usize;
        let kflag = info >> 31 != 0;
        let body = p + 12;
        // Bytes of kind-specific data after the 12-byte common header.
        let extra = match kind {
            1 | 14 | 17 => 4,             // int, var, decl_tag
            3 => 12,                      // array
            4 | 5 | 15 | 19 => 12 * vlen, // struct, union, datasec, enum64
            6 | 13 => 8 * vlen,           // enum, func_proto
            _ => 0,
        };
        if kind == KIND_STRUCT && name(name_off) == strukt.as_bytes() {
            let mut out = HashMap::new();
            for i in 0..vlen {
                let m = body + 12 * i;
                let (Some(mname), Some(moff)) = (u32_at(m), u32_at(m + 8)) else {
                    return Err(BtfError::Format("truncated struct"));
                };
                let bits = if kflag { moff & 0x00ff_ffff } else { moff };
                let mname = String::from_utf8_lossy(name(mname)).into_owned();
                if members.contains(&mname.as_str()) {
                    out.insert(mname, bits / 8);
                }
            }
            for m in members {
                if !out.contains_key(*m) {
                    return Err(BtfError::NoMember(strukt.into(), (*m).into()));
                }
            }
            return Ok(out);
        }
        p = body + extra;
    }
    Err(BtfError::NoStruct(strukt.into()))
}

/// `task_struct` offsets of `pid`, `tgid` and `flags` on the running kernel.
pub fn task_offsets() -> Result<(u32, u32, u32), String> {
    let data = std::fs::read("/sys/kernel/btf/vmlinux")
        .map_err(|e| format!("reading /sys/kernel/btf/vmlinux: {e}"))?;
    let m = struct_offsets(&data, "task_struct", &["pid", "tgid", "flags"])
        .map_err(|e| e.to_string())?;
    Ok((m["pid"], m["tgid"], m["flags"]))
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
    fn finds_members_and_reports_missing_ones() {
        let b = blob();
        let m = struct_offsets(&b, "s", &["a", "b"]).unwrap();
        assert_eq!((m["a"], m["b"]), (0, 8));
        assert_eq!(
            struct_offsets(&b, "s", &["c"]),
            Err(BtfError::NoMember("s".into(), "c".into()))
        );
        assert_eq!(
            struct_offsets(&b, "t", &["a"]),
            Err(BtfError::NoStruct("t".into()))
        );
        assert!(struct_offsets(&b[..30], "s", &["a"]).is_err());
        assert!(struct_offsets(b"garbage", "s", &["a"]).is_err());
    }

    #[test]
    fn running_kernel_has_task_offsets() {
        let (pid, tgid, flags) = task_offsets().unwrap();
        assert_eq!(tgid, pid + 4);
        assert!(flags < pid);
    }
}
