//! The code objects of one Python process: read from its memory, validated once per epoch
//! (an address can be reused after its object is freed), retired when replaced (a sample's copy
//! of a code head still names its frame after the object is gone), and the function and frame
//! ids they were given.

use std::sync::{Arc, Weak};

use rustc_hash::FxHashMap;

use profiler_common::PY_FRAME_SNAP_SHIFT;

use super::code::{self, CodeInfo};
use super::discover::{PyProcess, Runtime};
use super::native_names::is_handle_run;
use super::remote::le_u64;
use super::{opcodes, FrameRef, ProfileSink, PyEvent};

/// Code objects cached per process before the cache is cleared.
const MAX_CODES: usize = 200_000;
/// How long a code object is seen at its address (sample time) before the frame walk stops
/// copying its head (`PyProcess::settled`): a function lives as long as the program, while code
/// run by `exec` in a loop lives milliseconds, and its address goes to the next one.
const SETTLED_NS: u64 = 1_000_000_000;
/// Epochs a settled code object's validation holds (about a second: an epoch is at most
/// 100 ms or 256 records). A settled object has been the same at its address for a second of
/// samples and is no longer copied at samples; functions live as long as their program, so
/// reading each again at every epoch was most of the validation's cost (a threaded service
/// runs hundreds of them). Should one be freed and its address taken by another code object,
/// samples name the old one until the next validation, a second at most, which then tells the
/// BPF side to copy it again.
const SETTLED_EPOCHS: u64 = 10;

/// A function frame made for a code object, with the name and file it was made for.
type MadeFunction = (FrameRef, Arc<str>, Arc<str>);

/// Entries whose identity still holds: (index, head, its name and file string addresses).
type Same = Vec<(usize, Vec<u8>, [u64; 2])>;
/// Heads to read in full: (index, head).
type ToRead = Vec<(usize, Vec<u8>)>;

/// What one read of a batch's stale code objects brought: their heads, and the copies of the
/// name and file strings of the entries known at their addresses, by where each entry's pair
/// lands among them (with the string addresses they were read at).
struct Heads {
    heads: Vec<Option<Vec<u8>>>,
    guesses: Vec<Option<Vec<u8>>>,
    guessed: FxHashMap<usize, ([u64; 2], usize)>,
}

/// The code objects of one process, and the function and frame ids made for them.
#[derive(Default)]
pub struct CodeCache {
    /// Code objects by address, with the last epoch their validation holds for (the one
    /// they were validated in, or for settled ones `SETTLED_EPOCHS` more).
    pub(super) codes: FxHashMap<u64, (Arc<CodeInfo>, u64)>,
    /// Addresses whose code object settled (the BPF side no longer copies it).
    pub(super) settled: rustc_hash::FxHashSet<u64>,
    /// Code objects that were at an address before another took it, by address and identity: a
    /// sample's copy of a code head with that identity names its frame with them (line table
    /// included) after the object itself is gone.
    pub(super) retired: FxHashMap<(u64, [u64; 3]), Arc<CodeInfo>>,
    /// Code objects the frame walk copied, by address, with the time of the first sample that
    /// showed that object there (`settled`).
    pub(super) young: FxHashMap<u64, (u64, Arc<CodeInfo>)>,
    /// Addresses whose code object was found freed or replaced since the BPF side was last told
    /// (`PythonRegistry::take_forgotten_codes`).
    pub(super) gone: Vec<u64>,
    /// Functions by code address and identity, with the name and file they were made for: an
    /// object made where a freed one was, with its strings where the freed one's were, has the
    /// same identity and other names.
    pub(super) funcs: FxHashMap<(u64, [u64; 3]), MadeFunction>,
    /// Frames by function, line and (innermost frames with `--opcodes`) opcode byte.
    pub(super) frames: FxHashMap<(FrameRef, u32, Option<u8>), FrameRef>,
    /// What `frame_for` answered, by code address and instruction, with the code object it
    /// answered for and whether its line table was corrupt: most frames of a sample were named
    /// before, and naming one again took three look-ups and a lock (the function, the line, the
    /// frame). Weak: the entry names the object (its allocation outlives it), without keeping
    /// a retired object's tables alive.
    named: FxHashMap<(u64, i32), Named>,
}

