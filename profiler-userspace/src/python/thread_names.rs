//! The names Python gives its threads (`threading.Thread.name`), read from outside.
//!
//! A thread started by `threading` runs `Thread._bootstrap(self)` as its outermost Python frame,
//! so the thread object is that frame's first local. Its `_name` is an instance attribute, found
//! in the object's dictionary the way each version keeps it:
//! - 3.8-3.10: a dict at `tp_dictoffset`, whose keys may be shared by the class (split table).
//! - 3.11-3.12: a managed dict, or values in the class's shared keys' order, pointed to from
//!   before the object.
//! - 3.13+: values inline after the object (`tp_basicsize`) while they are valid, else the
//!   managed dict.
//!
//! The class's shared keys (`ht_cached_keys`) sit right after the heap type's buffer slots, which
//! `tp_as_buffer` points to, so their place is read from the type itself rather than from a
//! table of `PyHeapTypeObject` sizes. Everything read is bounded and checked; a name that does
//! not read cleanly is simply not shown. No crate reads CPython objects from outside, so this
//! is written here.

use super::code::read_unicode;
use super::frame_chain::FrameChain;
use super::layout::Layout;
use super::objects::{TPFLAGS_INLINE_VALUES, TYPE};
use super::remote::{le_u64, Remote};

/// Entries of a dictionary looked at: a thread object has a few dozen attributes.
const MAX_ENTRIES: u64 = 128;

/// Reads the thread name of the thread whose state is at `tstate`; `None` when the thread does
/// not run `threading`'s bootstrap (the main thread, a thread started from C) or is not there yet.
pub fn thread_name(remote: &Remote, l: &Layout, str_type: u64, tstate: u64) -> Option<String> {
    let thread = bootstrap_self(remote, l, str_type, tstate)?;
    let value = attribute(remote, l, str_type, thread, "_name")?;
    let name = read_unicode(remote, l, value, str_type)?;
    (!name.is_empty() && name.len() <= 256).then_some(name)
}

/// The first local of the outermost `_bootstrap` frame of `threading.py`.
fn bootstrap_self(remote: &Remote, l: &Layout, str_type: u64, tstate: u64) -> Option<u64> {
    let mut frame = remote.u64(tstate + l.tstate_frame as u64)?;
    if l.cframe_frame != profiler_common::NO_OFFSET {
        frame = remote.u64(frame.checked_add(l.cframe_frame as u64)?)?;
    }
    let mut found = None;
    let len = l.frame_code as usize + 8;
    let mut chain = FrameChain::new(remote, frame, l.frame_previous, len);
    for (at, buf) in chain.by_ref() {
        let code = le_u64(&buf, l.frame_code as usize)? & l.code_mask;
        if code != 0 && is_bootstrap(remote, l, str_type, code) {
            found = Some(at);
        }
    }
    // As before the walk was shared: a chain cut by a failed read names no thread.
    if chain.read_failed {
        return None;
    }
    let me = remote.u64(found? + l.frame_localsplus as u64)? & l.code_mask;
    (me != 0).then_some(me)
}

fn is_bootstrap(remote: &Remote, l: &Layout, str_type: u64, code: u64) -> bool {
    let name = remote
        .u64(code + l.code_name as u64)
        .and_then(|a| read_unicode(remote, l, a, str_type));
    if name.as_deref() != Some("_bootstrap") {
        return false;
    }
    remote
        .u64(code + l.code_filename as u64)
        .and_then(|a| read_unicode(remote, l, a, str_type))
        .is_some_and(|f| f.ends_with("threading.py"))
}

