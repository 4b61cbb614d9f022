//! One memory budget for every byte the proxy holds on a client's behalf: request bodies being
//! read, response bodies read whole, and what each stream interceptor holds (an incomplete
//! event, calls held back for the argument rules). Each response is bounded on its own
//! (`interceptor.max_stream_buffer_bytes`), but many of them at once are not: without a shared
//! bound, a few dozen streams that each stop just short of the per-response bound take
//! hundreds of MB. Past the budget the exchange that asks for more fails closed (a stream ends
//! with an error event, a request gets a 503); the daemon does not.
//!
//! Each client (a user and cgroup, `clients.rs`) may hold a quarter of the budget at most, so
//! one client that sends large bodies slowly or holds streams open cannot take it all from the
//! others.
//!
//! Each holder keeps one [`Reservation`] and resizes it to what it holds after each step: two
//! atomic operations (its client's share, then the whole), no allocation, so the hot path of a
//! stream stays as it was.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The bytes held across the proxy, and the most it may hold (`proxy.memory_budget_bytes`).
#[derive(Debug)]
pub(crate) struct Budget {
    used: AtomicUsize,
    limit: usize,
}

/// What one client holds, of its share (a quarter of the budget).
pub(crate) type ClientBytes = Arc<AtomicUsize>;

/// How many clients it takes to hold the whole budget.
const SHARES: usize = 4;

/// The budget, or the client's share of it, is in use: the holder that asked must give up
/// what it was doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum OverBudget {
    #[error(
        "the proxy's memory budget ({limit} bytes, proxy.memory_budget_bytes) is in use by other exchanges; raise proxy.memory_budget_bytes or retry later"
    )]
    Whole {
        /// The budget.
        limit: usize,
    },
    #[error(
        "the proxy's memory budget: this client (its user and cgroup) holds its share of it ({share} bytes, a quarter of proxy.memory_budget_bytes) in other exchanges; finish those, raise proxy.memory_budget_bytes, or retry later"
    )]
    Share {
        /// The client's share.
        share: usize,
    },
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

    /// A reservation of nothing yet for `client`, returned to the budget when dropped.
    pub(crate) fn reserve(self: &Arc<Self>, client: &ClientBytes) -> Reservation {
        Reservation {
            budget: self.clone(),
            client: client.clone(),
            held: 0,
        }
    }

    /// A client's most.
    fn share(&self) -> usize {
        self.limit / SHARES
    }

    fn grow(&self, client: &AtomicUsize, by: usize) -> Result<(), OverBudget> {
        let share = self.share();
        client
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(by).filter(|&n| n <= share)
            })
            .map_err(|_| OverBudget::Share { share })?;
        let whole = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(by).filter(|&n| n <= self.limit)
            });
        if whole.is_err() {
            client.fetch_sub(by, Ordering::Relaxed);
            return Err(OverBudget::Whole { limit: self.limit });
        }
        Ok(())
    }
}

/// What one holder has of the [`Budget`].
#[derive(Debug)]
pub(crate) struct Reservation {
    budget: Arc<Budget>,
    client: ClientBytes,
    held: usize,
}

impl Reservation {
    /// Says the holder now holds `bytes`. Shrinking always succeeds; growing fails when the
    /// budget cannot take the difference, and the reservation then stays as it was.
    pub(crate) fn resize(&mut self, bytes: usize) -> Result<(), OverBudget> {
        if bytes > self.held {
            self.budget.grow(&self.client, bytes - self.held)?;
        } else {
            let freed = self.held - bytes;
            self.budget.used.fetch_sub(freed, Ordering::Relaxed);
            self.client.fetch_sub(freed, Ordering::Relaxed);
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
        self.client.fetch_sub(self.held, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client() -> ClientBytes {
        Arc::default()
    }

    #[test]
    fn one_client_holds_a_quarter_at_most_and_the_others_keep_theirs() {
        let budget = Budget::new(400);
        let (a, b) = (client(), client());
        let mut a1 = budget.reserve(&a);
        let mut a2 = budget.reserve(&a);
        a1.resize(60).expect("fits");
        assert_eq!(a2.resize(50), Err(OverBudget::Share { share: 100 }));
        a2.resize(40).expect("the rest of its share");
        let mut b1 = budget.reserve(&b);
        b1.resize(100).expect("another client's share is whole");
        drop(a1);
        a2.resize(100).expect("what it gave back is its own again");
        assert_eq!(budget.used(), 200);
        drop((a2, b1));
        assert_eq!((budget.used(), a.load(Ordering::Relaxed)), (0, 0));
        let text = OverBudget::Share { share: 100 }.to_string();
        assert!(
            text.starts_with("the proxy's memory budget")
                && text.contains("proxy.memory_budget_bytes"),
            "{text}"
        );
    }

    #[test]
    fn reservations_share_one_limit_and_return_it_when_dropped() {
        let budget = Budget::new(100);
        let clients: Vec<ClientBytes> = (0..5).map(|_| client()).collect();
        let mut held: Vec<Reservation> = clients[..4]
            .iter()
            .map(|c| {
                let mut r = budget.reserve(c);
                r.resize(25).expect("a share fits");
                r
            })
            .collect();
        let mut fifth = budget.reserve(&clients[4]);
        assert_eq!(fifth.resize(1), Err(OverBudget::Whole { limit: 100 }));
        assert_eq!(
            clients[4].load(Ordering::Relaxed),
            0,
            "a refused growth gives the client's share back"
        );
        held[0].resize(10).expect("shrinking always succeeds");
        fifth
            .resize(15)
            .expect("what another gave back is free again");
        assert_eq!(budget.used(), 100);
        drop(held);
        drop(fifth);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_refused_growth_keeps_what_was_held() {
        let budget = Budget::new(40);
        let mut a = budget.reserve(&client());
        a.resize(8).expect("fits");
        assert!(a.resize(11).is_err());
        assert_eq!((a.held(), budget.used()), (8, 8));
        drop(a);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn the_error_names_the_setting_that_raises_it() {
        let text = OverBudget::Whole { limit: 64 }.to_string();
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
                    let mut r = budget.reserve(&client());
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
