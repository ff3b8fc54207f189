//! Named points where a test stops the operator as a crash would, to prove
//! that each multi-step action resumes correctly after it. A point is armed
//! by listing its name in `REDPILOT_FAILPOINTS` (comma-separated); unarmed
//! points cost one environment lookup on paths that run rarely (promotions).

/// The exit code of a process stopped at a failpoint.
pub const EXIT_CODE: i32 = 86;

/// Exits the process at once (no lease release, no cleanup) when `name` is
/// armed.
pub fn hit(name: &str) {
    if armed(std::env::var("REDPILOT_FAILPOINTS").ok().as_deref(), name) {
        tracing::error!(
            failpoint = name,
            "failpoint reached: exiting as a crash would"
        );
        std::process::exit(EXIT_CODE);
    }
}

/// Whether `name` is armed (a point where a test makes the operator meet
/// a condition it cannot cause itself, rather than exit).
pub fn armed_here(name: &str) -> bool {
    armed(std::env::var("REDPILOT_FAILPOINTS").ok().as_deref(), name)
}

fn armed(list: Option<&str>, name: &str) -> bool {
    list.is_some_and(|l| l.split(',').any(|p| p.trim() == name))
}

#[cfg(test)]
mod tests {
    use super::armed;

    #[test]
    fn only_listed_points_are_armed() {
        assert!(armed(Some("after-promote"), "after-promote"));
        assert!(armed(Some("a, after-promote"), "after-promote"));
        assert!(!armed(Some("after-promote-x"), "after-promote"));
        assert!(!armed(Some(""), "after-promote"));
        assert!(!armed(None, "after-promote"));
    }
}
