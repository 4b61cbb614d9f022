//! Per-server call budgets: a token bucket per server (`rate_limits`), refilled continuously
//! at `calls_per_minute`, holding at most `burst` tokens. Time comes from a [`Clock`] so tests
//! can move it without sleeping.
//!
//! A call is counted once however many layers see it: the LLM layer sees it proposed, the
//! shim or filter proxy sees it run. A proposal that spends a token leaves a *credit* for its
//! (server, tool); the execution that follows takes the credit instead of a second token. An
//! execution with no credit (a call the model never asked for, or one proposed longer than
//! [`CREDIT_TTL`] ago) spends a token of its own, so a layer that sees a call alone still
//! counts it, and a lost credit can only make the limit stricter, never looser.

use std::{
    collections::{HashMap, VecDeque},
    fmt,
    sync::{Arc, Mutex, PoisonError, RwLock},
    time::{Duration, Instant},
};

use crate::{config::RateLimitsConfig, decision::CallStage};

/// Most distinct servers that get a bucket of their own; beyond that (only reachable with
/// server ids nobody declared) they share one, so made-up ids cannot grow memory.
const MAX_BUCKETS: usize = 4096;

/// How long a proposed call's credit waits for its execution (an agent may wait for a person
/// to approve the call). Past it, the execution spends a token of its own.
pub(super) const CREDIT_TTL: Duration = Duration::from_secs(600);

/// Most credits kept in all; past it the oldest (server, tool) list is dropped, which only
/// makes a later execution spend a token of its own.
const MAX_CREDITS: usize = 65_536;

/// Monotonic time for rate limiting.
pub(crate) trait Clock: Send + Sync + fmt::Debug {
    /// Time since an arbitrary fixed start; never goes backwards.
    fn now(&self) -> Duration;
}

/// The real clock.
#[derive(Debug)]
pub(crate) struct MonotonicClock {
    start: Instant,
}

impl Default for MonotonicClock {
    fn default() -> Self {
        MonotonicClock {
            start: Instant::now(),
        }
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }
}

/// A clock tests move by hand.
#[derive(Debug, Default)]
#[cfg(test)]
pub(crate) struct ManualClock {
    now: Mutex<Duration>,
}

#[cfg(test)]
impl ManualClock {
    /// Moves time forward.
    pub(crate) fn advance(&self, by: Duration) {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner) += by;
    }
}