/// A `CodeCache::named` entry.
type Named = (Weak<CodeInfo>, FrameRef, bool);

/// `CodeCache::named` entries kept before it is emptied (the instructions of a service's hot
/// code are a few thousand; a weak entry holds at most its object's allocation, about 200
/// bytes).
const MAX_NAMED: usize = 8192;

impl CodeCache {
    /// Forgets the function and frame ids (a new profile started: the old ones are void).
    pub fn new_profile(&mut self) {
        self.funcs.clear();
        self.frames.clear();
        self.named.clear();
    }

    /// The code objects at `addrs`, validated against the target's memory once per `epoch`
    /// (one batch of samples read from the ring buffer, at most a few ms of samples): an address
    /// can be reused after its code object is freed, so a cached entry is believed only after
    /// its type, name and file have been read again in this epoch. One read validates every
    /// address of the sample that needs it; misses are resolved in full. `on_read` sees each
    /// code object read in full.
    pub fn code(
        &mut self,
        rt: &Runtime,
        addrs: &[u64],
        epoch: u64,
        on_read: &mut impl FnMut(u64, &CodeInfo),
    ) -> Vec<Option<Arc<CodeInfo>>> {
        if self.codes.len() > MAX_CODES {
            self.codes.clear();
            self.settled.clear();
        }
        let mut out: Vec<Option<Arc<CodeInfo>>> = vec![None; addrs.len()];
        let mut stale = Vec::new();
        for (i, a) in addrs.iter().enumerate() {
            match self.codes.get(a) {
                Some((c, e)) if *e >= epoch => out[i] = Some(c.clone()),
                _ => stale.push(i),
            }
        }
        if stale.is_empty() {
            return out;
        }
        let mut heads = self.read_heads(rt, addrs, &stale);
        let (same, mut read) = self.sort_heads(rt, addrs, &stale, &mut heads, &mut out);
        self.check_strings(rt, addrs, epoch, same, heads, &mut out, &mut read);
        for (i, head) in read {
            let a = addrs[i];
            out[i] = (|| {
                let c = Arc::new(code::read_code(
                    &rt.remote,
                    &rt.layout,
                    &head,
                    code::Types {
                        code: rt.code_type,
                        str: rt.str_type,
                    },
                    code::StringCopies::default(),
                )?);
                self.retire(a);
                on_read(a, &c);
                self.codes.insert(a, (c.clone(), epoch));
                Some(c)
            })();
            if out[i].is_none() {
                self.retire(a);
            }
        }
        out
    }

    /// The heads at the `stale` addresses, in one read with the name and file strings of each
    /// cached entry, where they were: an entry whose head still points there (nearly every one)
    /// is checked with this one read.
    fn read_heads(&self, rt: &Runtime, addrs: &[u64], stale: &[usize]) -> Heads {
        let len = code::header_len(&rt.layout);
        let mut ranges: Vec<(u64, usize)> = stale.iter().map(|&i| (addrs[i], len)).collect();
        let mut guessed: FxHashMap<usize, ([u64; 2], usize)> = FxHashMap::default();
        for &i in stale {
            if let Some((c, _)) = self.codes.get(&addrs[i]) {
                // Where its pair lands among the reads after the heads.
                guessed.insert(i, ([c.name_ptr, c.ident[1]], ranges.len() - stale.len()));
                ranges.push((c.name_ptr, profiler_common::PY_NAME_SNAP));
                ranges.push((c.ident[1], profiler_common::PY_FILE_SNAP));
            }
        }
        // Each range reads as it would alone, whatever fails beside it.
        let mut heads = rt.remote.read_many(&ranges);
        let guesses = heads.split_off(stale.len());
        Heads {
            heads,
            guesses,
            guessed,
        }
    }

