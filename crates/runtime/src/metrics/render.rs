//! Renders a node's metrics in the OpenMetrics text format with `prometheus-client`: a scrape
//! copies the counters and the status into a [`Scrape`], which a collector of a fresh registry
//! encodes.

use std::fmt::Error;
use std::sync::atomic::Ordering;

use microrep_core::mu::Role;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use super::histogram::HistogramSnapshot;
use super::{NodeMetrics, REFUSALS};
use crate::status::NodeStatus;

/// One scrape's values.
#[derive(Debug)]
struct Scrape {
    status: NodeStatus,
    commit_latency: HistogramSnapshot,
    refused: [u64; REFUSALS.len()],
    leader_changes: u64,
    revocations: u64,
    detection: HistogramSnapshot,
    switch: HistogramSnapshot,
    last_detection_ns: u64,
    last_switch_ns: u64,
    /// The application's counters: (name, help, value).
    app: Vec<(String, String, u64)>,
}

/// The metrics of a node whose status is `status`, as an OpenMetrics text exposition.
pub(crate) fn render(metrics: &NodeMetrics, status: NodeStatus) -> String {
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let scrape = Scrape {
        status,
        commit_latency: metrics.commit_latency.snapshot(),
        refused: std::array::from_fn(|i| load(&metrics.refused[i])),
        leader_changes: load(&metrics.leader_changes),
        revocations: load(&metrics.revocations),
        detection: metrics.detection.snapshot(),
        switch: metrics.switch.snapshot(),
        last_detection_ns: load(&metrics.last_detection_ns),
        last_switch_ns: load(&metrics.last_switch_ns),
        app: metrics.app.read(),
    };
    let mut registry = Registry::default();
    registry.register_collector(Box::new(scrape));
    let mut text = String::new();
    // Writing to a String fails only if an encoder does, which ours do not.
    if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &registry) {
        text = format!("# cannot encode the metrics: {e}\n# EOF\n");
    }
    text
}

fn counter(e: &mut DescriptorEncoder<'_>, name: &str, help: &str, value: u64) -> Result<(), Error> {
    e.encode_descriptor(name, help, None, MetricType::Counter)?.encode_counter::<NoLabelSet, _, u64>(&value, None)
}

fn gauge(e: &mut DescriptorEncoder<'_>, name: &str, help: &str, value: i64) -> Result<(), Error> {
    e.encode_descriptor(name, help, None, MetricType::Gauge)?.encode_gauge(&value)
}

fn seconds_gauge(e: &mut DescriptorEncoder<'_>, name: &str, help: &str, ns: u64) -> Result<(), Error> {
    e.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Gauge)?.encode_gauge(&(ns as f64 / 1e9))
}

fn histogram(e: &mut DescriptorEncoder<'_>, name: &str, help: &str, h: &HistogramSnapshot) -> Result<(), Error> {
    let mut m: MetricEncoder<'_> = e.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Histogram)?;
    m.encode_histogram::<NoLabelSet>(h.sum_seconds, h.count, &h.buckets, None)
}

