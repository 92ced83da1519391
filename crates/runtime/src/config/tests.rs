//! Tests of the configuration: parsing, validation, overrides and the Mu settings derived.

use super::*;
use crate::realtime::Realtime;

const SAMPLE: &str = r#"
[cluster]
name = "demo"
members = [
  { id = 0, client = "127.0.0.1:6380" },
  { id = 1, client = "127.0.0.1:6381" },
  { id = 2, client = "127.0.0.1:6382" },
]
[cluster.timing]
heartbeat_us = 500

[node]
id = 1
mode = "direct"
"#;

#[test]
fn parses_with_defaults_and_converts_to_mu() {
    let c = Config::parse(SAMPLE, &[]).expect("valid");
    assert_eq!(c.node.mode, AttachMode::Direct);
    assert_eq!(c.node.max_batch, 64);
    assert_eq!(c.node.background.idle, IdlePolicy::Park);
    let mu = c.mu_config().expect("mu");
    assert_eq!((mu.node, mu.replicas, mu.heartbeat_period_ns), (NodeId(1), 3, 500_000));
    assert_eq!(mu.idle_stride, 64, "32 ms of idle heartbeat (unset) is 64 heartbeats of 500 us");
    let fast = Config::parse(SAMPLE, &["cluster.timing.heartbeat_us=100".into()]).expect("valid");
    assert_eq!(fast.mu_config().expect("mu").idle_stride, 255, "unset, capped at 255 heartbeats, not refused");
    for (idle_us, stride) in [(0, 1), (499, 1), (1_250, 2), (127_500, 255)] {
        let set = [format!("cluster.timing.idle_heartbeat_us={idle_us}")];
        let mu = Config::parse(SAMPLE, &set).expect("valid").mu_config().expect("mu");
        assert_eq!(mu.idle_stride, stride, "idle_heartbeat_us = {idle_us}");
    }
    assert_eq!(c.listen_addr().expect("addr").port(), 6381);
    // What `cluster up` writes reads back the same.
    assert_eq!(Config::parse(&c.to_toml(), &[]).expect("round trip"), c);
}

#[test]
fn overrides_apply_before_validation() {
    let c = Config::parse(SAMPLE, &["node.id=2".into(), "cluster.log.slots=2048".into(), "node.mode=handover".into()])
        .expect("valid");
    assert_eq!((c.node.id, c.cluster.log.slots, c.node.mode), (2, 2048, AttachMode::Handover));
    let e = Config::parse(SAMPLE, &["node.id=3".into()]).expect_err("no member 3");
    assert_eq!(e.key, "node.id");
    let e = Config::parse(SAMPLE, &["nonsense".into()]).expect_err("no =");
    assert!(e.problem.contains("key.path=value"), "{e}");
}

#[test]
fn errors_name_the_key() {
    let bad = |text: &str| Config::parse(text, &[]).expect_err("invalid");
    let e = bad(&SAMPLE.replace("6381", "notaport"));
    assert_eq!(e.key, "cluster.members[1].client");
    let e = bad(&SAMPLE.replace("{ id = 1,", "{ id = 5,"));
    assert_eq!(e.key, "cluster.members[1].id");
    let e = bad(&SAMPLE.replace("heartbeat_us = 500", "heartbeat_us = 0"));
    assert_eq!(e.key, "cluster.timing.heartbeat_us");
    let e = bad(&SAMPLE.replace("heartbeat_us = 500", "heartbeat_us = 500\nidle_heartbeat_us = 128000"));
    assert_eq!(e.key, "cluster.timing.idle_heartbeat_us");
    assert!(e.problem.contains("at most 255 heartbeats (127500 us"), "{e}");
    let e = bad(&SAMPLE.replace("heartbeat_us = 500", "heartbeat_us = 500\nidle_heartbeat_us = -1"));
    assert!(e.problem.contains("idle_heartbeat_us"), "{e}");
    let e = bad(&SAMPLE.replace("[node]", "[cluster.log]\nslot_bytes = 12\n[node]"));
    assert_eq!(e.key, "cluster.log.slot_bytes");
    let e = bad(&SAMPLE.replace("mode = \"direct\"", "mode = \"telepathy\""));
    assert!(e.problem.contains("telepathy") && e.problem.contains("line"), "{e}");
    let e = bad(&SAMPLE.replace("[node]", "[node]\ncolour = 1"));
    assert!(e.problem.contains("colour"), "{e}");
    let e = bad(&SAMPLE.replace("\"demo\"", "\"no spaces\""));
    assert_eq!(e.key, "cluster.name");
    let e = bad(&SAMPLE.replace("[node]", "[node]\nmetrics = \"localhost\""));
    assert_eq!(e.key, "node.metrics");
    let e = bad(&SAMPLE.replace("members = [", "durability = \"fsync\"\nmembers = ["));
    assert_eq!(e.key, "node.data_dir");
    let e = bad(&SAMPLE.replace("members = [", "durability = \"paper\"\nmembers = ["));
    assert!(e.problem.contains("paper") && e.problem.contains("fsync"), "{e}");
}

