//! Accept loops that survive running out of descriptors (issue 13: the MCP proxy spun and
//! logged 120 MB in 20 s; issue 15: so did the daemon's API under a descriptor flood).

use std::time::Duration;

/// Waits after a failed `accept`: out of file descriptors (EMFILE, ENFILE) or memory the
/// listener stays readable, so retrying at once would spin and log without end. The wait
/// doubles from 10 ms to 1 s; the error is logged once per wait that grows, then once a minute.
#[derive(Default)]
pub(crate) struct AcceptBackoff {
    wait: Duration,
    failures: u64,
    last_log: Option<tokio::time::Instant>,
}

impl AcceptBackoff {
    const FIRST: Duration = Duration::from_millis(10);
    const MOST: Duration = Duration::from_secs(1);

    pub(crate) async fn failed(&mut self, error: &std::io::Error) {
        self.failures += 1;
        self.wait = (self.wait * 2).clamp(Self::FIRST, Self::MOST);
        let now = tokio::time::Instant::now();
        if self
            .last_log
            .is_none_or(|t| self.wait < Self::MOST || now - t >= Duration::from_secs(60))
        {
            tracing::warn!(
                failures = self.failures,
                "cannot accept a connection ({error}); retrying in {:?}",
                self.wait
            );
            self.last_log = Some(now);
        }
        tokio::time::sleep(self.wait).await;
    }

    pub(crate) fn reset(&mut self) {
        if self.failures > 0 {
            tracing::info!(failures = self.failures, "accepting connections again");
        }
        *self = Self::default();
    }
}
