//! One memory budget for every byte the proxy holds on a client's behalf: request bodies being
//! read, response bodies read whole, and what each stream interceptor holds (an incomplete
//! event, calls held back for the argument rules). Each response is bounded on its own
//! (`interceptor.max_stream_buffer_bytes`), but many of them at once are not: without a shared
//! bound, a few dozen streams that each stop just short of the per-response bound take
//! hundreds of MB. Past the budget the exchange that asks for more fails closed (a stream ends
//! with an error event, a request gets a 503); the daemon does not.
//!
//! Each holder keeps one [`Reservation`] and resizes it to what it holds after each step: one
//! atomic operation, no allocation, so the hot path of a stream stays as it was.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The bytes held across the proxy, and the most it may hold (`proxy.memory_budget_bytes`).
#[derive(Debug)]
pub(crate) struct Budget {
    used: AtomicUsize,
    limit: usize,
}

/// The budget is in use: the holder that asked must give up what it was doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the proxy's memory budget ({limit} bytes, proxy.memory_budget_bytes) is in use by other exchanges; raise proxy.memory_budget_bytes or retry later"
)]
pub(crate) struct OverBudget {
    /// The budget.
    pub(crate) limit: usize,
}

impl Budget {
    /// A budget of `limit` bytes.
    pub(crate) fn new(limit: usize) -> Arc<Self> {
        Arc::new(Budget {
            used: AtomicUsize::new(0),
            limit,
        })
    }

    /// Bytes held now, across every reservation.
    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// A reservation of nothing yet, returned to the budget when dropped.
    pub(crate) fn reserve(self: &Arc<Self>) -> Reservation {
        Reservation {
            budget: self.clone(),
            held: 0,
        }
    }

    fn grow(&self, by: usize) -> Result<(), OverBudget> {
        let over = OverBudget { limit: self.limit };
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(by).filter(|&n| n <= self.limit)
            })
            .map(drop)
            .map_err(|_| over)
    }
}

/// What one holder has of the [`Budget`].
#[derive(Debug)]
pub(crate) struct Reservation {
    budget: Arc<Budget>,
    held: usize,
}

impl Reservation {
    /// Says the holder now holds `bytes`. Shrinking always succeeds; growing fails when the
    /// budget cannot take the difference, and the reservation then stays as it was.
    pub(crate) fn resize(&mut self, bytes: usize) -> Result<(), OverBudget> {
        if bytes > self.held {
            self.budget.grow(bytes - self.held)?;
        } else {
            self.budget
                .used
                .fetch_sub(self.held - bytes, Ordering::Relaxed);
        }
        self.held = bytes;
        Ok(())
    }

    /// What this reservation holds.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.held
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.held, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_share_one_limit_and_return_it_when_dropped() {
        let budget = Budget::new(100);
        let mut a = budget.reserve();
        let mut b = budget.reserve();
        a.resize(60).expect("fits");
        assert_eq!(b.resize(50), Err(OverBudget { limit: 100 }));
        assert_eq!(b.held(), 0, "a refused growth changes nothing");
        b.resize(40).expect("exactly the rest fits");
        assert_eq!(budget.used(), 100);
        a.resize(10).expect("shrinking always succeeds");
        assert_eq!(budget.used(), 50);
        b.resize(90).expect("what a gave back is free again");
        drop(a);
        drop(b);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_refused_growth_keeps_what_was_held() {
        let budget = Budget::new(10);
        let mut a = budget.reserve();
        a.resize(8).expect("fits");
        assert!(a.resize(11).is_err());
        assert_eq!((a.held(), budget.used()), (8, 8));
        drop(a);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn the_error_names_the_setting_that_raises_it() {
        let text = OverBudget { limit: 64 }.to_string();
        assert!(text.contains("proxy.memory_budget_bytes"), "{text}");
        assert!(text.contains("64 bytes"), "{text}");
    }

    #[test]
    fn concurrent_holders_never_pass_the_limit() {
        let budget = Budget::new(1000);
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let budget = budget.clone();
                std::thread::spawn(move || {
                    let mut r = budget.reserve();
                    let mut peak = 0;
                    for step in 0..10_000usize {
                        if r.resize((step * 37) % 400).is_ok() {
                            peak = peak.max(budget.used());
                        }
                    }
                    peak
                })
            })
            .collect();
        for t in threads {
            assert!(t.join().expect("no panic") <= 1000);
        }
        assert_eq!(budget.used(), 0);
    }
}
