//! framehop's rule caches of a process, in banks that grow with the process's code.
//!
//! One framehop cache holds the rules of 509 addresses, one an address, at the slot of the
//! address modulo 509: a second address at that slot evicts the first. A Python service's
//! stacks pass through thousands of return addresses (the interpreter's C calls, its
//! libraries'), and its samples are interrupted at thousands of instructions: with one cache,
//! 11% of return-address look-ups and 70% of interrupted-instruction look-ups found another
//! address in their slot, and each of those misses parses the function's CFI again (about
//! 6,000 instructions; together a fifth of a sample's handling). framehop's cache size is
//! fixed, so the process keeps several caches, one chosen by a hash of the address. A process
//! starts with one (what a short-lived or rarely sampled process needs); a process whose
//! look-ups keep evicting each other gets twice as many, up to `MAX_BANKS`, within a budget
//! for all processes (`BUDGET`): a host of many busy processes still costs a bounded amount.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::Cache;

/// Banks one process may have, for one kind of address (a power of two).
pub const MAX_BANKS: usize = 16;
/// Banks all processes together may have beyond their first: 8-10 KiB each (509 entries of
/// 16 bytes, and the CFI evaluator framehop keeps beside them).
const BUDGET: usize = 512;
/// Banks in use beyond each process's first, across processes.
static EXTRA: AtomicUsize = AtomicUsize::new(0);
/// Look-ups between two checks of the miss rate.
const CHECK_EVERY: u32 = 256;
/// Grow when, since the last growth, at least this many look-ups found another address in
/// their slot, and they were more than 1 in `MISS_SHARE` of all look-ups.
const GROW_AFTER: u64 = 128;
const MISS_SHARE: u64 = 100;

pub struct RuleCaches {
    banks: Vec<Cache>,
    /// Look-ups since the last check of the miss rate.
    since_check: u32,
    /// The banks' hits and slot conflicts summed at the last growth.
    at_growth: (u64, u64),
}

impl Default for RuleCaches {
    fn default() -> Self {
        Self::new()
    }
}

impl RuleCaches {
    pub fn new() -> Self {
        RuleCaches {
            banks: vec![Cache::new()],
            since_check: 0,
            at_growth: (0, 0),
        }
    }

    /// The cache for the rule of `addr`.
    pub fn bank(&mut self, addr: u64) -> &mut Cache {
        self.since_check += 1;
        if self.since_check >= CHECK_EVERY {
            self.since_check = 0;
            self.grow_if_thrashing();
        }
        let i = bank_of(addr, self.banks.len());
        &mut self.banks[i]
    }

    #[cfg(test)]
    fn banks(&self) -> usize {
        self.banks.len()
    }

    /// The banks' hits and slot conflicts, summed.
    fn counts(&self) -> (u64, u64) {
        self.banks.iter().fold((0, 0), |(h, c), b| {
            let s = b.stats();
            (h + s.hit_count, c + s.miss_wrong_address_count)
        })
    }

    fn grow_if_thrashing(&mut self) {
        let n = self.banks.len();
        if n >= MAX_BANKS {
            return;
        }
        let (hits, conflicts) = self.counts();
        if !thrashing(hits - self.at_growth.0, conflicts - self.at_growth.1) {
            return;
        }
        if EXTRA
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |e| {
                (e + n <= BUDGET).then_some(e + n)
            })
            .is_err()
        {
            return;
        }
        // Addresses move to other banks, where they are looked up anew: a rule is parsed
        // again once, where it was parsed again at every eviction.
        self.banks.extend((0..n).map(|_| Cache::new()));
        self.at_growth = self.counts();
    }
}

impl Drop for RuleCaches {
    fn drop(&mut self) {
        EXTRA.fetch_sub(self.banks.len() - 1, Ordering::Relaxed);
    }
}

/// Whether `conflicts` look-ups that found another address in their slot, beside `hits`, call
/// for more banks.
fn thrashing(hits: u64, conflicts: u64) -> bool {
    conflicts >= GROW_AFTER && conflicts * MISS_SHARE > hits + conflicts
}

/// The bank of `addr` among `n` (a power of two): bits of a multiplicative hash other than
/// those that pick its slot within a bank (the address modulo 509).
fn bank_of(addr: u64, n: usize) -> usize {
    (addr.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as usize & (n - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_spread_over_the_banks_and_a_bank_is_stable() {
        for n in [1, 2, 4, 16] {
            let mut seen = vec![0usize; n];
            // Return addresses a few bytes apart, as in one library's code.
            for a in (0x7f00_0000_1000u64..).step_by(13).take(16_000) {
                let b = bank_of(a, n);
                assert_eq!(b, bank_of(a, n));
                seen[b] += 1;
            }
            for &c in &seen {
                assert!(c > 16_000 / n * 3 / 4, "{n} banks: {seen:?}");
            }
        }
    }

    #[test]
    fn banks_grow_where_lookups_evict_each_other_often() {
        // The web service's return addresses: 11% of look-ups evicted another.
        assert!(thrashing(59_204, 7_262));
        // Its interrupted instructions: 70%.
        assert!(thrashing(1_473, 3_198));
        // A few conflicts, or few among many hits: not worth a bank.
        assert!(!thrashing(0, GROW_AFTER - 1));
        assert!(!thrashing(100_000, 1_000));
        assert!(thrashing(100_000, 1_100));
    }

    /// Looks up the rule of each return address of `addrs`, `rounds` times over, through
    /// framehop itself (an unwinder without modules gives each address its fallback rule, and
    /// caches it as it would any rule).
    fn look_up(c: &mut RuleCaches, addrs: &[u64], rounds: usize) {
        let unwinder = super::super::NativeUnwinder::new();
        let regs = super::super::cfi::Regs {
            ip: 0,
            sp: 0x7000,
            bp: 0,
            lr: 0,
        };
        for _ in 0..rounds {
            for &a in addrs {
                let addr = framehop::FrameAddress::from_return_address(a).unwrap();
                let _ = super::super::step(&unwinder, c.bank(a), addr, regs, &mut |_| Err(()));
            }
        }
    }

    #[test]
    fn banks_grow_while_addresses_evict_each_other_and_only_then() {
        // Addresses in slots of their own: each misses once, then is found.
        let mut c = RuleCaches::new();
        let apart: Vec<u64> = (1..=300).map(|k| 0x40_0000 + k * 8).collect();
        look_up(&mut c, &apart, 40);
        assert_eq!(c.banks(), 1);
        // 16 addresses of one slot (509 apart) evict each other at every look-up in one bank:
        // the banks double up to their limit.
        let mut c = RuleCaches::new();
        let clashing: Vec<u64> = (1..=16).map(|k| 0x40_0001 + k * 509).collect();
        look_up(&mut c, &clashing, 200);
        assert_eq!(c.banks(), MAX_BANKS);
        // Spread over the banks, the addresses alone in theirs find their rule (those that
        // share one still clash).
        let (h0, k0) = c.counts();
        look_up(&mut c, &clashing, 10);
        let (h1, k1) = c.counts();
        let (hits, conflicts) = (h1 - h0, k1 - k0);
        // In one bank, all 160 would have evicted another: none would have been found.
        assert!(hits >= 40, "{hits} hits, {conflicts} conflicts");
    }
}
