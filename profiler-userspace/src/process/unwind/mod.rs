//! DWARF CFI unwinding of a copied user stack: framehop, then for the frames it cannot take,
//! the file's own rule (`cfi`), then a checked scan of the stack for the next return
//! address.

pub mod banks;
pub mod cfi;

use framehop::FrameAddress;

use profiler_common::SAMPLE_USTACK_SHORT;

use super::remote::Remote;
use super::{module_at, Module, Process};
use crate::capture::record::RawSample;
use cfi::{Regs, Step};

pub use isa::{Cache, NativeUnwinder};

/// framehop's unwinder for the architecture built for, and our `Regs` in and out of its
/// register set.
#[cfg(not(target_arch = "aarch64"))]
mod isa {
    use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};

    use super::cfi::Regs;
    use crate::stack::elf::FileBytes;

    pub type NativeUnwinder = UnwinderX86_64<FileBytes>;
    pub type Cache = CacheX86_64;

    pub fn regs_in(r: Regs) -> UnwindRegsX86_64 {
        UnwindRegsX86_64::new(r.ip, r.sp, r.bp)
    }

    pub fn regs_out(ra: u64, r: &UnwindRegsX86_64) -> Regs {
        Regs {
            ip: ra,
            sp: r.sp(),
            bp: r.bp(),
            lr: 0,
        }
    }
}

/// arm64: framehop takes the link register for a leaf that has not saved it; only the sampled
/// frame knows it (`Regs::lr` is 0 above).
#[cfg(target_arch = "aarch64")]
mod isa {
    use framehop::aarch64::{CacheAarch64, UnwindRegsAarch64, UnwinderAarch64};

    use super::cfi::Regs;
    use crate::stack::elf::FileBytes;

    pub type NativeUnwinder = UnwinderAarch64<FileBytes>;
    pub type Cache = CacheAarch64;

    pub fn regs_in(r: Regs) -> UnwindRegsAarch64 {
        UnwindRegsAarch64::new(r.lr, r.sp, r.bp)
    }

    pub fn regs_out(ra: u64, r: &UnwindRegsAarch64) -> Regs {
        Regs {
            ip: ra,
            sp: r.sp(),
            bp: r.fp(),
            lr: 0,
        }
    }
}

/// One framehop step: the caller's return address (without pointer-authentication bits) and
/// registers, `Ok(None)` at the root.
fn step<F: FnMut(u64) -> Result<u64, ()>>(
    unwinder: &NativeUnwinder,
    cache: &mut Cache,
    addr: FrameAddress,
    r: Regs,
    read: &mut F,
) -> Result<Option<(u64, Regs)>, framehop::Error> {
    use framehop::Unwinder;
    let mut regs = isa::regs_in(r);
    Ok(unwinder
        .unwind_frame(addr, &mut regs, cache, read)?
        .map(|ra| {
            let ra = cfi::strip_pac(ra);
            (ra, isa::regs_out(ra, &regs))
        }))
}

/// Native frames deeper than this are cut (and the stack marked truncated).
pub const MAX_NATIVE_FRAMES: usize = 1024;

/// Stack words looked at for a return address above a frame no rule unwinds: 64 KiB, the
/// largest copy (OpenBLAS kernels keep a 28 KiB buffer, aligned to a page, below theirs).
const SCAN_WORDS: u64 = 8192;
/// Return addresses found by the scan that are tried (each must lead to the thread's root),
/// and the frames all those trials may walk. A buffer a function reserved holds the stale
/// return addresses of earlier, deeper calls: the 28 KiB below an OpenBLAS kernel's frame held
/// 9 to 20 of them, each failing within 3 frames.
const SCAN_CANDIDATES: usize = 256;
/// Scan hints kept per process (`Process::scan_hints`) before they are dropped and relearned.
const SCAN_HINTS: usize = 4096;
pub const SCAN_FRAMES: usize = 4096;

/// How far above the sampled stack pointer the stack may be read from the live thread when the
/// copy ended at its size limit (`LateStack`), and the pages one sample may read so.
const LATE_REACH: u64 = 4 << 20;
const LATE_PAGES: usize = 64;
const PAGE: u64 = 4096;