/// The value of the instance attribute `key` of `obj`.
fn attribute(remote: &Remote, l: &Layout, str_type: u64, obj: u64, key: &str) -> Option<u64> {
    let ty = remote.u64(obj + 8)?;
    let t = remote.read(ty, TYPE.dictoffset as usize + 8)?;
    let flags = le_u64(&t, TYPE.flags as usize)?;
    let basicsize = le_u64(&t, TYPE.basicsize as usize)?;
    let dictoffset = le_u64(&t, TYPE.dictoffset as usize)? as i64;
    // The class's shared keys: `ht_cached_keys`, after `as_buffer` (two slots) and three
    // pointers (`ht_name`, `ht_slots`, `ht_qualname`).
    let cached_keys = || {
        let buffer = le_u64(&t, TYPE.as_buffer as usize)?;
        (buffer > ty && buffer - ty < 4096)
            .then(|| remote.u64(buffer + 16 + 24))
            .flatten()
    };
    let managed = obj.checked_sub(24)?;
    match l.minor {
        ..=10 => {
            if dictoffset <= 0 || dictoffset as u64 > basicsize {
                return None;
            }
            let dict = remote.u64(obj + dictoffset as u64)?;
            dict_get(remote, l, str_type, dict, key)
        }
        11 | 12 => {
            let word = remote.u64(managed)?;
            let values = if l.minor == 11 {
                if word != 0 {
                    return dict_get(remote, l, str_type, word, key);
                }
                remote.u64(obj.checked_sub(32)?)?
            } else if word & 1 != 0 {
                // Stored one byte before the values, to tag it (`_PyDictOrValues_SetValues`).
                word + 1
            } else if word != 0 {
                return dict_get(remote, l, str_type, word, key);
            } else {
                return None;
            };
            split_get(remote, l, str_type, cached_keys()?, values, key)
        }
        _ => {
            if flags & TPFLAGS_INLINE_VALUES != 0 {
                let values = obj.checked_add(basicsize)?;
                let head = remote.read(values, 8)?;
                if head[3] != 0 {
                    return split_get(remote, l, str_type, cached_keys()?, values + 8, key);
                }
            }
            let dict = remote.u64(managed)?;
            dict_get(remote, l, str_type, dict, key)
        }
    }
}

/// `dict[key]` for a `dict` at `dict` whose keys are strings.
fn dict_get(remote: &Remote, l: &Layout, str_type: u64, dict: u64, key: &str) -> Option<u64> {
    if dict == 0 {
        return None;
    }
    let d = remote.read(dict, 48)?;
    let keys = le_u64(&d, 32)?;
    let values = le_u64(&d, 40)?;
    if values != 0 {
        // 3.13+ values start with a header of four bytes, padded to a pointer.
        let values = if l.minor >= 13 { values + 8 } else { values };
        return split_get(remote, l, str_type, keys, values, key);
    }
    let (entries, n, size) = entries(remote, l, keys)?;
    for i in 0..n {
        let e = remote.read(entries + i * size, size as usize)?;
        let (k, v) = if size == 24 {
            (le_u64(&e, 8)?, le_u64(&e, 16)?)
        } else {
            (le_u64(&e, 0)?, le_u64(&e, 8)?)
        };
        if k != 0 && read_unicode(remote, l, k, str_type).as_deref() == Some(key) {
            return (v != 0).then_some(v);
        }
    }
    None
}

/// `key`'s value in a split table: the keys object gives its index in `values`.
fn split_get(
    remote: &Remote,
    l: &Layout,
    str_type: u64,
    keys: u64,
    values: u64,
    key: &str,
) -> Option<u64> {
    let (entries, n, size) = entries(remote, l, keys)?;
    for i in 0..n {
        let k = remote.u64(entries + i * size + if size == 24 { 8 } else { 0 })?;
        if k != 0 && read_unicode(remote, l, k, str_type).as_deref() == Some(key) {
            let v = remote.u64(values + i * 8)?;
            return (v != 0).then_some(v);
        }
    }
    None
}

/// A keys object's entries: (address, count, entry size).
fn entries(remote: &Remote, l: &Layout, keys: u64) -> Option<(u64, u64, u64)> {
    if keys == 0 {
        return None;
    }
    let k = remote.read(keys, 40)?;
    if l.minor <= 10 {
        // dk_size, dk_nentries, then the indices (their width follows the size).
        let size = le_u64(&k, 8)?;
        let n = le_u64(&k, 32)?;
        if !size.is_power_of_two() || size > 1 << 20 || n > size {
            return None;
        }
        let width = if size <= 0xff {
            1
        } else if size <= 0xffff {
            2
        } else {
            4
        };
        return Some((keys + 40 + size * width, n.min(MAX_ENTRIES), 24));
    }
    let log2_index_bytes = u32::from(k[9]);
    let kind = k[10];
    let n = le_u64(&k, 24)?;
    if log2_index_bytes > 24 || n > 1 << 20 {
        return None;
    }
    let size = if kind == 0 { 24 } else { 16 };
    Some((
        keys + 32 + (1u64 << log2_index_bytes),
        n.min(MAX_ENTRIES),
        size,
    ))
}
