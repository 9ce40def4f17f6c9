//! Code objects: names, files and line tables read from the target, and the line for an
//! instruction offset in each version's line-table format. Target memory is untrusted: every
//! length is bounded and every decoder stops at the end of its input.

use std::sync::Arc;

use super::layout::Layout;
use super::remote::{le_u32, le_u64, Remote};

/// Longest name or file name decoded (code points).
const MAX_STR: usize = 4096;
/// Longest line table read.
const MAX_LINETABLE: usize = 256 * 1024;

#[derive(Debug)]
pub struct CodeInfo {
    pub name: Arc<str>,
    pub file: Arc<str>,
    pub firstlineno: u32,
    pub linetable: Vec<u8>,
    /// What the cache validates a hit with: the type, file and name pointers.
    pub ident: [u64; 3],
    /// The name it was given (`name_ptr`: the qualified name where there is one).
    pub name_ptr: u64,
    /// `line_of`'s answers so far, by instruction: a hot function's few instructions are sampled
    /// over and over, and its table was decoded again for each (a tenth of the instructions
    /// user space spent per sample).
    pub lines: std::sync::Mutex<rustc_hash::FxHashMap<i32, (u32, bool)>>,
}

impl CodeInfo {
    /// Whether this is the code of the eval loop's entry frame (3.12+,
    /// `interp->interpreter_trampoline`): a shim, even when its frame's owner byte is read
    /// before the eval loop has written it.
    pub fn is_trampoline(&self) -> bool {
        &*self.name == "<interpreter trampoline>"
    }

    /// Whether this is the code object 3.13+ runs after a class's Python `__init__`
    /// (`_Py_InitCleanup`, static in the interpreter): named `__init__` in a file `__init__`,
    /// first line 0, and a line table of one entry without a location.
    pub fn is_init_cleanup(&self) -> bool {
        /// A line-table entry of 4 code units with no location (`PY_CODE_LOCATION_INFO_NONE`).
        const NO_LOCATION_4: u8 = 128 | (15 << 3) | 3;
        &*self.name == "__init__"
            && &*self.file == "__init__"
            && self.firstlineno == 0
            && self.linetable == [NO_LOCATION_4]
    }
}

/// Decodes a `str` object (any kind, compact or not).
pub fn read_unicode(remote: &Remote, layout: &Layout, addr: u64, str_type: u64) -> Option<String> {
    let head = remote.read(addr, 80)?;
    decode_unicode(layout, addr, &head, str_type, |a, n| remote.read(a, n))
}

/// Decodes a `str` object from a copy of its start (`copy`, taken at `addr`): only a compact
/// string whose characters are all in the copy decodes.
pub fn unicode_from_copy(layout: &Layout, addr: u64, copy: &[u8], str_type: u64) -> Option<String> {
    decode_unicode(layout, addr, copy, str_type, |a, n| {
        let start = usize::try_from(a.checked_sub(addr)?).ok()?;
        copy.get(start..start.checked_add(n)?).map(<[u8]>::to_vec)
    })
}

/// Whether a copy of a string taken at a sample (`unicode_from_copy`) agrees with `known`: a
/// compact ASCII string held whole by its copy is compared in place (this runs for the copied
/// frames of every sample), another is decoded; one the copy cannot tell agrees.
pub fn copy_agrees(layout: &Layout, addr: u64, copy: &[u8], str_type: u64, known: &str) -> bool {
    if taken(Some(copy)).is_none() {
        return true;
    }
    let ascii = (|| {
        if freed(layout, copy) || (str_type != 0 && le_u64(copy, 8)? != str_type) {
            return None;
        }
        let len = le_u64(copy, 16)? as usize;
        let state = le_u32(copy, 32)?;
        (state & (1 << 5) != 0 && state & (1 << 6) != 0)
            .then(|| {
                copy.get(layout.unicode_ascii_data..layout.unicode_ascii_data.checked_add(len)?)
            })
            .flatten()
    })();
    match ascii {
        Some(chars) => chars == known.as_bytes(),
        None => unicode_from_copy(layout, addr, copy, str_type).is_none_or(|s| s == known),
    }
}

