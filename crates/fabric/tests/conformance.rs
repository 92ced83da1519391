//! The fabric conformance suite run against every backend (see `microrep_fabric::conformance`).

mod shm {
    fn harness(name: &str) -> microrep_fabric::shm::ShmHarness {
        microrep_fabric::shm::ShmHarness::new(name)
    }
    microrep_fabric::conformance_tests!(harness);
}

mod sim {
    use microrep_fabric::sim::{SimConfig, SimHarness};

    /// Delays and torn writes, but no injected operation failures: the checks expect every
    /// permitted operation to succeed.
    fn config() -> SimConfig {
        SimConfig { fail_prob: 0.0, ..SimConfig::faulty() }
    }

    fn harness(_name: &str) -> SimHarness {
        SimHarness::new(1, config())
    }
    microrep_fabric::conformance_tests!(harness);

    /// A simulated fabric that lends peers' memory, as shm does.
    #[test]
    fn peer_memory_is_lent_where_configured() {
        let lending = SimConfig { lend_peer_memory: true, ..config() };
        microrep_fabric::conformance::peer_memory_is_lent_or_refused(&mut SimHarness::new(2, lending));
    }

    #[test]
    fn every_check_holds_across_seeds() {
        use microrep_fabric::conformance as c;
        for seed in 0..64 {
            c::fifo_order(&mut SimHarness::new(seed, config()));
            c::read_your_write(&mut SimHarness::new(seed, config()));
            c::revoke_then_regrant(&mut SimHarness::new(seed, config()));
            c::revoke_races_writes(&mut SimHarness::new(seed, config()), 200);
            c::peer_crash_gives_errors(&mut SimHarness::new(seed, config()));
            c::words_and_local_access(&mut SimHarness::new(seed, config()));
        }
    }
}

mod tcp {
    fn harness(name: &str) -> microrep_fabric::tcp::TcpHarness {
        microrep_fabric::tcp::TcpHarness::new(name)
    }
    microrep_fabric::conformance_tests!(harness);
}

/// On an RDMA device (a NIC, or soft-RoCE: see docs/VERBS.md); skipped with a printed reason
/// where there is none, unless MICROREP_REQUIRE_RDMA=1 (set by scripts/verbs-test.sh).
#[cfg(feature = "verbs")]
mod verbs {
    use microrep_fabric::verbs::{VerbsHarness, skip_reason};

    fn harness(_name: &str) -> VerbsHarness {
        VerbsHarness::new()
    }
    microrep_fabric::conformance_tests!(harness, skip_if: skip_reason);
}
