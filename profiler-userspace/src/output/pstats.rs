//! `pstats`: the statistics file Python's `pstats.Stats` loads (and snakeviz, tuna, and every
//! tool made for `cProfile` output), written from samples.
//!
//! Its functions are the Python functions of the samples, keyed as `cProfile` keys them:
//! (file, line of the `def`, name). As in CPython's sampler, call counts are sample counts:
//! the primitive count is the samples where the function is the innermost Python frame, the
//! total count those where it is on the stack (once per stack, however deep its recursion);
//! `tottime` and `cumtime` are the same in seconds of the profile's mode. A function's own
//! time includes the native and kernel code it runs (the Python-first rule of the summary).
//! Each function's callers are the Python functions right above it, with the samples and
//! seconds of that pair. Samples without a Python frame are not in the file. Unlike CPython's
//! sampler, the file carries no `__sampled__` marker: that key only loads on 3.15's `pstats`.

use std::collections::{BTreeMap, HashMap};

use super::{periods, stack_totals};
use crate::aggregate::{FuncId, Profile};

/// Samples and milliseconds.
#[derive(Clone, Copy, Default)]
struct Count {
    samples: u64,
    ms: f64,
}

impl Count {
    fn add(&mut self, ms: f64, interval_ms: f64) {
        self.samples += periods(ms, interval_ms);
        self.ms += ms;
    }
}

#[derive(Default)]
struct Entry {
    direct: Count,
    cumulative: Count,
    /// Caller -> (samples of the pair on a stack, samples with the callee innermost).
    callers: BTreeMap<Key, (Count, Count)>,
}

/// (file, line of the `def`, name), as `cProfile` keys a function.
type Key = (String, u32, String);

fn key(p: &Profile, f: FuncId) -> Key {
    let func = &p.funcs[f];
    (
        func.file.as_deref().unwrap_or("~").to_string(),
        func.line.unwrap_or(0),
        func.name.to_string(),
    )
}

/// The statistics, marshalled (format 4, which `marshal.load` reads on every Python 3).
pub fn to_bytes(p: &Profile) -> Vec<u8> {
    let mut keys: HashMap<FuncId, Key> = HashMap::new();
    let mut stats: BTreeMap<Key, Entry> = BTreeMap::new();
    for st in stack_totals(p) {
        // Python functions, innermost first.
        let python: Vec<FuncId> = p
            .stack_root_first(st.stack)
            .iter()
            .rev()
            .map(|&f| p.frames[f].func)
            .filter(|&f| p.funcs[f].is_python)
            .collect();
        let Some(&leaf) = python.first() else {
            continue;
        };
        let mut key_of = |f: FuncId| keys.entry(f).or_insert_with(|| key(p, f)).clone();
        stats
            .entry(key_of(leaf))
            .or_default()
            .direct
            .add(st.ms, p.interval_ms);
        let mut seen: Vec<FuncId> = Vec::with_capacity(python.len());
        for (i, &f) in python.iter().enumerate() {
            if !seen.contains(&f) {
                seen.push(f);
                stats
                    .entry(key_of(f))
                    .or_default()
                    .cumulative
                    .add(st.ms, p.interval_ms);
            }
            if let Some(&caller) = python.get(i + 1) {
                let e = stats.entry(key_of(f)).or_default();
                let pair = e.callers.entry(key_of(caller)).or_default();
                pair.0.add(st.ms, p.interval_ms);
                if i == 0 {
                    pair.1.add(st.ms, p.interval_ms);
                }
            }
        }
    }
    let mut m = Marshal::default();
    m.dict_start();
    for (k, e) in &stats {
        m.key(k);
        m.tuple(5);
        m.int(e.direct.samples);
        m.int(e.cumulative.samples);
        m.float(e.direct.ms / 1000.0);
        m.float(e.cumulative.ms / 1000.0);
        m.dict_start();
        for (caller, (pair, innermost)) in &e.callers {
            m.key(caller);
            // As `cProfile` gives them: (primitive calls, calls, tottime, cumtime).
            m.tuple(4);
            m.int(pair.samples);
            m.int(pair.samples);
            m.float(innermost.ms / 1000.0);
            m.float(pair.ms / 1000.0);
        }
        m.dict_end();
    }
    m.dict_end();
    m.out
}

/// The few `marshal` types a stats file is made of. Hand-written: the crates that know the
/// format read it (to analyse `.pyc` files); none writes it, and these five types are a page.
#[derive(Default)]
struct Marshal {
    out: Vec<u8>,
}

impl Marshal {
    fn dict_start(&mut self) {
        self.out.push(b'{');
    }

    /// A dict ends with a NULL where the next key would be.
    fn dict_end(&mut self) {
        self.out.push(b'0');
    }

    fn tuple(&mut self, n: u8) {
        self.out.extend_from_slice(&[b')', n]);
    }

    fn key(&mut self, (file, line, name): &Key) {
        self.tuple(3);
        self.str(file);
        self.int(*line as u64);
        self.str(name);
    }

    fn str(&mut self, s: &str) {
        self.out.push(b'u');
        self.out
            .extend_from_slice(&(s.len().min(u32::MAX as usize) as u32).to_le_bytes());
        self.out.extend_from_slice(s.as_bytes());
    }

    /// A 32-bit int, or beyond that a long of 15-bit digits, least significant first.
    fn int(&mut self, v: u64) {
        if let Ok(small) = i32::try_from(v) {
            self.out.push(b'i');
            self.out.extend_from_slice(&small.to_le_bytes());
            return;
        }
        let mut digits = Vec::new();
        let mut rest = v;
        while rest != 0 {
            digits.push((rest & 0x7fff) as u16);
            rest >>= 15;
        }
        self.out.push(b'l');
        self.out
            .extend_from_slice(&(digits.len() as i32).to_le_bytes());
        for d in digits {
            self.out.extend_from_slice(&d.to_le_bytes());
        }
    }

    fn float(&mut self, v: f64) {
        self.out.push(b'g');
        self.out.extend_from_slice(&v.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marshal_bytes_of_each_type() {
        let mut m = Marshal::default();
        m.int(7);
        assert_eq!(m.out, [b'i', 7, 0, 0, 0]);
        let mut m = Marshal::default();
        // 2^31 = 2 * 2^30: digits 0, 0, 2 (15 bits each).
        m.int(1 << 31);
        assert_eq!(m.out, [b'l', 3, 0, 0, 0, 0, 0, 0, 0, 2, 0]);
        let mut m = Marshal::default();
        m.key(&("a.py".into(), 3, "f".into()));
        assert_eq!(
            m.out,
            [
                b')', 3, b'u', 4, 0, 0, 0, b'a', b'.', b'p', b'y', b'i', 3, 0, 0, 0, b'u', 1, 0, 0,
                0, b'f'
            ]
        );
        let mut m = Marshal::default();
        m.dict_start();
        m.dict_end();
        m.float(0.5);
        assert_eq!(m.out[..2], [b'{', b'0']);
        assert_eq!(m.out[2], b'g');
        assert_eq!(m.out[3..], 0.5f64.to_le_bytes());
    }
}