/// The address of a code object's (qualified) name, from its head: what frames are named by.
pub fn name_ptr(layout: &Layout, head: &[u8]) -> Option<u64> {
    layout
        .code_qualname
        .and_then(|q| le_u64(head, q))
        .filter(|&p| p != 0)
        .or_else(|| le_u64(head, layout.code_name))
}

/// Whether an object's head (`head` starts at its reference count) is that of a freed object:
/// the allocator keeps its free list in the first word, so a freed block holds a pointer there
/// (or 0 at the list's end), never a count a live object can have. Up to 3.13 a live count is
/// below 2^32 (immortal objects included). From 3.14 the word is a 32-bit count, a 16-bit
/// overflow count (0 unless an object has over 2^32 references) and 16 bits of flags (set on
/// static and immortal objects); a pointer fills the overflow bits instead.
pub fn freed(layout: &Layout, head: &[u8]) -> bool {
    le_u64(head, 0).is_none_or(|word| {
        if layout.minor >= 14 {
            word & 0xffff_ffff == 0 || (word >> 32) & 0xffff != 0
        } else {
            word == 0 || word >> 32 != 0
        }
    })
}

/// Decodes a `str` object whose head is `head` (read at `addr`), reading its characters with
/// `fetch(address, bytes)`.
fn decode_unicode(
    layout: &Layout,
    addr: u64,
    head: &[u8],
    str_type: u64,
    fetch: impl Fn(u64, usize) -> Option<Vec<u8>>,
) -> Option<String> {
    // Memory that was a string when the sample was taken may be anything now.
    if freed(layout, head) || (str_type != 0 && le_u64(head, 8)? != str_type) {
        return None;
    }
    let length = le_u64(head, 16)? as usize;
    let state = le_u32(head, 32)?;
    let kind = ((state >> 2) & 7) as usize;
    let compact = state & (1 << 5) != 0;
    let ascii = state & (1 << 6) != 0;
    if length > MAX_STR || !matches!(kind, 1 | 2 | 4) {
        return None;
    }
    let data = if compact {
        addr + if ascii {
            layout.unicode_ascii_data
        } else {
            layout.unicode_compact_data
        } as u64
    } else {
        // Legacy (non-compact) strings keep their data behind a pointer after the compact part.
        le_u64(head, layout.unicode_compact_data)?
    };
    if ascii && kind != 1 {
        return None;
    }
    if length == 0 {
        return Some(String::new());
    }
    let bytes = fetch(data, length * kind)?;
    if ascii && !bytes.is_ascii() {
        return None;
    }
    Some(match kind {
        1 => bytes.iter().map(|&b| b as char).collect(),
        2 => bytes
            .chunks_exact(2)
            .map(|c| char::from_u32(u16::from_le_bytes([c[0], c[1]]) as u32).unwrap_or('\u{fffd}'))
            .collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|c| {
                char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]])).unwrap_or('\u{fffd}')
            })
            .collect(),
    })
}

fn read_bytes_object(remote: &Remote, addr: u64) -> Option<Vec<u8>> {
    let head = remote.read(addr, 32)?;
    let size = le_u64(&head, 16)? as usize;
    if size > MAX_LINETABLE {
        return None;
    }
    if size == 0 {
        return Some(Vec::new());
    }
    remote.read(addr + 32, size)
}

/// Bytes of a code object read for validation and resolution.
pub fn header_len(layout: &Layout) -> usize {
    [
        layout.code_filename,
        layout.code_name,
        layout.code_qualname.unwrap_or(0),
        layout.code_linetable,
        layout.code_firstlineno,
    ]
    .into_iter()
    .max()
    .unwrap_or(0)
        + 8
}

/// The identity a cached code object is validated by: (ob_type, co_filename, co_name).
pub fn ident(layout: &Layout, head: &[u8]) -> Option<[u64; 3]> {
    Some([
        le_u64(head, 8)?,
        le_u64(head, layout.code_filename)?,
        le_u64(head, layout.code_name)?,
    ])
}

