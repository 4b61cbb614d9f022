//! Byte budgets for what the filter proxy holds on its clients' behalf: each message a session
//! holds (read from its upstream, not yet written to its client) is charged to the session's
//! budget and to the proxy's total, and released when it leaves. A session whose client does
//! not read waits once its budget is spent (its upstream is then read no further), so no
//! client, and no number of them, makes the proxy hold more than the bounds.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

/// A budget of bytes, within a parent's when it has one.
#[derive(Debug)]
pub(crate) struct Budget {
    used: AtomicUsize,
    limit: usize,
    parent: Option<Arc<Budget>>,
    /// Told whenever bytes are given back here (a parent tells its children's waiters too:
    /// they wait on the root's).
    released: Notify,
}

/// Bytes taken from a budget (and its parent), given back when dropped.
#[derive(Debug)]
pub(crate) struct Charge {
    budget: Arc<Budget>,
    bytes: usize,
}

impl Budget {
    /// A budget of `limit` bytes, inside `parent`'s.
    pub(crate) fn new(limit: usize, parent: Option<Arc<Budget>>) -> Arc<Self> {
        Arc::new(Budget {
            used: AtomicUsize::new(0),
            limit,
            parent,
            released: Notify::new(),
        })
    }

    /// Bytes in use.
    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    fn reserve(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&n| n <= self.limit)
            })
            .is_ok()
    }

    fn give_back(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
        match &self.parent {
            Some(parent) => parent.give_back(bytes),
            None => self.released.notify_waiters(),
        }
    }

    fn root(&self) -> &Budget {
        match &self.parent {
            Some(parent) => parent.root(),
            None => self,
        }
    }

    /// Reserves `bytes` here and in every parent, or nowhere.
    fn reserve_all(&self, bytes: usize) -> bool {
        if !self.reserve(bytes) {
            return false;
        }
        if let Some(parent) = &self.parent
            && !parent.reserve_all(bytes)
        {
            self.used.fetch_sub(bytes, Ordering::AcqRel);
            return false;
        }
        true
    }

    /// `bytes` from this budget and every parent, or nothing when one of them has no room.
    pub(crate) fn try_charge(self: &Arc<Self>, bytes: usize) -> Option<Charge> {
        self.reserve_all(bytes).then(|| Charge {
            budget: self.clone(),
            bytes,
        })
    }

    /// `bytes`, once there is room for them. A message larger than a limit is charged only
    /// what is left when nothing else is held (the message limit keeps one below it anyway),
    /// so it never waits for ever.
    pub(crate) async fn charge(self: &Arc<Self>, bytes: usize) -> Charge {
        loop {
            let released = self.root().released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if let Some(charge) = self.try_charge(bytes.min(self.smallest_limit())) {
                return charge;
            }
            released.await;
        }
    }

    fn smallest_limit(&self) -> usize {
        match &self.parent {
            Some(parent) => self.limit.min(parent.smallest_limit()),
            None => self.limit,
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_come_from_the_session_and_the_total_and_go_back() {
        let total = Budget::new(100, None);
        let a = Budget::new(60, Some(total.clone()));
        let b = Budget::new(60, Some(total.clone()));
        let a1 = a.try_charge(50).expect("room");
        assert!(a.try_charge(20).is_none(), "past the session's limit");
        let b1 = b.try_charge(50).expect("room");
        assert!(b.try_charge(1).is_none(), "past the total");
        assert_eq!(b.used(), 50, "a refused charge takes nothing");
        assert_eq!(total.used(), 100);
        drop(a1);
        assert_eq!((a.used(), total.used()), (0, 50));
        assert!(b.try_charge(10).is_some());
        drop(b1);
        assert_eq!(total.used(), 0);
    }

    #[tokio::test]
    async fn a_charge_waits_for_room_and_an_oversized_one_never_waits_for_ever() {
        let total = Budget::new(100, None);
        let session = Budget::new(80, Some(total.clone()));
        let held = session.try_charge(80).expect("room");
        let waiting = {
            let session = session.clone();
            tokio::spawn(async move { session.charge(30).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "no room yet");
        drop(held);
        let charge = tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("woken")
            .expect("task");
        assert_eq!(session.used(), 30);
        drop(charge);
        // Larger than every limit: charged what the smallest allows, once all is free.
        let big = tokio::time::timeout(std::time::Duration::from_secs(5), session.charge(500))
            .await
            .expect("no wait for ever");
        assert_eq!(total.used(), 80);
        drop(big);
    }
}