/// The stack beyond the sample's copy, read from the live thread when the unwinder needs it.
///
/// A function with a frame larger than the copy (OpenBLAS's parallel LU keeps 541 KiB of
/// locals) leaves every caller beyond it. While that function has not returned, its callers'
/// frames do not change, so the words above it read a few milliseconds later are the ones of
/// the sample's instant. When it has returned, what is read is another instant's: the frames
/// found there must reach the thread's root (`unwind_user`), and a caller that knows the
/// thread's frames (the interpreter's activations) refutes them when they disagree
/// (`Unwound::refute_late`).
struct LateStack {
    /// The live thread's memory; none when `pages` is a memo's (nothing else is read).
    remote: Option<Remote>,
    /// The copy's end, and the farthest address read.
    from: u64,
    until: u64,
    pages: LatePages,
}

type LatePages = rustc_hash::FxHashMap<u64, Option<std::sync::Arc<[u8]>>>;

/// The stack beyond a sample's copy as it was read for an unwind the interpreter's frames
/// confirmed, kept per thread (`Process::late_memos`).
///
/// A loop that calls the same deep native code from the same Python line (`np.linalg.inv` in
/// a loop: `dgetrf_parallel`'s 541 KiB frame puts its callers beyond any copy) has the same
/// frames beyond the copy in every call. A sample read late, once the thread had left the
/// call, finds other words there, and its unwind is refuted: 15-25% of such a loop's samples
/// were cut so. Those are unwound again from the memo, when the frame at the copy's end is
/// where it was when the memo was taken (the same stack pointer and CFA); the interpreter's
/// frames check the result as they check any late read.
#[derive(Clone)]
pub struct LateMemo {
    /// The frame at the copy's end: its stack pointer and its caller's (its CFA; 0 where the
    /// unwind ended there). Not its address: a function with a frame that large (OpenBLAS's
    /// `dgetrf_parallel`) calls several others, and the stack beyond it is the same whichever
    /// one the sample was in.
    edge: (u64, u64),
    pages: LatePages,
}

/// `LateMemo`s kept per thread (the newest, each at another frame), and threads a process
/// keeps them for (then they are dropped and retaken).
const LATE_MEMOS: usize = 4;
const LATE_MEMO_THREADS: usize = 64;

impl LateStack {
    fn read(&mut self, addr: u64) -> Option<u64> {
        if addr < self.from || addr.checked_add(8)? > self.until {
            return None;
        }
        let page = addr & !(PAGE - 1);
        if !self.pages.contains_key(&page) {
            let remote = self.remote?;
            if self.pages.len() >= LATE_PAGES {
                return None;
            }
            let bytes = remote.read(page, PAGE as usize).map(Into::into);
            self.pages.insert(page, bytes);
        }
        let bytes = self.pages.get(&page)?.as_deref()?;
        let off = (addr - page) as usize;
        // A word across two pages is not needed: stack words are 8-aligned.
        Some(u64::from_le_bytes(
            bytes.get(off..off + 8)?.try_into().ok()?,
        ))
    }
}

/// The last unwind of a thread that its rules alone took to the root, with the stack copy it
/// read (`Process::suffixes`).
///
/// A thread's outer frames stay while its inner ones change: under a Python thread's
/// innermost eval loop, the interpreter's start-up calls down to `_start` are the same frames
/// at the same stack pointers in every sample. A frame whose registers equal one of the memo's,
/// above which the copy holds the same bytes as the memo's (up to the same end), has the same
/// callers: a step reads only the registers and the stack above the frame, so each step from
/// there would find what the memo's did. Its callers are taken from the memo instead of being
/// unwound again (half of the handler's instructions went to unwinding).
pub struct SuffixMemo {
    frames: Vec<Frame>,
    /// The copy's stack pointer and bytes.
    sp: u64,
    stack: Vec<u8>,
}

