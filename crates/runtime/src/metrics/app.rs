//! Counters an application adds to its node's metrics (`Node::register_counter`): the
//! application keeps the count wherever it already does, and gives a closure that reads it,
//! called only when a scraper asks. Nothing is added to any hot path.

use std::sync::{Mutex, PoisonError};

/// Families the node renders itself (`render`); an application's counter cannot take one of
/// these names. A unit test renders a page and checks that every family in it is listed here.
pub(crate) const BUILT_IN: [&str; 23] = [
    "microrep_node",
    "microrep_commits",
    "microrep_commit_latency_seconds",
    "microrep_proposals_refused",
    "microrep_leader_changes",
    "microrep_leader",
    "microrep_role",
    "microrep_failover_detection_seconds",
    "microrep_failover_last_detection_seconds",
    "microrep_failover_switch_seconds",
    "microrep_failover_last_switch_seconds",
    "microrep_permission_revocations",
    "microrep_log_fuo",
    "microrep_log_applied",
    "microrep_log_tail",
    "microrep_recovering",
    "microrep_pending_proposals",
    "microrep_confirmed_followers",
    "microrep_terms_led",
    "microrep_prepares",
    "microrep_stopped",
    "microrep_resting",
    "microrep_uptime_seconds",
];

/// Why an application's counter was not added.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetricNameError {
    /// Not a Prometheus metric name.
    #[error("metric name {0:?} is not a Prometheus name ([a-zA-Z_:][a-zA-Z0-9_:]*)")]
    Invalid(String),
    /// A counter's exposition appends `_total` itself.
    #[error("metric name {0:?} ends in _total, which the exposition of a counter appends itself")]
    TotalSuffix(String),
    /// One of the node's own metrics.
    #[error("metric name {0:?} is one of the node's own metrics")]
    Reserved(String),
    /// Registered before on this node.
    #[error("metric name {0:?} is registered already")]
    Duplicate(String),
}

/// Checks `name` against everything but the counters already registered.
pub(crate) fn check_name(name: &str) -> Result<(), MetricNameError> {
    let mut chars = name.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
    if !valid {
        return Err(MetricNameError::Invalid(name.to_string()));
    }
    if name.ends_with("_total") {
        return Err(MetricNameError::TotalSuffix(name.to_string()));
    }
    if BUILT_IN.contains(&name) {
        return Err(MetricNameError::Reserved(name.to_string()));
    }
    Ok(())
}

type Read = Box<dyn Fn() -> u64 + Send + Sync>;

struct AppCounter {
    name: String,
    help: String,
    read: Read,
}

/// The counters an application registered, in the order it did.
#[derive(Default)]
pub(crate) struct AppCounters(Mutex<Vec<AppCounter>>);

impl std::fmt::Debug for AppCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let counters = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        f.debug_list().entries(counters.iter().map(|c| &c.name)).finish()
    }
}

impl AppCounters {
    pub(crate) fn register(&self, name: &str, help: &str, read: Read) -> Result<(), MetricNameError> {
        check_name(name)?;
        let mut counters = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if counters.iter().any(|c| c.name == name) {
            return Err(MetricNameError::Duplicate(name.to_string()));
        }
        // The text format ends a HELP line at a newline and takes a backslash as an escape;
        // `prometheus-client` writes help as given, so an application's text is escaped here.
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        counters.push(AppCounter { name: name.to_string(), help, read });
        Ok(())
    }

    /// (name, help, value) of each counter, read now.
    pub(crate) fn read(&self) -> Vec<(String, String, u64)> {
        let counters = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        counters.iter().map(|c| (c.name.clone(), c.help.clone(), (c.read)())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_counters_read_when_asked() {
        let counters = AppCounters::default();
        let n = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(3));
        let seen = std::sync::Arc::clone(&n);
        counters
            .register("app_things", "Things", Box::new(move || seen.load(std::sync::atomic::Ordering::Relaxed)))
            .expect("a good name");
        n.store(7, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(counters.read(), vec![("app_things".to_string(), "Things".to_string(), 7)]);
        let err = |name: &str| counters.register(name, "", Box::new(|| 0)).expect_err(name);
        assert_eq!(err("app_things"), MetricNameError::Duplicate("app_things".into()));
        assert_eq!(err("microrep_commits"), MetricNameError::Reserved("microrep_commits".into()));
        assert_eq!(err("app_things_total"), MetricNameError::TotalSuffix("app_things_total".into()));
        for bad in ["", "9lives", "with space", "dash-ed", "é"] {
            assert_eq!(err(bad), MetricNameError::Invalid(bad.into()));
        }
        assert!(check_name("a:b_c9").is_ok());
        assert_eq!(counters.read().len(), 1, "refused names add nothing");
        counters.register("app_lines", "two\nlines \\ one", Box::new(|| 1)).expect("any help text");
        assert_eq!(counters.read()[1].1, "two\\nlines \\\\ one", "help stays on one line of the page");
    }
}