    /// Sorts the heads read: entries whose identity (type, name and file addresses) still holds,
    /// with the head that showed it (their strings are read again before they are believed),
    /// and heads that need a code object read in full. Where nothing is there any more, the
    /// last code object known at the address is the answer (in `out`).
    fn sort_heads(
        &mut self,
        rt: &Runtime,
        addrs: &[u64],
        stale: &[usize],
        heads: &mut Heads,
        out: &mut [Option<Arc<CodeInfo>>],
    ) -> (Same, ToRead) {
        let mut same = Vec::new();
        let mut read = Vec::new();
        for (&i, head) in stale.iter().zip(std::mem::take(&mut heads.heads)) {
            let a = addrs[i];
            let code_type = rt.code_type;
            let Some(head) = head.filter(|h| {
                !code::freed(&rt.layout, h)
                    && (code_type == 0
                        || code::ident(&rt.layout, h).is_some_and(|id| id[0] == code_type))
            }) else {
                // Nothing can be read there now, or no code object: the memory went back to
                // the system or the allocator, or holds another kind of object now, or the
                // process has exited (its last records are read after it). The last code
                // object known at the address is what ran there (a module body that ended
                // moments ago); a copy of the head taken at the sample, where there is one, is
                // checked against it. Only another code object there ends what is known.
                // The frame walk must copy what runs there next: another code object may get
                // the address.
                self.settled.remove(&a);
                out[i] = self.codes.get(&a).map(|(c, _)| {
                    self.gone.push(a);
                    c.clone()
                });
                continue;
            };
            let known = code::ident(&rt.layout, &head)
                .is_some_and(|id| self.codes.get(&a).is_some_and(|(c, _)| c.ident == id));
            if known {
                let name = code::name_ptr(&rt.layout, &head).unwrap_or(0);
                let file = le_u64(&head, rt.layout.code_filename).unwrap_or(0);
                same.push((i, head, [name, file]));
            } else {
                read.push((i, head));
            }
        }
        (same, read)
    }

    /// The same identity is not the same object: code made and freed over and over (`exec` in
    /// a loop) gets the same memory, its strings included, with other contents. One read of the
    /// name and file strings of every such entry tells: an entry whose strings agree is
    /// believed for `epoch`, and one whose do not is retired and its head read in full.
    #[allow(clippy::too_many_arguments)]
    fn check_strings(
        &mut self,
        rt: &Runtime,
        addrs: &[u64],
        epoch: u64,
        same: Same,
        mut heads: Heads,
        out: &mut [Option<Arc<CodeInfo>>],
        read: &mut ToRead,
    ) {
        let mut copies: Vec<Option<Vec<u8>>> = Vec::with_capacity(same.len() * 2);
        let mut unread = Vec::new();
        for (k, &(i, _, pointers)) in same.iter().enumerate() {
            let guesses = &mut heads.guesses;
            let guess = heads
                .guessed
                .get(&i)
                .filter(|(at, _)| *at == pointers)
                // Each pair is used once: moved out, not copied.
                .and_then(|&(_, g)| {
                    let name = guesses.get_mut(g)?.take()?;
                    Some((name, guesses.get_mut(g + 1)?.take()?))
                });
            match guess {
                Some((name, file)) => copies.extend([Some(name), Some(file)]),
                None => {
                    copies.extend([None, None]);
                    unread.push(k);
                }
            }
        }
        if !unread.is_empty() {
            let strings: Vec<(u64, usize)> = unread
                .iter()
                .flat_map(|&k| {
                    let [name, file] = same[k].2;
                    [
                        (name, profiler_common::PY_NAME_SNAP),
                        (file, profiler_common::PY_FILE_SNAP),
                    ]
                })
                .collect();
            let more = rt.remote.read_many(&strings);
            for (&k, pair) in unread.iter().zip(more.chunks(2)) {
                copies[2 * k] = pair[0].clone();
                copies[2 * k + 1] = pair.get(1).cloned().flatten();
            }
        }
        for ((i, head, [name, file]), pair) in same.into_iter().zip(copies.chunks(2)) {
            let a = addrs[i];
            let Some((c, e)) = self.codes.get_mut(&a) else {
                continue;
            };
            let l = &rt.layout;
            let agrees = |ptr: u64, copy: &Option<Vec<u8>>, known: &str| {
                copy.as_deref()
                    .is_none_or(|b| code::copy_agrees(l, ptr, b, rt.str_type, known))
            };
            if agrees(name, &pair[0], &c.name) && agrees(file, &pair[1], &c.file) {
                *e = match self.settled.contains(&a) {
                    true => epoch + SETTLED_EPOCHS,
                    false => epoch,
                };
                out[i] = Some(c.clone());
            } else {
                self.retire(a);
                read.push((i, head));
            }
        }
    }