/// The type objects of the target's interpreter that objects read from it are checked against
/// (0: unknown, not checked).
#[derive(Clone, Copy, Debug, Default)]
pub struct Types {
    pub code: u64,
    pub str: u64,
}

/// A function's (qualified) name as CPython makes them: identifiers joined by dots, with
/// `<module>`, `<lambda>`, `<locals>`... Anything else read from a target is garbage (freed and
/// reused memory, a torn read) and is never shown.
pub fn plausible_name(s: &str) -> bool {
    // Spaces only inside `<...>`: the interpreter's own names (`<generic parameters of Box>`,
    // 3.12+ type parameter scopes; `<interpreter trampoline>`).
    let mut depth = 0u32;
    !s.is_empty()
        && s.len() <= MAX_STR
        && s.chars().all(|c| {
            match c {
                '<' => depth += 1,
                '>' => depth = depth.saturating_sub(1),
                ' ' => return depth > 0,
                _ => {}
            }
            c.is_alphanumeric() || matches!(c, '_' | '.' | '<' | '>' | '-' | '$')
        })
}

/// A file name as shown: no control characters and no replacement characters.
pub fn plausible_file(s: &str) -> bool {
    !s.is_empty() && !s.chars().any(|c| c.is_control() || c == '\u{fffd}')
}

/// Copies of the starts of a code object's name and file strings taken with its head at the
/// sampled instant (the strings may be freed with the code, and their memory reused).
#[derive(Clone, Copy, Default)]
pub struct StringCopies<'a> {
    pub name: Option<&'a [u8]>,
    pub file: Option<&'a [u8]>,
}

/// A copy the BPF program took (a zero type word: none, or the read failed).
fn taken(copy: Option<&[u8]>) -> Option<&[u8]> {
    copy.filter(|c| c.get(8..16).is_some_and(|t| t != [0; 8]))
}

/// The file name string at `ptr`: from the copy taken at the sample where it holds the whole
/// string; else as read now, believed only if it has the copy's length and starts as the copy
/// does (the string may have been freed and its memory reused by another one).
fn file_name(
    remote: &Remote,
    layout: &Layout,
    ptr: u64,
    copy: Option<&[u8]>,
    str_type: u64,
) -> Option<String> {
    copied_string(remote, layout, ptr, copy, str_type).0
}

/// The string at `ptr`, from its copy when the copy holds it whole, else read now and checked
/// against the copy (its length, and the characters copied of a compact ASCII string). With
/// it, the characters copied when the string is longer than its copy (compact ASCII only).
fn copied_string(
    remote: &Remote,
    layout: &Layout,
    ptr: u64,
    copy: Option<&[u8]>,
    str_type: u64,
) -> (Option<String>, Option<String>) {
    let now = || read_unicode(remote, layout, ptr, str_type);
    let Some(c) = taken(copy) else {
        return (now(), None);
    };
    if let Some(f) = unicode_from_copy(layout, ptr, c, str_type) {
        return (Some(f), None);
    }
    let checked = || {
        if str_type != 0 && le_u64(c, 8)? != str_type {
            return None;
        }
        let len = le_u64(c, 16)? as usize;
        let state = le_u32(c, 32)?;
        let compact_ascii = state & (1 << 5) != 0 && state & (1 << 6) != 0;
        let prefix = if compact_ascii {
            c.get(layout.unicode_ascii_data..)?
        } else {
            &[]
        };
        let prefix = std::str::from_utf8(prefix).ok().filter(|p| p.is_ascii())?;
        let whole = now().filter(|f| f.chars().count() == len && f.starts_with(prefix));
        Some((whole, (!prefix.is_empty()).then(|| prefix.to_string())))
    };
    checked().unwrap_or((None, None))
}

