//! Per-server call budgets: a token bucket per server (`rate_limits`), refilled continuously
//! at `calls_per_minute`, holding at most `burst` tokens. Time comes from a [`Clock`] so tests
//! can move it without sleeping.

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex, PoisonError, RwLock},
    time::{Duration, Instant},
};

use crate::config::RateLimitsConfig;

/// Most distinct servers that get a bucket of their own; beyond that (only reachable with
/// server ids nobody declared) they share one, so made-up ids cannot grow memory.
const MAX_BUCKETS: usize = 4096;

/// Monotonic time for rate limiting.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Time since an arbitrary fixed start; never goes backwards.
    fn now(&self) -> Duration;
}

/// The real clock.
#[derive(Debug)]
pub struct MonotonicClock {
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
pub struct ManualClock {
    now: Mutex<Duration>,
}

impl ManualClock {
    /// Moves time forward.
    pub fn advance(&self, by: Duration) {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner) += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One server's budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
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
pub struct RateLimiter {
    enabled: bool,
    default: Budget,
    per_server: HashMap<String, Budget>,
    buckets: RwLock<HashMap<String, Mutex<Bucket>>>,
    overflow: Mutex<Bucket>,
    clock: Arc<dyn Clock>,
}

impl RateLimiter {
    /// Budgets from the config, time from `clock`.
    pub fn new(config: &RateLimitsConfig, clock: Arc<dyn Clock>) -> Self {
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
            clock,
        }
    }

    /// The budget that applies to `server_id`.
    pub fn budget(&self, server_id: &str) -> Budget {
        self.per_server
            .get(server_id)
            .copied()
            .unwrap_or(self.default)
    }

    /// Spends one call of `server_id`'s budget: `None` if there was one, else why not.
    pub fn try_acquire(&self, server_id: &str) -> Option<String> {
        if !self.enabled {
            return None;
        }
        let now = self.clock.now();
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
            assert_eq!(limits.try_acquire("fast"), None);
        }
        let reason = limits.try_acquire("fast").expect("over budget");
        assert!(reason.contains("60 calls/min (burst 3)"), "{reason}");
        // 60/min = one per second.
        clock.advance(Duration::from_millis(999));
        assert!(limits.try_acquire("fast").is_some());
        clock.advance(Duration::from_millis(1));
        assert_eq!(limits.try_acquire("fast"), None);
        assert!(limits.try_acquire("fast").is_some());
        // A long pause refills only up to the burst.
        clock.advance(Duration::from_secs(3600));
        for _ in 0..3 {
            assert_eq!(limits.try_acquire("fast"), None);
        }
        assert!(limits.try_acquire("fast").is_some());
    }

    #[test]
    fn per_server_budgets_are_separate() {
        let clock = Arc::new(ManualClock::default());
        let limits = limiter(clock.clone());
        assert_eq!(limits.try_acquire("slow"), None);
        assert_eq!(limits.try_acquire("slow"), None);
        assert!(limits.try_acquire("slow").is_some());
        // Another server still has its own burst.
        assert_eq!(limits.try_acquire("other"), None);
        // 6/min = one per 10 s.
        clock.advance(Duration::from_secs(10));
        assert_eq!(limits.try_acquire("slow"), None);
        assert!(limits.try_acquire("slow").is_some());
    }

    #[test]
    fn disabled_never_limits() {
        let limits = RateLimiter::new(
            &RateLimitsConfig::default(),
            Arc::new(ManualClock::default()),
        );
        for _ in 0..1000 {
            assert_eq!(limits.try_acquire("x"), None);
        }
    }
}
