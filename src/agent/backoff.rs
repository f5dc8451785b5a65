//! Backoff of failing syncs: exponential with jitter, so a node whose `nft` keeps failing
//! (a kernel refusing the ruleset, a missing binary) neither hammers the kernel on every
//! informer event nor waits long once the cause is gone. The sync loop retries at the
//! deadline; a CNI request (a pod waiting to start) tries at once whatever the backoff.

use std::time::Duration;

/// First retry after this long...
pub(crate) const BASE: Duration = Duration::from_secs(1);
/// ...doubling up to this (the delay, before jitter).
pub(crate) const CAP: Duration = Duration::from_secs(300);

/// Consecutive failures and the jitter source.
#[derive(Debug)]
pub(crate) struct Backoff {
    failures: u32,
    /// xorshift64 state: jitter needs no quality, only spread between nodes.
    rng: u64,
}

impl Backoff {
    /// `seed` spreads nodes' retries (any value but 0 works; 0 is replaced).
    pub(crate) fn new(seed: u64) -> Self {
        Self { failures: 0, rng: seed.max(1) }
    }

    /// Seeded from the process id and the clock, so nodes that failed together do not retry
    /// together.
    pub(crate) fn from_entropy() -> Self {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        Self::new((u64::from(std::process::id()) << 32) ^ u64::from(nanos))
    }

    pub(crate) fn failures(&self) -> u32 {
        self.failures
    }

    /// Records a failure; the delay before the next attempt: `BASE · 2^(n-1)`, capped at
    /// [`CAP`], then scaled by a random factor in [0.8, 1.2).
    pub(crate) fn fail(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let exp = self.failures.saturating_sub(1).min(16);
        let delay = BASE.saturating_mul(1 << exp).min(CAP);
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        // 0.8 + 0.4 · u, u uniform in [0, 1) from the top 24 bits.
        let u = (self.rng >> 40) as f64 / f64::from(1u32 << 24);
        delay.mul_f64(0.8 + 0.4 * u)
    }

    /// A sync committed: the next failure starts over.
    pub(crate) fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_with_jitter_up_to_the_cap_and_resets() {
        let mut b = Backoff::new(42);
        let mut nominal = BASE;
        for _ in 0..20 {
            let d = b.fail();
            assert!(d >= nominal.mul_f64(0.8) && d < nominal.mul_f64(1.2), "{d:?} vs {nominal:?}");
            nominal = (nominal * 2).min(CAP);
        }
        assert!(b.fail() < CAP.mul_f64(1.2));
        b.reset();
        assert!(b.fail() < BASE.mul_f64(1.2));
    }

    #[test]
    fn two_nodes_do_not_retry_in_lockstep() {
        let (mut a, mut b) = (Backoff::new(1), Backoff::new(2));
        let same = (0..8).filter(|_| a.fail() == b.fail()).count();
        assert!(same < 2);
    }
}
