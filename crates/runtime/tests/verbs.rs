//! `cluster.fabric = "verbs"`: the configuration keys (`node.verbs`, the members' bootstrap
//! addresses) and what a node makes of them, tested without an RDMA device: typed errors for a
//! missing device, a bad GID index and a locked-memory limit too low (an injected limit). With
//! the `verbs` feature (`cargo test -p microrep --features verbs --test verbs`; the soft-RoCE
//! VM slice, scripts/verbs-test.sh, runs it where a device exists).

use microrep::config::FabricKind;
use microrep::{Apply, Config, Index, RestoreError, StartError};

/// A replicated application that is never reached: these nodes do not start.
#[derive(Debug, Default)]
struct Nothing;

impl Apply for Nothing {
    fn apply(&mut self, _index: Index, _command: &[u8], _reply: &mut Vec<u8>) {}
    fn snapshot(&self, _out: &mut Vec<u8>) {}
    fn restore(&mut self, _snapshot: &[u8]) -> Result<(), RestoreError> {
        Ok(())
    }
}

const VERBS: &str = r#"
[cluster]
name = "rdma"
fabric = "verbs"
members = [
  { id = 0, client = "10.0.0.1:6380", fabric = "10.0.0.1:7380" },
  { id = 1, client = "10.0.0.2:6380", fabric = "10.0.0.2:7380" },
  { id = 2, client = "10.0.0.3:6380", fabric = "10.0.0.3:7380" },
]
[node]
id = 2
[node.verbs]
device = "mlx5_0"
gid_index = 3
"#;

#[test]
fn verbs_members_have_bootstrap_addresses_and_nodes_choose_their_device() {
    let c = Config::parse(VERBS, &[]).expect("valid");
    assert_eq!(c.cluster.fabric, FabricKind::Verbs);
    assert_eq!(c.cluster.fabric_addr(1).expect("member 1").to_string(), "10.0.0.2:7380");
    let verbs = c.node.verbs.clone().expect("node.verbs");
    assert_eq!((verbs.device.as_deref(), verbs.gid_index, verbs.port), (Some("mlx5_0"), Some(3), 1));
    assert_eq!((verbs.retry_count, verbs.ack_timeout_exp), (7, 14), "the transport's defaults");
    assert_eq!(Config::parse(&c.to_toml(), &[]).expect("round trip"), c);
    // The device is this host's business: another member names another one.
    let other = Config::parse(VERBS, &["node.id=0".into(), "node.verbs.device=rxe0".into()]).expect("valid");
    assert_eq!(other.cluster.fingerprint(), c.cluster.fingerprint());
    // Without [node.verbs]: the first device and an automatic GID.
    let auto =
        Config::parse(&VERBS.replace("[node.verbs]\ndevice = \"mlx5_0\"\ngid_index = 3\n", ""), &[]).expect("valid");
    assert_eq!(auto.node.verbs, None);
}

#[test]
fn verbs_settings_are_checked_before_any_device_is_opened() {
    let bad = |overrides: &[&str]| {
        let overrides: Vec<String> = overrides.iter().map(|o| o.to_string()).collect();
        Config::parse(VERBS, &overrides).expect_err("invalid")
    };
    let e = bad(&["node.verbs.gid_index=256"]);
    assert_eq!(e.key, "node.verbs.gid_index");
    assert!(e.problem.contains("256") && e.problem.contains("0..=255"), "{e}");
    assert!(bad(&["node.verbs.gid_index=-1"]).problem.contains("-1"), "not an index");
    assert_eq!(bad(&["node.verbs.port=0"]).key, "node.verbs.port");
    assert_eq!(bad(&["node.verbs.retry_count=8"]).key, "node.verbs.retry_count");
    assert_eq!(bad(&["node.verbs.ack_timeout_exp=32"]).key, "node.verbs.ack_timeout_exp");
    assert_eq!(bad(&["node.verbs.device=\"\""]).key, "node.verbs.device");
    assert!(bad(&["node.verbs.devcie=rxe0"]).problem.contains("devcie"), "unknown keys are refused");
    let e = bad(&["cluster.fabric=tcp"]);
    assert_eq!((e.key.as_str(), e.problem.contains("\"tcp\"")), ("node.verbs", true), "{e}");
    let e = Config::parse(&VERBS.replace(", fabric = \"10.0.0.2:7380\"", ""), &[]).expect_err("no address");
    assert_eq!(e.key, "cluster.members[1].fabric");
    assert!(e.problem.contains("required with fabric = \"verbs\""), "{e}");
    let e = Config::parse(&VERBS.replace("\"10.0.0.3:7380\"", "\"host7380\""), &[]).expect_err("no port");
    assert_eq!(e.key, "cluster.members[2].fabric");
    let shm = VERBS
        .replace("fabric = \"verbs\"", "fabric = \"shm\"")
        .replace("[node.verbs]\ndevice = \"mlx5_0\"\ngid_index = 3\n", "");
    let e = Config::parse(&shm, &[]).expect_err("a shm member has no fabric address");
    assert_eq!(e.key, "cluster.members[0].fabric");
}