impl Collector for Scrape {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), Error> {
        let s = &self.status;
        let node = s.node.to_string();
        e.encode_descriptor("microrep_node", "This replica: its id and cluster fingerprint", None, MetricType::Info)?
            .encode_info(&[("node", node.as_str()), ("fingerprint", s.fingerprint.as_str())])?;
        counter(
            &mut e,
            "microrep_commits",
            "Commands proposed on this node that committed",
            self.commit_latency.count,
        )?;
        histogram(
            &mut e,
            "microrep_commit_latency",
            "Submit to commit of commands proposed on this node",
            &self.commit_latency,
        )?;
        let mut refused = e.encode_descriptor(
            "microrep_proposals_refused",
            "Proposals made on this node that failed, by the kind of error",
            None,
            MetricType::Counter,
        )?;
        for (kind, n) in REFUSALS.iter().zip(self.refused) {
            refused.encode_family(&[("kind", *kind)])?.encode_counter::<NoLabelSet, _, u64>(&n, None)?;
        }
        counter(
            &mut e,
            "microrep_leader_changes",
            "Leaders this replica's replication plane followed (the first one after start included)",
            self.leader_changes,
        )?;
        gauge(
            &mut e,
            "microrep_leader",
            "The replica this one believes leads (its failure detector's choice); -1 before it chose one",
            s.leader.map_or(-1, i64::from),
        )?;
        let mut roles = e.encode_descriptor(
            "microrep_role",
            "1 for this replica's current role, 0 for the others",
            None,
            MetricType::Gauge,
        )?;
        for (name, role) in [("follower", Role::Follower), ("candidate", Role::Candidate), ("leader", Role::Leader)] {
            roles.encode_family(&[("role", name)])?.encode_gauge(&i64::from(s.role == role))?;
        }
        histogram(
            &mut e,
            "microrep_failover_detection",
            "From the first heartbeat read that found a failed leader's counter stalled to the choice of the next \
             leader, as this replica's failure detector saw it",
            &self.detection,
        )?;
        seconds_gauge(
            &mut e,
            "microrep_failover_last_detection",
            "The latest fail-over's detection time (0 before the first)",
            self.last_detection_ns,
        )?;
        histogram(
            &mut e,
            "microrep_failover_switch",
            "From the choice of a new leader to the first entry this replica applied after it",
            &self.switch,
        )?;
        seconds_gauge(
            &mut e,
            "microrep_failover_last_switch",
            "The latest fail-over's switch time (0 before the first)",
            self.last_switch_ns,
        )?;
        counter(
            &mut e,
            "microrep_permission_revocations",
            "Times this replica revoked one replica's write permission on its log to grant it to another",
            self.revocations,
        )?;
        let index = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        gauge(&mut e, "microrep_log_fuo", "First undecided offset of this replica's log", index(s.fuo))?;
        gauge(&mut e, "microrep_log_applied", "Next log index this replica applies (its log head)", index(s.applied))?;
        gauge(
            &mut e,
            "microrep_log_tail",
            "This replica's log recycling point: slots below it may be reused",
            index(s.tail),
        )?;
        gauge(
            &mut e,
            "microrep_recovering",
            "1 while this replica recovers from a start with fresh memory (it counts in no quorum)",
            i64::from(s.recovering),
        )?;
        gauge(
            &mut e,
            "microrep_pending_proposals",
            "Proposals queued in this replica's protocol core",
            index(s.pending as u64),
        )?;
        gauge(
            &mut e,
            "microrep_confirmed_followers",
            "Followers that granted this replica write permission (when it leads)",
            index(s.confirmed.len() as u64),
        )?;
        counter(&mut e, "microrep_terms_led", "Times this replica became leader", s.terms_led)?;
        counter(&mut e, "microrep_prepares", "Prepare phases this replica ran", s.prepares)?;
        gauge(
            &mut e,
            "microrep_stopped",
            "1 if this replica stopped on its own (see microrep status for why)",
            i64::from(s.fatal.is_some()),
        )?;
        gauge(
            &mut e,
            "microrep_resting",
            "1 while this replica rests between heartbeats (the cluster is idle; cluster.timing.idle_heartbeat_us)",
            i64::from(s.resting),
        )?;
        seconds_gauge(&mut e, "microrep_uptime", "Time since this replica started", s.uptime_ms * 1_000_000)?;
        for (name, help, value) in &self.app {
            counter(&mut e, name, help, *value)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use microrep_fabric::NodeId;

    #[test]
    fn a_scrape_names_every_metric_with_its_unit_and_ends_with_eof() {
        let metrics = NodeMetrics::new();
        metrics.committed(2_500);
        metrics.refused(&crate::api::ProposeError::Backlogged);
        let mut status = NodeStatus::new(NodeId(1), 0xab);
        status.role = Role::Leader;
        status.leader = Some(1);
        let text = render(&metrics, status);
        for line in [
            "microrep_node_info{node=\"1\",fingerprint=\"00000000000000ab\"} 1",
            "microrep_commits_total 1",
            "microrep_commit_latency_seconds_count 1",
            "microrep_commit_latency_seconds_bucket{le=\"0.000003\"} 1",
            "microrep_proposals_refused_total{kind=\"backlogged\"} 1",
            "microrep_proposals_refused_total{kind=\"timeout\"} 0",
            "microrep_role{role=\"leader\"} 1",
            "microrep_role{role=\"follower\"} 0",
            "microrep_leader 1",
            "microrep_recovering 1",
            "# UNIT microrep_failover_switch_seconds seconds",
        ] {
            assert!(text.lines().any(|l| l == line), "no line {line:?} in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn every_family_the_node_renders_is_reserved_and_the_applications_follow_them() {
        let metrics = NodeMetrics::new();
        metrics.register_counter("app_widgets", "Widgets made", Box::new(|| 42)).expect("register");
        let text = render(&metrics, NodeStatus::new(NodeId(0), 1));
        let families: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next()).collect();
        let (own, app): (Vec<&str>, Vec<&str>) = families.iter().partition(|f| f.starts_with("microrep_"));
        assert_eq!(own, super::super::app::BUILT_IN, "the reserved names must list the node's families");
        assert_eq!(app, ["app_widgets"]);
        assert!(text.lines().any(|l| l == "app_widgets_total 42"), "{text}");
        assert!(text.lines().any(|l| l == "# HELP app_widgets Widgets made"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