/// Reads a whole code object given its header bytes, and copies of the starts of its name and
/// file strings where they were taken with them.
pub fn read_code(
    remote: &Remote,
    layout: &Layout,
    head: &[u8],
    types: Types,
    copies: StringCopies,
) -> Option<CodeInfo> {
    let id = ident(layout, head)?;
    // A freed code object keeps its type word for a while, with pointers to strings that may
    // be freed and reused too.
    if freed(layout, head) || (types.code != 0 && id[0] != types.code) {
        return None;
    }
    let name_ptr = name_ptr(layout, head)?;
    let read = |p: u64| read_unicode(remote, layout, p, types.str);
    let (copied, start) = match taken(copies.name) {
        Some(_) => copied_string(remote, layout, name_ptr, copies.name, types.str),
        None => (None, None),
    };
    let name = copied
        .filter(|n| plausible_name(n))
        .or_else(|| read(name_ptr).filter(|n| plausible_name(n)))
        .or_else(|| read(id[2]).filter(|n| plausible_name(n)))
        // A name longer than its copy, freed with its code: what was copied of it, marked cut.
        .or_else(|| start.filter(|p| plausible_name(p)).map(|p| format!("{p}…")))?;
    let file = file_name(remote, layout, id[1], copies.file, types.str)
        .filter(|f| plausible_file(f))
        .unwrap_or_else(|| "<unknown>".into());
    let firstlineno = le_u32(head, layout.code_firstlineno)? as i32;
    let linetable = le_u64(head, layout.code_linetable)
        .and_then(|p| read_bytes_object(remote, p))
        .unwrap_or_default();
    Some(CodeInfo {
        name: Arc::from(name.as_str()),
        file: Arc::from(file.as_str()),
        firstlineno: firstlineno.max(0) as u32,
        linetable,
        ident: id,
        name_ptr,
        lines: Default::default(),
    })
}

/// The line of instruction `instr` (as the BPF program reports it for this version).
#[cfg(test)]
pub fn line_for(minor: u32, code: &CodeInfo, instr: i32) -> u32 {
    line_lookup(minor, code, instr).0
}

/// The line of instruction `instr`, and whether the line table was corrupt (it ended before
/// covering the instruction, or did not decode): then the function's first line is given.
/// Instructions of one code object whose lines `line_of` keeps (a bound: target memory decides
/// how long a table, and so how many instructions, a code object has).
const MAX_LINES_KEPT: usize = 4096;

/// `line_lookup`, each instruction's answer kept with the code object.
pub fn line_of(minor: u32, code: &CodeInfo, instr: i32) -> (u32, bool) {
    let Ok(mut kept) = code.lines.lock() else {
        return line_lookup(minor, code, instr);
    };
    if let Some(&found) = kept.get(&instr) {
        return found;
    }
    let found = line_lookup(minor, code, instr);
    if kept.len() < MAX_LINES_KEPT {
        kept.insert(instr, found);
    }
    found
}

pub fn line_lookup(minor: u32, code: &CodeInfo, instr: i32) -> (u32, bool) {
    let first = code.firstlineno as i64;
    if code.linetable.is_empty() {
        // No table (or none to trust): the function's first line.
        return (code.firstlineno, false);
    }
    let found = match minor {
        0..=9 => Ok(lnotab_line(&code.linetable, first, instr.max(0) as u64)),
        10 => linetable310_line(&code.linetable, first, 2 * instr.max(0) as u64),
        _ => {
            if instr < 0 || code.linetable.is_empty() {
                Ok(Some(first))
            } else {
                location_table_line(&code.linetable, first, instr as u64)
            }
        }
    };
    // A line beyond any source file's length is a corrupt table too.
    let found = found.and_then(|l| match l {
        Some(l) if l > i32::MAX as i64 => Err(()),
        other => Ok(other),
    });
    let corrupt = found.is_err();
    let line = found
        .ok()
        .flatten()
        .filter(|&l| l > 0)
        .unwrap_or(first)
        .max(0) as u32;
    (line, corrupt)
}

/// <= 3.9 `co_lnotab`: (byte increment, signed line increment) pairs; `addr` in bytes.
fn lnotab_line(t: &[u8], first: i64, addr: u64) -> Option<i64> {
    let mut line = first;
    let mut a = 0u64;
    for pair in t.chunks_exact(2) {
        a += pair[0] as u64;
        if a > addr {
            break;
        }
        line += pair[1] as i8 as i64;
    }
    Some(line)
}