/// The config with the device of `node.verbs` replaced by `device`, on loopback addresses.
fn local_with_device(device: &str) -> Config {
    let text = VERBS.replace("10.0.0.1", "127.0.0.1").replace("10.0.0.2", "127.0.0.1").replace("10.0.0.3", "127.0.0.1");
    let text = text.replace(":7380\" },\n  { id = 1", ":7381\" },\n  { id = 1").replace("mlx5_0", device);
    Config::parse(&text, &[]).expect("valid")
}

#[cfg(not(feature = "verbs"))]
#[test]
fn a_build_without_verbs_says_how_to_get_it() {
    let e = microrep::start(&local_with_device("rxe0"), Nothing).expect_err("no verbs in this build");
    assert!(matches!(e, StartError::NotBuilt { fabric: FabricKind::Verbs }), "{e:?}");
    assert!(e.to_string().contains("--features verbs"), "{e}");
}

#[cfg(feature = "verbs")]
mod with_verbs {
    use microrep::verbs_config;
    use microrep_fabric::{FabricError, NodeId};

    use super::*;

    #[test]
    fn the_fabric_gets_the_device_the_addresses_and_an_endpoint_count() {
        let config = Config::parse(VERBS, &["node.verbs.retry_count=3".into()]).expect("valid");
        let verbs = verbs_config(&config).expect("verbs config");
        assert_eq!((verbs.node, verbs.max_nodes), (NodeId(2), 3));
        assert_eq!((verbs.device.as_deref(), verbs.gid_index, verbs.port), (Some("mlx5_0"), Some(3), 1));
        assert_eq!((verbs.retry_count, verbs.ack_timeout_exp), (3, 14));
        assert_eq!(verbs.listen.to_string(), "10.0.0.3:7380", "its own member's bootstrap address");
        assert_eq!(verbs.peers.get(NodeId(0)).map(|a| a.to_string()).as_deref(), Some("10.0.0.1:7380"));
        assert_eq!(verbs.peers.get(NodeId(1)).map(|a| a.to_string()).as_deref(), Some("10.0.0.2:7380"));
        assert_eq!(verbs.regions, microrep::regions(&config).expect("regions"));
        assert_eq!(verbs.endpoints, 6, "replication, background and identity endpoints to each of 2 peers");
        let e =
            verbs_config(&Config { node: microrep::config::NodeConfig::new(7), ..config }).expect_err("no member 7");
        assert_eq!(e.key, "node.id");
    }

    #[test]
    fn a_memlock_limit_below_the_regions_and_staging_rings_is_refused_with_both_figures() {
        let config = Config::parse(VERBS, &[]).expect("valid");
        let verbs = verbs_config(&config).expect("verbs config");
        let log_bytes = u64::from(config.cluster.log.slots) * u64::from(config.cluster.log.slot_bytes);
        let needed = verbs.pinned_bytes();
        assert!(needed > log_bytes + 6 * verbs.staging_bytes as u64, "{needed}");
        let limit = 8 << 20; // Debian's default `ulimit -l`
        let e = verbs.check_memlock(Some(limit), false).expect_err("8 MiB is too little");
        assert_eq!(e, FabricError::MemlockTooLow { limit_bytes: limit, needed_bytes: needed });
        let text = StartError::from(e).to_string();
        assert!(text.contains(&format!("limit is {limit} bytes but {needed} must be pinned")), "{text}");
        assert!(text.contains("ulimit -l"), "{text}");
        verbs.check_memlock(Some(needed), false).expect("exactly enough");
        verbs.check_memlock(None, false).expect("unlimited");
        verbs.check_memlock(Some(limit), true).expect("privileged");
    }

    #[test]
    fn a_device_that_does_not_exist_is_named_in_the_error() {
        let e = microrep::start(&local_with_device("microrep-missing0"), Nothing).expect_err("no such device");
        let StartError::Fabric(FabricError::NoRdmaDevice(why)) = &e else { panic!("{e:?}") };
        assert!(why.contains("microrep-missing0"), "{why}");
        assert!(e.to_string().starts_with("no usable RDMA device"), "{e}");
    }
}