impl SuffixMemo {
    /// The memo's callers of `f`, when `f` is one of its frames with the same stack above it
    /// in the copy at `sp` (which must end where the memo's does).
    fn callers(&self, f: &Frame, sp: u64, stack: &[u8]) -> Option<&[Frame]> {
        let j = self
            .frames
            .iter()
            .position(|m| m.regs == f.regs && m.addr == f.addr)?;
        if self.sp.checked_add(self.stack.len() as u64)? != sp.checked_add(stack.len() as u64)? {
            return None;
        }
        let here = stack.get(usize::try_from(f.regs.sp.checked_sub(sp)?).ok()?..)?;
        let then = self
            .stack
            .get(usize::try_from(f.regs.sp.checked_sub(self.sp)?).ok()?..)?;
        (here == then).then(|| &self.frames[j + 1..])
    }
}

/// Threads a process keeps a `SuffixMemo` for (then they are dropped and retaken), and the
/// largest copy kept as one (a Python thread's stack in use is a few KiB): 2 MiB a process at
/// most, whatever its threads.
const SUFFIX_THREADS: usize = 64;
const SUFFIX_BYTES: usize = 32 << 10;

/// A user-space frame address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserFrame {
    pub addr: u64,
    /// A return address (symbolize `addr - 1`), not the interrupted instruction.
    pub is_return: bool,
}

impl UserFrame {
    pub fn lookup_addr(&self) -> u64 {
        if self.is_return {
            self.addr.saturating_sub(1)
        } else {
            self.addr
        }
    }
}

pub struct Unwound {
    /// Innermost first.
    pub frames: Vec<UserFrame>,
    /// The unwind stopped before reaching the root (stack copy too short, no unwind info, ...).
    pub truncated: bool,
    /// The first frame found by scanning the stack (`Walker::scan`), if any: from there on
    /// the frames are a checked guess, which the caller may refute (`Unwound::refute_scan`).
    pub scanned_from: Option<usize>,
    /// The first frame unwound from stack read after the sample (`LateStack`), if any.
    pub late_from: Option<usize>,
    /// The stack slot whose return address the scan took (for `unwind_user`'s `skip`).
    pub scan_slot: Option<u64>,
    /// The stack beyond the copy that this unwind read, if any (to keep as a `LateMemo` once
    /// the interpreter's frames confirm the unwind).
    pub late_read: Option<LateMemo>,
    /// The unwind reached the thread's root (before any refutation).
    pub rooted: bool,
}

impl Unwound {
    /// No user stack.
    pub fn empty() -> Unwound {
        Unwound {
            frames: Vec::new(),
            truncated: false,
            scanned_from: None,
            late_from: None,
            scan_slot: None,
            late_read: None,
            rooted: false,
        }
    }

    /// The stack beyond the copy this unwind read, kept for `tid`'s next samples that leave
    /// the copy at the same frame: for a caller that found the unwind right (its eval-loop
    /// frames pair with the interpreter's frames).
    pub fn keep_late(&mut self, process: &mut Process, tid: u32) {
        if self.late_from.is_none() {
            return;
        }
        let Some(m) = self.late_read.take() else {
            return;
        };
        if process.late_memos.len() >= LATE_MEMO_THREADS && !process.late_memos.contains_key(&tid) {
            process.late_memos.clear();
        }
        let memos = process.late_memos.entry(tid).or_default();
        memos.retain(|k| k.edge != m.edge);
        if memos.len() == LATE_MEMOS {
            memos.remove(0);
        }
        memos.push(m);
    }

    /// Drops what the stack scan found: a caller that knows better (the interpreter's own
    /// frames disagree with the eval-loop frames found) keeps only what rules unwound.
    pub fn refute_scan(&mut self) {
        if let Some(i) = self.scanned_from.take() {
            self.frames.truncate(i);
            self.truncated = true;
        }
    }

    /// Drops what follows the first frame without unwind information: framehop answers such a
    /// frame with a guess (a leaf's return address at its stack pointer, else its frame
    /// pointer), and in a large frame a function reserved and never filled (OpenBLAS's
    /// `dgetrf_parallel` keeps 541 KiB) the guess reads a stale return address, from which the
    /// rules unwind a stale chain all the way to the root: the interpreter's start-up calls
    /// that once ran at that depth. For a caller that knows the chain is wrong (rooted, yet
    /// without the eval-loop frames the thread's Python frames need). Checks one address per
    /// frame, so it is meant for that rare case, not for every sample.
    pub fn refute_guesses(&mut self, process: &mut Process) {
        let n = self.frames.len();
        let first = (0..n.saturating_sub(1)).find(|&i| !has_unwind_info(process, self.frames[i]));
        if let Some(i) = first {
            self.frames.truncate(i + 1);
            self.truncated = true;
            if self.scanned_from.is_some_and(|s| s > i) {
                self.scanned_from = None;
            }
            if self.late_from.is_some_and(|l| l > i) {
                self.late_from = None;
            }
        }
    }