    /// Whether code object `info` at `addr`, as the frame walk copied it at a sample at
    /// `time_ns`, can go into the BPF side's `KNOWN_CODES` (which stops the copies): it is what
    /// is at the address now (validated in `epoch`), and it has been there, the same object,
    /// for `SETTLED_NS` of samples. Code made and freed over and over (`exec` in a loop) gets
    /// the same addresses, its strings' included, and only a copy taken at the sample tells
    /// one of these objects from the next: it is copied as long as it lives.
    pub fn settled(&mut self, addr: u64, info: &Arc<CodeInfo>, time_ns: u64, epoch: u64) -> bool {
        if !matches!(self.codes.get(&addr), Some((c, e)) if *e >= epoch && Arc::ptr_eq(c, info)) {
            return false;
        }
        if self.young.len() >= MAX_CODES {
            self.young.clear();
        }
        match self.young.get(&addr) {
            Some((t, c)) if Arc::ptr_eq(c, info) => {
                let settled = time_ns.saturating_sub(*t) >= SETTLED_NS;
                if settled && self.settled.insert(addr) {
                    if let Some((_, e)) = self.codes.get_mut(&addr) {
                        *e = epoch + SETTLED_EPOCHS;
                    }
                }
                settled
            }
            _ => {
                self.young.insert(addr, (time_ns, info.clone()));
                false
            }
        }
    }

    /// Moves what was known at `a` to the retired code objects.
    fn retire(&mut self, a: u64) {
        self.young.remove(&a);
        self.settled.remove(&a);
        if let Some((c, _)) = self.codes.remove(&a) {
            self.gone.push(a);
            if self.retired.len() >= MAX_CODES / 4 {
                self.retired.clear();
            }
            self.retired.insert((a, c.ident), c);
        }
    }

    /// The code object a frame ran at the sampled instant, from the head the BPF program
    /// copied then (`snap`) and what was read at its address since (`now`): `now` when it is the
    /// same object; otherwise (freed, or its memory reused by another code object) the copy,
    /// with its name and file from the copies of their strings taken with it, else read from
    /// the target and checked against those copies.
    pub fn sampled_code(
        &self,
        rt: &Runtime,
        addr: u64,
        snap: &profiler_common::CodeSnap,
        now: Option<Arc<CodeInfo>>,
    ) -> Option<Arc<CodeInfo>> {
        let head = &snap.head[..code::header_len(&rt.layout).min(profiler_common::PY_CODE_SNAP)];
        let Some(id) = code::ident(&rt.layout, head) else {
            return now;
        };
        if let Some(ci) = &now {
            if ci.ident == id && self.copies_agree(rt, ci, head, snap) {
                return now;
            }
        }
        // A failed copy has a zero type word: nothing to go by but what is there now.
        if id[0] == 0 || (rt.code_type != 0 && id[0] != rt.code_type) {
            return now;
        }
        if let Some(c) = self.retired.get(&(addr, id)) {
            if self.copies_agree(rt, c, head, snap) {
                return Some(c.clone());
            }
        }
        let mut c = code::read_code(
            &rt.remote,
            &rt.layout,
            head,
            code::Types {
                code: rt.code_type,
                str: rt.str_type,
            },
            code::StringCopies {
                name: Some(&snap.name),
                file: Some(&snap.file),
            },
        )?;
        // The line table went with the code object: its bytes may be anything now. The frame
        // shows the function's first line.
        c.linetable.clear();
        Some(Arc::new(c))
    }

    /// Whether what is known of a code object agrees with the copies of its name and file name
    /// taken at a sample (those that were copied whole). The same address, type and string
    /// addresses are not enough: a program that makes and frees alike code objects over and
    /// over (modules run by `exec`) gets the same memory, its strings included, each time.
    fn copies_agree(
        &self,
        rt: &Runtime,
        ci: &CodeInfo,
        head: &[u8],
        snap: &profiler_common::CodeSnap,
    ) -> bool {
        let l = &rt.layout;
        let (Some(name_ptr), Some(file_ptr)) =
            (code::name_ptr(l, head), le_u64(head, l.code_filename))
        else {
            return true;
        };
        code::copy_agrees(l, name_ptr, &snap.name, rt.str_type, &ci.name)
            && code::copy_agrees(l, file_ptr, &snap.file, rt.str_type, &ci.file)
    }

