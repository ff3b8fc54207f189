//! Whether the cluster serves an optional API another project installs
//! (the prometheus-operator's kinds, cert-manager's): looked up through
//! discovery and remembered for a while, so a cluster without it sees one
//! request per interval and no error, and one that gains it later is
//! noticed.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::Client;

/// One group/version and the resources (plurals) that must all be served.
pub struct Served {
    group_version: &'static str,
    plurals: &'static [&'static str],
    recheck: Duration,
    last: Mutex<Option<(Instant, bool)>>,
}

impl Served {
    /// `plurals` of `group_version`, looked up again after `recheck`.
    pub const fn new(
        group_version: &'static str,
        plurals: &'static [&'static str],
        recheck: Duration,
    ) -> Self {
        Self {
            group_version,
            plurals,
            recheck,
            last: Mutex::new(None),
        }
    }

    /// Whether every one of the plurals is served (a discovery failure
    /// counts as not served).
    pub async fn check(&self, client: &Client) -> bool {
        if let Ok(s) = self.last.lock()
            && let Some((at, yes)) = *s
            && at.elapsed() < self.recheck
        {
            return yes;
        }
        let yes = match client.list_api_group_resources(self.group_version).await {
            Ok(list) => self
                .plurals
                .iter()
                .all(|p| list.resources.iter().any(|r| r.name == *p)),
            Err(_) => false,
        };
        if let Ok(mut s) = self.last.lock() {
            *s = Some((Instant::now(), yes));
        }
        yes
    }
}