    /// Drops the frames unwound from stack read after the sample.
    pub fn refute_late(&mut self) {
        if let Some(i) = self.late_from.take() {
            self.frames.truncate(i);
            self.truncated = true;
            if self.scanned_from.is_some_and(|s| s >= i) {
                self.scanned_from = None;
            }
        }
    }
}

/// A frame and the registers valid in it.
#[derive(Clone, Copy)]
struct Frame {
    addr: FrameAddress,
    regs: Regs,
}

struct Walker<'a, 'r> {
    unwinder: &'a NativeUnwinder,
    cache: &'a mut banks::RuleCaches,
    /// For the interrupted instruction (`Process::leaf_cache`).
    leaf_cache: &'a mut banks::RuleCaches,
    modules: &'a [Module],
    roots: &'a mut rustc_hash::FxHashSet<u64>,
    hints: &'a mut rustc_hash::FxHashMap<u64, u64>,
    cfi_context: &'a mut gimli::UnwindContext<usize>,
    /// Frames the scan's trials may still walk (`SCAN_FRAMES`).
    budget: usize,
    /// Where the frames the scan found begin, and the slot of the return address it took.
    scanned_from: Option<usize>,
    scan_slot: Option<u64>,
    /// Slots the scan passes over: their chains were refuted (`unwind_user`).
    skip: &'r [u64],
    /// The scan takes only a return address into the file of the frame it scans above.
    same_file: bool,
    read: &'r mut dyn FnMut(u64) -> Option<u64>,
    /// The thread's last rule-only unwind, and the sample's copy (`SuffixMemo::callers`).
    suffix: Option<&'a SuffixMemo>,
    copy: (u64, &'r [u8]),
    /// The unwind ended with the memo's frames.
    suffix_used: bool,
}

/// Unwinds the sample's user stack. `skip`: stack slots the scan must not take (their return
/// addresses led to chains the caller refuted; `Unwound::scan_slot`). `memo`: the stack beyond
/// the copy is taken from it instead of the live thread, and the unwind counts only if it
/// leaves the copy at the memo's edge. With either, the scan takes only a return address into
/// the file of the frame it scans above: a function without unwind information is
/// hand-written assembly its own library calls (OpenBLAS's kernels, under its drivers), and
/// among the stale return addresses in a kernel's buffer, some into other files (numpy's ufunc
/// loop, which called an earlier kernel through a pointer) still lead to the root with the
/// eval-loop frames the interpreter's frames need, skipping every frame between.
///
/// `scan_frames`: the frames the scan's trials may walk, counted down (`SCAN_FRAMES` for one
/// unwind; the unwinds of one sample that are tried in turn share theirs, as the stack they
/// scan is the target's, and anything may be in it).
pub fn unwind_user(
    process: &mut Process,
    s: &RawSample,
    skip: &[u64],
    memo: Option<&LateMemo>,
    scan_frames: &mut usize,
) -> Unwound {
    if s.ip == 0 {
        return Unwound::empty();
    }
    let copy_end = s.sp.saturating_add(s.stack.len() as u64);
    // Only a copy cut at its size limit has more stack beyond it (a short one met the top).
    let mut late = (!s.stack.is_empty() && s.flags & SAMPLE_USTACK_SHORT == 0).then(|| LateStack {
        remote: memo.is_none().then_some(Remote { pid: s.pid }),
        from: copy_end,
        until: s.sp.saturating_add(LATE_REACH),
        pages: memo.map(|m| m.pages.clone()).unwrap_or_default(),
    });
    let mut read = |addr: u64| {
        s.read_stack(addr)
            .or_else(|| late.as_mut().and_then(|l| l.read(addr)))
    };
    let mut w = Walker {
        unwinder: &process.unwinder,
        cache: &mut process.cache,
        leaf_cache: &mut process.leaf_cache,
        modules: &process.modules,
        roots: &mut process.roots,
        hints: &mut process.scan_hints,
        cfi_context: &mut process.cfi_context,
        budget: *scan_frames,
        scanned_from: None,
        scan_slot: None,
        skip,
        same_file: !skip.is_empty() || memo.is_some(),
        read: &mut read,
        // Only for the first unwind of a sample: the others differ from a plain one.
        suffix: (skip.is_empty() && memo.is_none())
            .then(|| process.suffixes.get(&s.tid))
            .flatten(),
        copy: (s.sp, &s.stack),
        suffix_used: false,
    };
    // Sized for a Python thread's usual depth: grown from one, it was reallocated and copied
    // five times a sample.
    let mut frames = Vec::with_capacity(64);
    frames.push(Frame {
        addr: FrameAddress::InstructionPointer(s.ip),
        regs: Regs {
            ip: s.ip,
            sp: s.sp,
            bp: s.bp,
            lr: s.lr,
        },
    });
    let rooted = w.walk(&mut frames, true);
    let walked = Walked {
        rooted,
        scanned_from: w.scanned_from,
        scan_slot: w.scan_slot,
        suffix_used: w.suffix_used,
    };
    *scan_frames = w.budget;
    finish_unwind(process, s, skip, memo, late, frames, walked)
}

/// What the walk of `unwind_user` found, beside its frames.
struct Walked {
    rooted: bool,
    scanned_from: Option<usize>,
    scan_slot: Option<u64>,
    suffix_used: bool,
}

/// The unwind of `s` once walked: what was read beyond the copy, whether a memo still holds,
/// the thread's new memo, and the frames as `Unwound`.
fn finish_unwind(
    process: &mut Process,
    s: &RawSample,
    skip: &[u64],
    memo: Option<&LateMemo>,
    late: Option<LateStack>,
    frames: Vec<Frame>,
    walked: Walked,
) -> Unwound {
    let Walked {
        rooted,
        scanned_from,
        scan_slot,
        suffix_used,
    } = walked;
    let copy_end = s.sp.saturating_add(s.stack.len() as u64);
    // The first frame whose return address was read beyond the copy: its caller's stack
    // pointer (its CFA) is past the copy's end.
    let late_from = frames
        .iter()
        .position(|f| f.regs.sp >= copy_end.saturating_add(8))
        .filter(|_| late.as_ref().is_some_and(|l| !l.pages.is_empty()));
    // The stack beyond the copy as read, and the last frame inside the copy.
    let late_read = late.filter(|l| !l.pages.is_empty()).and_then(|l| {
        let at = frames.iter().rposition(|f| f.regs.sp < copy_end)?;
        let cfa = frames.get(at + 1).map_or(0, |f| f.regs.sp);
        Some(LateMemo {
            edge: (frames[at].regs.sp, cfa),
            pages: l.pages,
        })
    });
    let memo_kept = match (memo, &late_read) {
        (None, _) => true,
        (Some(m), Some(r)) => m.edge == r.edge,
        (Some(_), None) => false,
    };
    let rooted = rooted && memo_kept;
    // An unwind its rules alone took to the root, from the copy alone: the thread's memo.
    if rooted
        && !suffix_used
        && skip.is_empty()
        && memo.is_none()
        && scanned_from.is_none()
        && late_read.is_none()
        && late_from.is_none()
        && frames.len() > 2
        && s.stack.len() <= SUFFIX_BYTES
    {
        keep_suffix(process, s, &frames);
    }
    let mut u = Unwound {
        frames: frames
            .iter()
            .map(|f| UserFrame {
                addr: f.addr.address(),
                is_return: f.addr.is_return_address(),
            })
            .collect(),
        truncated: !rooted,
        scanned_from,
        late_from,
        scan_slot,
        late_read,
        rooted,
    };
    // Frames read after the sample are believed only when they lead to the thread's root.
    if !rooted {
        u.refute_late();
    }
    u
}

/// Keeps `frames`, a rule-only unwind of `s` to the root, as its thread's `SuffixMemo`.
fn keep_suffix(process: &mut Process, s: &RawSample, frames: &[Frame]) {
    if process.suffixes.len() >= SUFFIX_THREADS && !process.suffixes.contains_key(&s.tid) {
        process.suffixes.clear();
    }
    let m = process.suffixes.entry(s.tid).or_insert_with(|| SuffixMemo {
        frames: Vec::new(),
        sp: 0,
        stack: Vec::new(),
    });
    // The memo's buffers are reused: a thread whose outer frames change takes a new one often.
    m.frames.clear();
    m.frames.extend_from_slice(frames);
    m.sp = s.sp;
    m.stack.clear();
    m.stack.extend_from_slice(&s.stack);
}

/// Whether a unwind rule of the frame's file covers it (its own, or an `.eh_frame` entry).
fn has_unwind_info(process: &mut Process, f: UserFrame) -> bool {
    let lookup = f.lookup_addr();
    let Some(m) = module_at(&process.modules, lookup) else {
        return false;
    };
    let Some(elf) = m.elf.as_ref() else {
        return false;
    };
    let svma = lookup.wrapping_sub(m.bias);
    let regs = Regs {
        ip: lookup,
        sp: 0,
        bp: 0,
        lr: 0,
    };
    elf.needs_own_rule(svma)
        || elf.cfi_step(svma, regs, &mut |_| None, &mut process.cfi_context) != Step::NoInfo
}

impl<'a> Walker<'a, '_> {
    /// Unwinds from the last of `frames` outward; true when the thread's root was reached.
    fn walk(&mut self, frames: &mut Vec<Frame>, scan: bool) -> bool {
        while frames.len() < MAX_NATIVE_FRAMES {
            let Some(&f) = frames.last() else {
                return false;
            };
            if let Some(rest) = self
                .suffix
                .and_then(|m| m.callers(&f, self.copy.0, self.copy.1))
            {
                // As the memo's unwind ended: at the root, within the frame limit.
                if frames.len() + rest.len() <= MAX_NATIVE_FRAMES {
                    frames.extend_from_slice(rest);
                    self.suffix_used = true;
                    return true;
                }
            }
            if !scan {
                if self.budget == 0 {
                    return false;
                }
                self.budget -= 1;
            }
            // A function whose rule framehop would answer with a frame-pointer guess.
            let own = self.needs_own_rule(f);
            if !own {
                let mut read = |a: u64| (self.read)(a).ok_or(());
                let caches = if f.addr.is_return_address() {
                    &mut *self.cache
                } else {
                    &mut *self.leaf_cache
                };
                let cache = caches.bank(f.addr.address());
                match step(self.unwinder, cache, f.addr, f.regs, &mut read) {
                    Ok(Some((ra, regs))) => {
                        let Some(addr) = FrameAddress::from_return_address(ra) else {
                            return false;
                        };
                        frames.push(Frame { addr, regs });
                        continue;
                    }
                    // framehop also ends where a guessed return address or frame pointer is
                    // zero; only a frame whose own rule says it is the outermost ends an unwind.
                    Ok(None) if self.roots.contains(&f.addr.address()) => return true,
                    Ok(None) | Err(_) => {}
                }
            }
            // The file's own rule: a CFA read from memory after a realignment, or a rule
            // framehop stopped at.
            match self.cfi_step(f) {
                Step::Caller(regs) => {
                    let Some(addr) = FrameAddress::from_return_address(regs.ip) else {
                        return false;
                    };
                    frames.push(Frame { addr, regs });
                }
                Step::Root => {
                    self.roots.insert(f.addr.address());
                    return true;
                }
                Step::NoInfo if self.at_entry(f) => {
                    self.roots.insert(f.addr.address());
                    return true;
                }
                Step::NoInfo | Step::Unknown => return scan && self.scan(frames),
            }
        }
        false
    }