#[test]
fn a_real_time_priority_is_refused_out_of_range_or_on_a_thread_that_spins() {
    let with = |o: &str| Config::parse(SAMPLE, &[o.to_string()]);
    let defaults = Config::parse(SAMPLE, &[]).expect("sample");
    assert_eq!(defaults.node.background.realtime_priority, Realtime::Auto);
    assert_eq!(defaults.node.replication.realtime_priority, Realtime::Off);
    for (setting, expected) in [
        ("1", Realtime::Priority(1)),
        ("\"off\"", Realtime::Off),
        ("\"auto\"", Realtime::Auto),
        ("auto", Realtime::Auto),
    ] {
        let c = with(&format!("node.background.realtime_priority={setting}")).expect("the background thread parks");
        assert_eq!(c.node.background, ThreadConfig { realtime_priority: expected, ..ThreadConfig::background() });
        assert_eq!(Config::parse(&c.to_toml(), &[]).expect("round trip"), c);
    }
    for bad in ["0", "100"] {
        let e = with(&format!("node.background.realtime_priority={bad}")).expect_err("out of range");
        assert_eq!(e.key, "node.background.realtime_priority");
        assert!(e.problem.contains("1..=99"), "{e}");
    }
    for bad in ["300", "\"fast\""] {
        let e = with(&format!("node.background.realtime_priority={bad}")).expect_err("not a setting");
        assert!(e.to_string().contains("realtime_priority"), "{e}");
    }
    // `auto` leaves a yielding background thread at normal priority; a fixed priority is refused.
    let yielding = with("node.background.idle=\"yield\"").expect("auto with a yielding thread");
    let e = Config::parse(&yielding.to_toml(), &["node.background.realtime_priority=1".into()]);
    let e = e.expect_err("a yielding background thread");
    assert_eq!(e.key, "node.background.realtime_priority");
    assert!(e.problem.contains("idle = \"park\""), "{e}");
    for (idle, setting) in [("backoff", "1"), ("park", "1"), ("park", "\"auto\"")] {
        let c = Config::parse(
            SAMPLE,
            &[format!("node.replication.idle=\"{idle}\""), format!("node.replication.realtime_priority={setting}")],
        );
        let e = c.expect_err("the replication thread polls on while busy");
        assert_eq!(e.key, "node.replication.realtime_priority");
        assert!(e.problem.contains("background thread only"), "{e}");
    }
}

#[test]
fn durability_is_part_of_the_fingerprint_and_reaches_the_core() {
    let none = Config::parse(SAMPLE, &[]).expect("valid");
    assert!(!none.mu_config().expect("mu").durable);
    let fsync =
        Config::parse(SAMPLE, &["cluster.durability=fsync".into(), "node.data_dir=/tmp/d".into()]).expect("valid");
    assert!(fsync.mu_config().expect("mu").durable);
    assert_ne!(none.cluster.fingerprint(), fsync.cluster.fingerprint());
    assert!(!none.to_toml().contains("durability"), "the default is not rendered: fingerprints stay");
    assert_eq!(Config::parse(&fsync.to_toml(), &[]).expect("round trip"), fsync);
}

#[test]
fn fingerprint_covers_the_cluster_part_only() {
    let a = Config::parse(SAMPLE, &[]).expect("valid");
    let b = Config::parse(SAMPLE, &["node.id=0".into(), "node.max_batch=8".into()]).expect("valid");
    assert_eq!(a.cluster.fingerprint(), b.cluster.fingerprint());
    let c = Config::parse(SAMPLE, &["cluster.timing.heartbeat_us=501".into()]).expect("valid");
    assert_ne!(a.cluster.fingerprint(), c.cluster.fingerprint());
}