    /// Whether frame `f`'s code, as copied at the sample (if it was), was an object of another
    /// type than code: the frame was not one (a chain read while it was being linked).
    pub fn snap_not_code(
        &self,
        rt: &Runtime,
        f: &profiler_common::PyFrame,
        snaps: &[profiler_common::CodeSnap],
    ) -> bool {
        let Some(snap) = ((f.flags >> PY_FRAME_SNAP_SHIFT) as usize & 0xff)
            .checked_sub(1)
            .and_then(|k| snaps.get(k))
        else {
            return false;
        };
        let head = &snap.head[..code::header_len(&rt.layout).min(profiler_common::PY_CODE_SNAP)];
        // A failed copy has a zero type word.
        code::ident(&rt.layout, head)
            .is_some_and(|id| id[0] != 0 && rt.code_type != 0 && id[0] != rt.code_type)
    }

    /// The frame of code object `c` (at `addr`) at instruction `instr`, with the opcode byte
    /// there when `with_opcode`.
    pub fn frame_for(
        &mut self,
        rt: &Runtime,
        out: &mut impl ProfileSink,
        addr: u64,
        c: &Arc<CodeInfo>,
        instr: i32,
        with_opcode: bool,
    ) -> FrameRef {
        if with_opcode {
            return self.make_frame(rt, out, addr, c, instr, true).0;
        }
        if let Some((named, f, corrupt)) = self.named.get(&(addr, instr)) {
            // The same object: a weak entry keeps its allocation, so no other object can have
            // its address.
            if std::ptr::eq(named.as_ptr(), Arc::as_ptr(c)) {
                if *corrupt {
                    out.count(PyEvent::BadLineTable);
                }
                return *f;
            }
        }
        let (f, corrupt) = self.make_frame(rt, out, addr, c, instr, false);
        if self.named.len() >= MAX_NAMED {
            self.named.clear();
        }
        self.named
            .insert((addr, instr), (Arc::downgrade(c), f, corrupt));
        f
    }

    /// `frame_for` from its tables: the function, the line and the frame; and whether the line
    /// table was corrupt.
    fn make_frame(
        &mut self,
        rt: &Runtime,
        out: &mut impl ProfileSink,
        addr: u64,
        c: &CodeInfo,
        instr: i32,
        with_opcode: bool,
    ) -> (FrameRef, bool) {
        let func = match self.funcs.get(&(addr, c.ident)) {
            Some((f, name, file)) if *name == c.name && *file == c.file => *f,
            _ => {
                let f = out.python_function(&c.name, &c.file, c.firstlineno);
                self.funcs
                    .insert((addr, c.ident), (f, c.name.clone(), c.file.clone()));
                f
            }
        };
        let (line, corrupt) = code::line_of(rt.layout.minor, c, instr);
        if corrupt {
            out.count(PyEvent::BadLineTable);
        }
        let byte = with_opcode
            .then(|| opcodes::read(&rt.remote, &rt.layout, addr, instr))
            .flatten();
        let minor = rt.layout.minor;
        let f = *self.frames.entry((func, line, byte)).or_insert_with(|| {
            out.python_frame(func, line, byte.and_then(|b| opcodes::name(minor, b)))
        });
        (f, corrupt)
    }
}