    fn module(&self, addr: u64) -> Option<&'a Module> {
        module_at(self.modules, addr)
    }

    fn needs_own_rule(&self, f: Frame) -> bool {
        let lookup = f.addr.address_for_lookup();
        self.module(lookup)
            .and_then(|m| Some((m.bias, m.elf.as_ref()?)))
            .is_some_and(|(bias, elf)| elf.needs_own_rule(lookup.wrapping_sub(bias)))
    }

    fn cfi_step(&mut self, f: Frame) -> Step {
        let lookup = f.addr.address_for_lookup();
        let Some((m, elf)) = self.module(lookup).and_then(|m| Some((m, m.elf.as_ref()?))) else {
            return Step::NoInfo;
        };
        elf.cfi_step(
            lookup.wrapping_sub(m.bias),
            f.regs,
            self.read,
            self.cfi_context,
        )
    }

    /// Where no rule unwinds a frame (hand-written assembly without CFI, such as OpenBLAS's
    /// kernels, or a rule over a register the sample does not carry), looks up the stack for
    /// the return address. A word counts only if it points just after a call instruction in a
    /// function with unwind information, and the unwind from it reaches the thread's root:
    /// a guess that fails either test is never shown.
    fn scan(&mut self, frames: &mut Vec<Frame>) -> bool {
        // A return address a rule found in no known file is in a library mapped since the
        // mappings were read: the caller reads them again and unwinds anew. A scan would
        // step over its frames to an ancestor's return address, and drop them unseen.
        if let [.., prev, last] = frames[..] {
            if self.module(last.addr.address_for_lookup()).is_none() && self.has_rule(prev) {
                return false;
            }
        }
        // The frames since the last one unwound by a rule are guesses (framehop's fallback
        // for a function without CFI reads the return address at the stack pointer): scan
        // from the first of them, whose address is trustworthy.
        let mut s = frames.len() - 1;
        while s > 0 && !self.has_rule(frames[s - 1]) {
            s -= 1;
        }
        frames.truncate(s + 1);
        let base = frames[s].regs;
        let hint = self.hints.get(&base.sp).copied();
        let slots = hint.into_iter().chain(
            (0..SCAN_WORDS)
                .map(|i| base.sp + 8 * i)
                .filter(|&a| Some(a) != hint),
        );
        let callee = self.function_start(frames[s].addr.address_for_lookup());
        let file = self
            .module(frames[s].addr.address_for_lookup())
            .map(|m| m.start);
        let mut tried = 0;
        for slot in slots {
            if self.skip.contains(&slot) {
                continue;
            }
            let Some(word) = (self.read)(slot) else {
                if Some(slot) == hint {
                    continue;
                }
                break;
            };
            if !self.is_return_address(word, callee)
                || (self.same_file && self.module(word).map(|m| m.start) != file)
            {
                continue;
            }
            let Some(addr) = FrameAddress::from_return_address(word) else {
                continue;
            };
            // An unknown frame pointer (0: a stack read from outside, `dump`, knows only the
            // stack and instruction pointers) is taken as the word below the return address,
            // where a function that keeps a frame pointer saved its caller's.
            let bp = match base.bp {
                0 => slot
                    .checked_sub(8)
                    .and_then(|a| (self.read)(a))
                    .unwrap_or(0),
                bp => bp,
            };
            let mut trial = vec![Frame {
                addr,
                regs: Regs {
                    ip: word,
                    sp: slot + 8,
                    bp,
                    lr: 0,
                },
            }];
            if self.walk(&mut trial, false) {
                if self.hints.len() >= SCAN_HINTS {
                    self.hints.clear();
                }
                self.hints.insert(base.sp, slot);
                self.scanned_from = Some(frames.len());
                self.scan_slot = Some(slot);
                frames.extend(trial);
                frames.truncate(MAX_NATIVE_FRAMES);
                return true;
            }
            tried += 1;
            if tried == SCAN_CANDIDATES || self.budget == 0 {
                break;
            }
        }
        false
    }

    fn has_rule(&mut self, f: Frame) -> bool {
        !matches!(self.cfi_step(f), Step::NoInfo)
    }

    /// Whether `word` points just after a call instruction that may have called `callee` (the
    /// start of the function the frame below is in, where known): a direct call to another
    /// function of the same file is the stale return address of an earlier call.
    fn is_return_address(&self, word: u64, callee: Option<u64>) -> bool {
        let Some(m) = self.module(word) else {
            return false;
        };
        let Some(elf) = &m.elf else {
            return false;
        };
        // A function's first instruction is no return address, even after a call that ends
        // the function before it (a call that never returns): such words are function
        // pointers, as the program's entry point in a new process's auxiliary vector, which
        // made a sample taken as a process started read `_start;0x7f...`.
        if self.function_start(word) == Some(word) {
            return false;
        }
        match elf.call_before(word.wrapping_sub(m.bias)) {
            None => false,
            Some(None) => true,
            Some(Some(target)) => {
                let target = target.wrapping_add(m.bias);
                match callee {
                    Some(c) if self.module(c).is_some_and(|cm| cm.start == m.start) => {
                        self.function_start(target) == Some(c)
                    }
                    _ => true,
                }
            }
        }
    }

    /// A frame at a file's entry point (`ElfFile::at_entry`): where the process started.
    fn at_entry(&self, f: Frame) -> bool {
        let lookup = f.addr.address_for_lookup();
        self.module(lookup)
            .and_then(|m| Some((m.bias, m.elf.as_ref()?)))
            .is_some_and(|(bias, elf)| elf.at_entry(lookup.wrapping_sub(bias)))
    }

    /// The start of the function containing `addr`, by its file's symbols.
    fn function_start(&self, addr: u64) -> Option<u64> {
        let m = self.module(addr)?;
        let elf = m.elf.as_ref()?;
        let (start, _) = elf.symbols().lookup(addr.wrapping_sub(m.bias))?;
        Some(start.wrapping_add(m.bias))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(ret: bool, ip: u64, sp: u64, bp: u64) -> Frame {
        let addr = if ret {
            FrameAddress::from_return_address(ip).unwrap()
        } else {
            FrameAddress::InstructionPointer(ip)
        };
        Frame {
            addr,
            regs: Regs { ip, sp, bp, lr: 0 },
        }
    }

    #[test]
    fn a_suffix_is_taken_only_where_registers_and_the_stack_above_agree() {
        let sp = 0x7000;
        let stack: Vec<u8> = (0..512u32).map(|i| (i * 7) as u8).collect();
        let memo = SuffixMemo {
            frames: vec![
                frame(false, 0x1000, sp, 0x7100),
                frame(true, 0x2000, sp + 0x40, 0x7100),
                frame(true, 0x3000, sp + 0x100, 0x7180),
                frame(true, 0x4000, sp + 0x180, 0),
            ],
            sp,
            stack: stack.clone(),
        };
        // Another sample, deeper in the same caller: its leaf is new, its caller's frame and
        // everything above it are the memo's.
        let sp2 = sp - 0x20;
        let mut stack2 = vec![0xaa; 0x20];
        stack2.extend_from_slice(&stack);
        stack2[0x20 + 0x10] ^= 1; // below the caller's frame: the leaf's own words
        let caller = frame(true, 0x2000, sp + 0x40, 0x7100);
        let rest = memo.callers(&caller, sp2, &stack2).unwrap();
        assert_eq!(rest.len(), 2);
        assert_eq!(rest[0].addr, memo.frames[2].addr);
        assert!(memo
            .callers(&frame(false, 0x1111, sp2, 0), sp2, &stack2)
            .is_none());

        // A word above the frame changed (a suspended caller's local): not the memo's callers.
        let mut changed = stack2.clone();
        changed[0x20 + 0x80] ^= 1;
        assert!(memo.callers(&caller, sp2, &changed).is_none());
        // ... but above a frame beyond that word, still the same.
        let outer = frame(true, 0x3000, sp + 0x100, 0x7180);
        assert_eq!(memo.callers(&outer, sp2, &changed).unwrap().len(), 1);
        // Other registers (a frame pointer restored from below the frame): no.
        assert!(memo
            .callers(&frame(true, 0x2000, sp + 0x40, 0x7108), sp2, &stack2)
            .is_none());
        // A copy that ends elsewhere read other words beyond the memo's end: no.
        let mut longer = stack2.clone();
        longer.extend_from_slice(&[0; 64]);
        assert!(memo.callers(&caller, sp2, &longer).is_none());
        // The root itself: nothing follows it.
        let root = frame(true, 0x4000, sp + 0x180, 0);
        assert_eq!(memo.callers(&root, sp2, &stack2).unwrap().len(), 0);
    }
}