#[cfg(test)]
impl Clock for ManualClock {
    fn now(&self) -> Duration {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One server's budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Budget {
    /// Sustained calls per minute.
    pub per_minute: u32,
    /// Bucket size.
    pub burst: u32,
}

#[derive(Debug)]
struct Bucket {
    budget: Budget,
    tokens: f64,
    last: Duration,
}

impl Bucket {
    fn take(&mut self, now: Duration) -> bool {
        let elapsed = now.saturating_sub(self.last).as_secs_f64();
        self.last = now;
        let refill = elapsed * f64::from(self.budget.per_minute) / 60.0;
        self.tokens = (self.tokens + refill).min(f64::from(self.budget.burst));
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The buckets of every server.
#[derive(Debug)]
pub(crate) struct RateLimiter {
    enabled: bool,
    default: Budget,
    per_server: HashMap<String, Budget>,
    buckets: RwLock<HashMap<String, Mutex<Bucket>>>,
    overflow: Mutex<Bucket>,
    credits: Mutex<Credits>,
    clock: Arc<dyn Clock>,
}

/// Proposals that spent a token, waiting for their executions: (server, tool) → when.
#[derive(Debug, Default)]
struct Credits {
    by_call: HashMap<(String, String), VecDeque<Duration>>,
    total: usize,
}

impl Credits {
    fn add(&mut self, server_id: &str, tool: &str, now: Duration) {
        if self.total >= MAX_CREDITS {
            self.expire(now);
        }
        if self.total >= MAX_CREDITS {
            // Still full: forget the longest list, whose executions will spend tokens instead.
            if let Some(key) = self
                .by_call
                .iter()
                .max_by_key(|(_, v)| v.len())
                .map(|(k, _)| k.clone())
                && let Some(list) = self.by_call.remove(&key)
            {
                self.total -= list.len();
            }
        }
        self.by_call
            .entry((server_id.to_owned(), tool.to_owned()))
            .or_default()
            .push_back(now);
        self.total += 1;
    }

    /// Takes the oldest live credit of (server, tool), if any.
    fn take(&mut self, server_id: &str, tool: &str, now: Duration) -> bool {
        let key = (server_id.to_owned(), tool.to_owned());
        let Some(list) = self.by_call.get_mut(&key) else {
            return false;
        };
        let mut taken = false;
        while let Some(at) = list.pop_front() {
            self.total -= 1;
            if now.saturating_sub(at) <= CREDIT_TTL {
                taken = true;
                break;
            }
        }
        if list.is_empty() {
            self.by_call.remove(&key);
        }
        taken
    }

    fn expire(&mut self, now: Duration) {
        let mut total = 0;
        self.by_call.retain(|_, list| {
            while list
                .front()
                .is_some_and(|at| now.saturating_sub(*at) > CREDIT_TTL)
            {
                list.pop_front();
            }
            total += list.len();
            !list.is_empty()
        });
        self.total = total;
    }
}

impl RateLimiter {
    /// Budgets from the config, time from `clock`.
    pub(crate) fn new(config: &RateLimitsConfig, clock: Arc<dyn Clock>) -> Self {
        let default = Budget {
            per_minute: config.default_rpm,
            burst: config.default_burst,
        };
        let per_server = config
            .per_server
            .iter()
            .map(|(id, l)| {
                (
                    id.clone(),
                    Budget {
                        per_minute: l.calls_per_minute,
                        burst: l.burst.unwrap_or(config.default_burst),
                    },
                )
            })
            .collect();
        let now = clock.now();
        RateLimiter {
            enabled: config.enabled,
            default,
            per_server,
            buckets: RwLock::new(HashMap::new()),
            overflow: Mutex::new(Bucket {
                budget: default,
                tokens: f64::from(default.burst),
                last: now,
            }),
            credits: Mutex::new(Credits::default()),
            clock,
        }
    }

    /// The budget that applies to `server_id`.
    pub(crate) fn budget(&self, server_id: &str) -> Budget {
        self.per_server
            .get(server_id)
            .copied()
            .unwrap_or(self.default)
    }

    /// Counts one call of `tool` on `server_id` at `stage`: `None` if the budget allows it,
    /// else why not. An execution first takes the credit its proposal left (see the module
    /// doc); a proposal that is allowed leaves one.
    pub(crate) fn try_acquire(
        &self,
        server_id: &str,
        tool: &str,
        stage: CallStage,
    ) -> Option<String> {
        if !self.enabled {
            return None;
        }
        let now = self.clock.now();
        if stage == CallStage::Executing
            && self
                .credits
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(server_id, tool, now)
        {
            return None;
        }
        let blocked = self.spend(server_id, now);
        if blocked.is_none() && stage == CallStage::Proposed {
            self.credits
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .add(server_id, tool, now);
        }
        blocked
    }

    /// Takes one token of `server_id`'s bucket.
    fn spend(&self, server_id: &str, now: Duration) -> Option<String> {
        let allowed = {
            let buckets = self.buckets.read().unwrap_or_else(PoisonError::into_inner);
            buckets.get(server_id).map(|bucket| {
                bucket
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take(now)
            })
        };
        let allowed = match allowed {
            Some(allowed) => allowed,
            None => {
                let mut buckets = self.buckets.write().unwrap_or_else(PoisonError::into_inner);
                if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(server_id) {
                    drop(buckets);
                    self.overflow
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .take(now)
                } else {
                    let budget = self.budget(server_id);
                    buckets
                        .entry(server_id.to_string())
                        .or_insert_with(|| {
                            Mutex::new(Bucket {
                                budget,
                                tokens: f64::from(budget.burst),
                                last: now,
                            })
                        })
                        .get_mut()
                        .unwrap_or_else(PoisonError::into_inner)
                        .take(now)
                }
            }
        };
        if allowed {
            None
        } else {
            let budget = self.budget(server_id);
            Some(format!(
                "rate limit: server {server_id:?} is over {} calls/min (burst {})",
                budget.per_minute, budget.burst
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::config::ServerRateLimit;
    use CallStage::{Executing, Proposed};

    fn limiter(clock: Arc<ManualClock>) -> RateLimiter {
        let mut per_server = BTreeMap::new();
        per_server.insert(
            "slow".to_string(),
            ServerRateLimit {
                calls_per_minute: 6,
                burst: Some(2),
            },
        );
        RateLimiter::new(
            &RateLimitsConfig {
                enabled: true,
                default_rpm: 60,
                default_burst: 3,
                per_server,
            },
            clock,
        )
    }

    #[test]
    fn burst_then_refill() {
        let clock = Arc::new(ManualClock::default());
        let limits = limiter(clock.clone());
        // Burst of 3 at once, then empty.
        for _ in 0..3 {
            assert_eq!(limits.try_acquire("fast", "t", Executing), None);
        }
        let reason = limits
            .try_acquire("fast", "t", Executing)
            .expect("over budget");
        assert!(reason.contains("60 calls/min (burst 3)"), "{reason}");
        // 60/min = one per second.
        clock.advance(Duration::from_millis(999));
        assert!(limits.try_acquire("fast", "t", Executing).is_some());
        clock.advance(Duration::from_millis(1));
        assert_eq!(limits.try_acquire("fast", "t", Executing), None);
        assert!(limits.try_acquire("fast", "t", Executing).is_some());
        // A long pause refills only up to the burst.
        clock.advance(Duration::from_secs(3600));
        for _ in 0..3 {
            assert_eq!(limits.try_acquire("fast", "t", Executing), None);
        }
        assert!(limits.try_acquire("fast", "t", Executing).is_some());
    }

    #[test]
    fn per_server_budgets_are_separate() {
        let clock = Arc::new(ManualClock::default());
        let limits = limiter(clock.clone());
        assert_eq!(limits.try_acquire("slow", "t", Executing), None);
        assert_eq!(limits.try_acquire("slow", "t", Executing), None);
        assert!(limits.try_acquire("slow", "t", Executing).is_some());
        // Another server still has its own burst.
        assert_eq!(limits.try_acquire("other", "t", Executing), None);
        // 6/min = one per 10 s.
        clock.advance(Duration::from_secs(10));
        assert_eq!(limits.try_acquire("slow", "t", Executing), None);
        assert!(limits.try_acquire("slow", "t", Executing).is_some());
    }

    #[test]
    fn a_proposed_then_executed_call_counts_once() {
        let clock = Arc::new(ManualClock::default());
        let limits = limiter(clock.clone());
        // Burst 3: three calls, each seen by the LLM layer and then by the shim, all pass.
        for _ in 0..3 {
            assert_eq!(limits.try_acquire("fast", "echo", Proposed), None);
            assert_eq!(limits.try_acquire("fast", "echo", Executing), None);
        }
        // The fourth proposal is over budget and leaves no credit for its execution.
        assert!(limits.try_acquire("fast", "echo", Proposed).is_some());
        assert!(limits.try_acquire("fast", "echo", Executing).is_some());
    }

    #[test]
    fn executions_without_a_proposal_spend_their_own_tokens() {
        let clock = Arc::new(ManualClock::default());
        let limits = limiter(clock.clone());
        assert_eq!(limits.try_acquire("fast", "echo", Proposed), None);
        // One credit, for echo only: another tool's execution spends a token.
        assert_eq!(limits.try_acquire("fast", "add", Executing), None);
        assert_eq!(limits.try_acquire("fast", "echo", Executing), None);
        // The credit is used up: a second execution spends the last token, a third is refused.
        assert_eq!(limits.try_acquire("fast", "echo", Executing), None);
        assert!(limits.try_acquire("fast", "echo", Executing).is_some());
    }

    #[test]
    fn credits_expire() {
        let clock = Arc::new(ManualClock::default());
        let limits = limiter(clock.clone());
        // 6/min for "slow" with burst 2 (see `limiter`): two proposals spend the burst and
        // leave two credits; a third is refused and leaves none.
        assert_eq!(limits.try_acquire("slow", "echo", Proposed), None);
        assert_eq!(limits.try_acquire("slow", "echo", Proposed), None);
        assert!(limits.try_acquire("slow", "echo", Proposed).is_some());
        clock.advance(CREDIT_TTL + Duration::from_secs(1));
        // The bucket refilled to its burst (2); the stale credits count for nothing, so three
        // executions need three tokens and the third is refused.
        assert_eq!(limits.try_acquire("slow", "echo", Executing), None);
        assert_eq!(limits.try_acquire("slow", "echo", Executing), None);
        assert!(limits.try_acquire("slow", "echo", Executing).is_some());
    }

    #[test]
    fn disabled_never_limits() {
        let limits = RateLimiter::new(
            &RateLimitsConfig::default(),
            Arc::new(ManualClock::default()),
        );
        for _ in 0..1000 {
            assert_eq!(limits.try_acquire("x", "t", Executing), None);
        }
    }
}