/// 3.10 `co_linetable`: (start delta, signed line delta; -128 = none) pairs; `addr` in bytes.
/// `Ok(None)`: the instruction has no line; `Err`: the table ends before it.
fn linetable310_line(t: &[u8], first: i64, addr: u64) -> Result<Option<i64>, ()> {
    let mut line = first;
    let mut start = 0u64;
    for pair in t.chunks_exact(2) {
        let end = start + pair[0] as u64;
        let delta = pair[1] as i8;
        if delta != -128 {
            line += delta as i64;
        }
        if addr >= start && addr < end {
            return Ok((delta != -128).then_some(line));
        }
        start = end;
    }
    Err(())
}

fn varint(t: &[u8], i: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    let mut shift = 0;
    loop {
        let b = *t.get(*i)?;
        *i += 1;
        v |= ((b & 63) as u64) << shift;
        if b & 64 == 0 {
            return Some(v);
        }
        shift += 6;
        if shift > 60 {
            return None;
        }
    }
}

fn svarint(t: &[u8], i: &mut usize) -> Option<i64> {
    let v = varint(t, i)?;
    Some(if v & 1 != 0 {
        -((v >> 1) as i64)
    } else {
        (v >> 1) as i64
    })
}

/// 3.11+ location table; `addrq` in code units. `Ok(None)`: the instruction has no location;
/// `Err`: the table does not decode, or ends before the instruction.
fn location_table_line(t: &[u8], first: i64, addrq: u64) -> Result<Option<i64>, ()> {
    let mut i = 0;
    let mut line = first;
    let mut start = 0u64;
    while i < t.len() {
        let b = t[i];
        if b & 0x80 == 0 {
            return Err(()); // not at an entry start: corrupt table
        }
        i += 1;
        let code = (b >> 3) & 15;
        let len = (b & 7) as u64 + 1;
        let this_line = match code {
            15 => None,
            14 => {
                line = line.checked_add(svarint(t, &mut i).ok_or(())?).ok_or(())?;
                varint(t, &mut i).ok_or(())?;
                varint(t, &mut i).ok_or(())?;
                varint(t, &mut i).ok_or(())?;
                Some(line)
            }
            13 => {
                line = line.checked_add(svarint(t, &mut i).ok_or(())?).ok_or(())?;
                Some(line)
            }
            10..=12 => {
                line += (code - 10) as i64;
                i += 2;
                Some(line)
            }
            _ => {
                i += 1;
                Some(line)
            }
        };
        if addrq >= start && addrq < start + len {
            return Ok(this_line);
        }
        start += len;
    }
    Err(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A 3.11+ location table of five "long form" entries (code 14) whose line deltas add past
    /// i64::MAX: corrupt.
    pub(crate) fn overflowing_location_table() -> Vec<u8> {
        let mut t = Vec::new();
        for _ in 0..5 {
            t.push(0x80 | (14 << 3));
            // svarint of about 2^61, positive.
            t.extend([
                0x7e, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x03,
            ]);
            t.extend([0, 0, 0]);
        }
        t
    }

    #[test]
    fn location_table_line_deltas_that_overflow_are_corrupt() {
        let t = overflowing_location_table();
        let c = code(1, t.clone());
        assert_eq!(line_lookup(12, &c, 4), (1, true));
        // One such delta: no overflow, but no real line either.
        let c = code(1, t[..15].to_vec());
        assert_eq!(line_lookup(12, &c, 0), (1, true));
    }

    fn code(first: u32, table: Vec<u8>) -> CodeInfo {
        CodeInfo {
            name: Arc::from("f"),
            file: Arc::from("f.py"),
            firstlineno: first,
            linetable: table,
            ident: [0; 3],
            name_ptr: 0,
            lines: Default::default(),
        }
    }

    #[test]
    fn kept_lines_are_the_tables_and_bounded() {
        let c = code(10, vec![6, 1, 8, 0xfe]);
        for pass in 0..2 {
            for i in -2..40 {
                assert_eq!(line_of(9, &c, i), line_lookup(9, &c, i), "pass {pass} @{i}");
            }
        }
        for i in 0..(2 * MAX_LINES_KEPT as i32) {
            line_of(9, &c, i);
        }
        assert_eq!(c.lines.lock().unwrap().len(), MAX_LINES_KEPT);
    }

    #[test]
    fn lnotab() {
        // bytes 0-5 line 10, 6-13 line 11, 14+ line 9 (negative increment).
        let c = code(10, vec![6, 1, 8, 0xfe]);
        assert_eq!(line_for(9, &c, 0), 10);
        assert_eq!(line_for(9, &c, 6), 11);
        assert_eq!(line_for(9, &c, 13), 11);
        assert_eq!(line_for(9, &c, 14), 9);
    }

    #[test]
    fn linetable_310() {
        // [0,4) line 5+1, [4,10) no line, [10,20) line 6+2.
        let c = code(5, vec![4, 1, 6, 0x80, 10, 2]);
        assert_eq!(line_for(10, &c, 1), 6); // byte 2
        assert_eq!(line_for(10, &c, 3), 5); // byte 6: no line -> first line
        assert_eq!(line_for(10, &c, 6), 8); // byte 12
    }

    #[test]
    fn location_table_311() {
        // entry 1: code 13 (no columns), len 2, line +1 (svarint 2) -> line 8
        // entry 2: code 10 (one line, +0), len 3, two column bytes -> line 8
        // entry 3: code 11 (one line, +1), len 1 -> line 9
        // entry 4: code 14 (long), len 1, line -2 (svarint 5), 3 varints -> line 7
        // entry 5: code 15 (none), len 1
        let t = vec![
            0x80 | (13 << 3) | 1,
            2,
            0x80 | (10 << 3) | 2,
            0,
            4,
            0x80 | (11 << 3),
            1,
            2,
            0x80 | (14 << 3),
            5,
            0,
            1,
            2,
            0x80 | (15 << 3),
        ];
        let c = code(7, t);
        assert_eq!(line_for(11, &c, 0), 8);
        assert_eq!(line_for(11, &c, 1), 8);
        assert_eq!(line_for(11, &c, 4), 8);
        assert_eq!(line_for(11, &c, 5), 9);
        assert_eq!(line_for(11, &c, 6), 7);
        assert_eq!(line_for(11, &c, 7), 7); // "none" -> first line
        assert_eq!(line_for(11, &c, -1), 7); // not started
        assert_eq!(line_for(11, &c, 999), 7);
    }

    #[test]
    fn corrupt_tables_do_not_panic() {
        for t in [
            vec![0x7f],
            vec![0xff, 0xff, 0xff],
            // A long-form entry whose varints never end.
            std::iter::once(0x80 | (14 << 3))
                .chain([0xff; 12])
                .collect(),
        ] {
            let c = code(3, t.clone());
            for minor in [8, 10, 11, 13] {
                for i in [-5, 0, 1, 100, i32::MAX] {
                    let (line, corrupt) = line_lookup(minor, &c, i);
                    // A corrupt table gives the function's first line, flagged; a table that
                    // decodes moves at most 127 lines per byte from it.
                    assert!(!corrupt || line == 3, "{t:x?} 3.{minor} @{i}: line {line}");
                    assert!(
                        (1..=3 + 127 * t.len() as u32).contains(&line),
                        "{t:x?} 3.{minor} @{i}: line {line}"
                    );
                }
            }
        }
        // Varints that never end are seen as corrupt where an instruction is looked up in them.
        let endless = code(
            3,
            std::iter::once(0x80 | (14 << 3))
                .chain([0xff; 12])
                .collect(),
        );
        for minor in [11, 13] {
            for i in [0, 1, 100] {
                assert_eq!(line_lookup(minor, &endless, i), (3, true), "3.{minor} @{i}");
            }
        }
        assert_eq!(line_lookup(10, &code(3, vec![0x7f]), 1), (3, true));
    }

    #[test]
    fn garbage_names_are_not_names() {
        for good in [
            "f",
            "Klass.méthode",
            "<module>",
            "outer.<locals>.<lambda>",
            "__init__",
            "<generic parameters of Box>",
            "Box.<generic parameters of get>",
        ] {
            assert!(plausible_name(good), "{good:?}");
        }
        for bad in [
            "",
            "\0",
            "a\u{1}b",
            "f\u{fffd}",
            "two words",
            "x\ny",
            "<a> b",
            "a <b>",
        ] {
            assert!(!plausible_name(bad), "{bad:?}");
        }
        assert!(plausible_file("/srv/app/é.py") && plausible_file("<frozen importlib._bootstrap>"));
        assert!(!plausible_file("a\0.py") && !plausible_file("\u{fffd}.py") && !plausible_file(""));
    }

    /// A live compact ASCII str object of type 0x5555 holding `text`, as 3.12 lays it out.
    fn ascii_str(l: &Layout, text: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; l.unicode_ascii_data + text.len() + 1];
        b[0..8].copy_from_slice(&1u64.to_le_bytes());
        b[8..16].copy_from_slice(&0x5555u64.to_le_bytes());
        b[16..24].copy_from_slice(&(text.len() as u64).to_le_bytes());
        // kind 1, compact, ascii
        b[32..36].copy_from_slice(&((1u32 << 2) | (1 << 5) | (1 << 6)).to_le_bytes());
        b[l.unicode_ascii_data..l.unicode_ascii_data + text.len()].copy_from_slice(text);
        b
    }

    /// A compact ASCII str object laid out in this process's memory, read back as from a
    /// target: only an object of the given type, with bytes that agree with its flags, reads.
    #[test]
    fn strings_are_checked_against_their_type_and_flags() {
        let l = crate::python::layout::builtin(12).unwrap();
        let me = Remote {
            pid: std::process::id(),
        };
        let make = |text: &[u8]| ascii_str(&l, text);
        let ok = make(b"run");
        assert_eq!(
            read_unicode(&me, &l, ok.as_ptr() as u64, 0x5555).as_deref(),
            Some("run")
        );
        assert_eq!(read_unicode(&me, &l, ok.as_ptr() as u64, 0x6666), None);
        let torn = make(b"r\xe9n");
        assert_eq!(read_unicode(&me, &l, torn.as_ptr() as u64, 0x5555), None);
        // A freed object: the allocator's free-list pointer (or 0) where the count was.
        for first in [0u64, ok.as_ptr() as u64 + 4096] {
            let mut gone = make(b"run");
            gone[0..8].copy_from_slice(&first.to_le_bytes());
            assert_eq!(read_unicode(&me, &l, gone.as_ptr() as u64, 0x5555), None);
        }
        // Immortal objects (3.12+) keep a count below 2^32.
        let mut immortal = make(b"run");
        immortal[0..8].copy_from_slice(&0xffff_ffffu64.to_le_bytes());
        assert!(read_unicode(&me, &l, immortal.as_ptr() as u64, 0x5555).is_some());
        // 3.14 keeps flags in the word's top 16 bits (a static string here); a free-list
        // pointer fills the overflow bits below them.
        let l14 = crate::python::layout::builtin(14).unwrap();
        let word = u64::to_le_bytes;
        assert!(!freed(&l14, &word((1 << 50) | (3 << 30))));
        assert!(!freed(&l14, &word(1)));
        assert!(freed(&l14, &word(0x7f12_3456_7890)));
        assert!(freed(&l14, &word(0)));
        assert!(freed(&l, &word((1 << 50) | 1)));
    }

    /// A file name copied at the sample: read from the copy when it holds the whole string;
    /// a longer one is read from the target and believed only when it has the copy's length
    /// and start (its memory may hold another string by then).
    #[test]
    fn file_names_are_read_from_or_checked_against_their_copy() {
        let l = crate::python::layout::builtin(12).unwrap();
        let me = Remote {
            pid: std::process::id(),
        };
        let make = |text: &[u8]| ascii_str(&l, text);
        let short = make(b"/srv/app/views.py");
        let file =
            |at: &[u8], copy: &[u8]| file_name(&me, &l, at.as_ptr() as u64, Some(copy), 0x5555);
        // The whole string is in the copy: whatever is at the address now does not matter.
        let other = make(b"a docstring that took the freed name's place");
        let copy = &short[..short.len().min(192)];
        let c = file_name(&me, &l, other.as_ptr() as u64, Some(copy), 0x5555);
        assert_eq!(c.as_deref(), Some("/srv/app/views.py"));
        // A path longer than the copy.
        let path = format!("/srv/{}/models.py", "deep/".repeat(40));
        let long = make(path.as_bytes());
        assert_eq!(file(&long, &long[..192]).as_deref(), Some(path.as_str()));
        let same_length = make(format!("/opt/{}/models.py", "deep/".repeat(40)).as_bytes());
        assert_eq!(file(&same_length, &long[..192]), None);
        let longer = make(format!("{path}.bak").as_bytes());
        assert_eq!(file(&longer, &long[..192]), None);
        // No copy (the read failed): what is there now.
        assert_eq!(
            file_name(&me, &l, short.as_ptr() as u64, None, 0x5555).as_deref(),
            Some("/srv/app/views.py")
        );
    }

    /// A copy agrees with a known string only when it holds that string; a copy that does not
    /// hold a whole string (longer than the copy, or not taken) cannot tell, and agrees.
    #[test]
    fn copies_agree_only_with_the_string_they_hold() {
        let l = crate::python::layout::builtin(12).unwrap();
        let a = ascii_str(&l, b"generated_104.py");
        let agrees = |copy: &[u8], known: &str| copy_agrees(&l, 0x1000, copy, 0x5555, known);
        assert!(agrees(&a, "generated_104.py"));
        assert!(!agrees(&a, "generated_264.py"));
        assert!(!agrees(&a, "generated_104.p"));
        let long = ascii_str(&l, "x".repeat(300).as_bytes());
        assert!(agrees(&long[..96], "y"));
        let mut failed = a.clone();
        failed[8..16].fill(0);
        assert!(agrees(&failed, "anything"));
        // Not a string of the target's type: it cannot tell either.
        assert!(copy_agrees(&l, 0x1000, &a, 0x6666, "generated_264.py"));
    }

    /// A name copied at the sample decodes from the copy alone (at any address), only when all
    /// its characters are in the copy, and is checked like one read from the target.
    #[test]
    fn names_decode_from_a_copy_of_their_start() {
        let l = crate::python::layout::builtin(12).unwrap();
        let copy = |text: &[u8], len: usize| {
            let mut b = vec![0u8; len];
            b[0..8].copy_from_slice(&1u64.to_le_bytes());
            b[8..16].copy_from_slice(&0x5555u64.to_le_bytes());
            b[16..24].copy_from_slice(&(text.len() as u64).to_le_bytes());
            b[32..36].copy_from_slice(&((1u32 << 2) | (1 << 5) | (1 << 6)).to_le_bytes());
            let n = text.len().min(len - l.unicode_ascii_data);
            b[l.unicode_ascii_data..l.unicode_ascii_data + n].copy_from_slice(&text[..n]);
            b
        };
        let addr = 0x7f00_0000_1000;
        let c = copy(b"<module>", 96);
        assert_eq!(
            unicode_from_copy(&l, addr, &c, 0x5555).as_deref(),
            Some("<module>")
        );
        assert_eq!(unicode_from_copy(&l, addr, &c, 0x6666), None);
        // 60 characters do not fit in 96 bytes after a 40-byte header.
        let long = copy(&[b'a'; 60], 96);
        assert_eq!(unicode_from_copy(&l, addr, &long, 0x5555), None);
        // A legacy string points elsewhere: never read through the copy.
        let mut legacy = copy(b"abc", 96);
        legacy[32..36].copy_from_slice(&(1u32 << 2).to_le_bytes());
        assert_eq!(unicode_from_copy(&l, addr, &legacy, 0x5555), None);
    }
}