impl PyProcess {
    /// The code objects at `addrs` (`CodeCache::code`), noting asyncio's `Handle._run` when it
    /// is wanted and read for the first time.
    pub(super) fn code(&mut self, addrs: &[u64], epoch: u64) -> Vec<Option<Arc<CodeInfo>>> {
        let asyncio = &mut self.asyncio;
        self.cache.code(&self.rt, addrs, epoch, &mut |a, c| {
            if asyncio.handle_run_wanted && asyncio.handle_run == 0 && is_handle_run(c) {
                asyncio.handle_run = a;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::remote::Remote;
    use crate::python::layout;

    /// Functions and frames by content, as the profile keeps them; counts what it made and the
    /// corrupt line tables.
    #[derive(Default)]
    struct Sink {
        made: Vec<(String, Option<u32>)>,
        calls: usize,
        bad_tables: usize,
    }

    impl Sink {
        fn intern(&mut self, e: (String, Option<u32>)) -> FrameRef {
            self.calls += 1;
            match self.made.iter().position(|m| *m == e) {
                Some(i) => i,
                None => {
                    self.made.push(e);
                    self.made.len() - 1
                }
            }
        }
    }

    impl ProfileSink for Sink {
        fn python_function(&mut self, name: &Arc<str>, _: &Arc<str>, _: u32) -> FrameRef {
            self.intern((name.to_string(), None))
        }
        fn python_frame(
            &mut self,
            func: FrameRef,
            line: u32,
            _: Option<opcodes::Opcode>,
        ) -> FrameRef {
            let name = self.made[func].0.clone();
            self.intern((name, Some(line)))
        }
        fn task_frame(&mut self, _: &str) -> FrameRef {
            unreachable!()
        }
        fn unresolved_frame(&mut self) -> FrameRef {
            unreachable!()
        }
        fn count(&mut self, event: PyEvent) {
            if event == PyEvent::BadLineTable {
                self.bad_tables += 1;
            }
        }
    }

    fn code(name: &str, first: u32, linetable: Vec<u8>) -> Arc<CodeInfo> {
        Arc::new(CodeInfo {
            name: Arc::from(name),
            file: Arc::from("app.py"),
            firstlineno: first,
            linetable,
            ident: [1, 2, 3],
            name_ptr: 2,
            lines: Default::default(),
        })
    }

    fn runtime() -> Runtime {
        Runtime {
            remote: Remote { pid: 0 },
            layout: layout::builtin(12).unwrap(),
            addr: 0,
            none_addr: 0,
            code_type: 0,
            str_type: 0,
            long_type: 0,
        }
    }

    #[test]
    fn frames_named_again_are_those_named_first_and_only_for_the_same_object() {
        let rt = runtime();
        let mut cache = CodeCache::default();
        let mut out = Sink::default();
        // A 3.12 location table: 2 code units one line past the first (one-line form 11, with
        // its two column bytes), then 2 more two lines past that (form 12).
        let table = vec![0x80 | (11 << 3) | 1, 0, 0, 0x80 | (12 << 3) | 1, 0, 0];
        let f = code("f", 10, table.clone());
        let at = 0x7000_0000;
        let first: Vec<FrameRef> = (0..4)
            .map(|i| cache.frame_for(&rt, &mut out, at, &f, i, false))
            .collect();
        let calls = out.calls;
        // Named again: the same frames, without asking the profile again.
        for round in 0..3 {
            for i in 0..4 {
                let again = cache.frame_for(&rt, &mut out, at, &f, i, false);
                assert_eq!(again, first[i as usize], "round {round} instruction {i}");
            }
        }
        assert_eq!(out.calls, calls);
        assert_eq!(out.made[first[0]], ("f".to_string(), Some(11)));
        assert_eq!(out.made[first[3]], ("f".to_string(), Some(13)));
        // Another object at the same address (its identity the same, its name not): its own
        // function and frame, never the one named for the object before it.
        let g = code("g", 20, table);
        let other = cache.frame_for(&rt, &mut out, at, &g, 0, false);
        assert_ne!(other, first[0]);
        assert_eq!(out.made[other], ("g".to_string(), Some(21)));
        // The first object again (it is still alive): its own frame.
        assert_eq!(cache.frame_for(&rt, &mut out, at, &f, 0, false), first[0]);
        // A new profile: the old ids are void, so frames are made again.
        cache.new_profile();
        let before = out.calls;
        let renamed = cache.frame_for(&rt, &mut out, at, &f, 0, false);
        assert_eq!(out.calls, before + 2);
        assert_eq!(out.made[renamed], ("f".to_string(), Some(11)));
    }

    #[test]
    fn a_corrupt_line_table_is_counted_at_every_frame_named_from_it() {
        let rt = runtime();
        let mut cache = CodeCache::default();
        let mut out = Sink::default();
        let t = crate::python::code::tests::overflowing_location_table();
        let f = code("f", 1, t);
        for _ in 0..3 {
            cache.frame_for(&rt, &mut out, 0x7000_0000, &f, 4, false);
        }
        assert_eq!(out.bad_tables, 3);
    }
}
