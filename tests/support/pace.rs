//! The pace of the tests' writers and readers.
#![allow(dead_code)]

use std::time::Duration;

/// A ticker for a writer's or reader's loop: at most one operation per
/// 2 ms (500 a second). Unpaced, the three writers of a 3-shard test (one
/// per shard) and its operator took 14.3 s of CPU in 29 s, and two such
/// tests at once starve the API server and the Redis servers of a 2-core
/// machine for seconds: the very stalls the tests then measure. Paced, the
/// same test took 8.3 s. Two milliseconds still resolve every gap the
/// tests assert on.
pub fn pacer() -> tokio::time::Interval {
    let mut t = tokio::time::interval(Duration::from_millis(2));
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    t
}
