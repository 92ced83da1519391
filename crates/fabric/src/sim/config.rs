//! [`SimConfig`]: latencies and fault probabilities of the simulated fabric.

/// Timing and fault injection of a [`super::SimWorld`]. All times are simulated nanoseconds.
///
/// Every random choice is drawn from the world's seeded generator, so a configuration plus a seed
/// plus a sequence of calls fully determines a run.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// Smallest one-way latency of an operation (post to target, and target to completion).
    pub latency_min_ns: u64,
    /// Largest one-way latency; each leg draws uniformly from `latency_min_ns..=latency_max_ns`.
    pub latency_max_ns: u64,
    /// Probability that a leg (forward or completion) gets an extra delay.
    pub delay_prob: f64,
    /// Largest extra delay, drawn uniformly from `0..=delay_max_ns`.
    pub delay_max_ns: u64,
    /// Probability that an operation fails with [`crate::OpError::Transport`] when it reaches the
    /// target, without taking effect; the endpoint goes to [`crate::EndpointState::Error`].
    pub fail_prob: f64,
    /// Probability that a WRITE of at least 2 bytes is torn: applied in 2..=4 contiguous pieces,
    /// in random order, each at a different simulated time.
    pub torn_write_prob: f64,
    /// How long an operation to a crashed peer retries before it completes with
    /// [`crate::OpError::PeerUnreachable`], counted from its post or from the crash, whichever is
    /// later.
    pub peer_timeout_ns: u64,
    /// Probability that a node is descheduled just before one of its local accesses
    /// (`read_local`, `load_u64`): simulated time moves on by up to `preempt_max_ns` and the
    /// events due meanwhile happen first, so peers' writes can land between two reads of one
    /// poll, as they do in a real process that the OS deschedules. 0 draws nothing, so runs
    /// replay as they did before this existed.
    pub preempt_prob: f64,
    /// Longest such descheduling, drawn uniformly from `0..=preempt_max_ns`.
    pub preempt_max_ns: u64,
    /// Probability that an operation is instant: no latency either way, so that it takes
    /// effect and completes within its post call, as a WRITE on shm does (and one on soft-RoCE,
    /// whose post runs the whole exchange). A torn write is still applied in pieces over time.
    /// 0 draws nothing, so runs replay as they did before this existed.
    pub instant_prob: f64,
    /// Endpoints lend their peer's memory ([`crate::Fabric::lends_peer_memory`]), as shm's
    /// do: a read of it is a copy of the peer's memory at the call, and a crashed peer's memory
    /// stays readable, as it was at the crash, by endpoints connected to that incarnation (the
    /// mapping of a dead process's segment). Off: lending fails as on verbs and tcp.
    pub lend_peer_memory: bool,
}

impl SimConfig {
    /// A fabric without faults: every operation takes exactly 1 µs each way.
    pub fn reliable() -> Self {
        Self {
            latency_min_ns: 1_000,
            latency_max_ns: 1_000,
            delay_prob: 0.0,
            delay_max_ns: 0,
            fail_prob: 0.0,
            torn_write_prob: 0.0,
            peer_timeout_ns: 1_000_000,
            preempt_prob: 0.0,
            preempt_max_ns: 0,
            instant_prob: 0.0,
            lend_peer_memory: false,
        }
    }

    /// A hostile but still usable fabric: jittery latencies, occasional long delays (up to
    /// 200 µs), rare transport failures, and many torn writes.
    pub fn faulty() -> Self {
        Self {
            latency_min_ns: 500,
            latency_max_ns: 5_000,
            delay_prob: 0.05,
            delay_max_ns: 200_000,
            fail_prob: 0.01,
            torn_write_prob: 0.3,
            peer_timeout_ns: 1_000_000,
            preempt_prob: 0.0,
            preempt_max_ns: 0,
            instant_prob: 0.0,
            lend_peer_memory: false,
        }
    }

    /// Checks that probabilities lie in `[0, 1]` and that `latency_min_ns <= latency_max_ns`.
    pub fn validate(&self) -> Result<(), SimConfigError> {
        let probs = [
            ("delay_prob", self.delay_prob),
            ("fail_prob", self.fail_prob),
            ("torn_write_prob", self.torn_write_prob),
            ("preempt_prob", self.preempt_prob),
            ("instant_prob", self.instant_prob),
        ];
        for (name, p) in probs {
            // `contains` is false for NaN too.
            if !(0.0..=1.0).contains(&p) {
                return Err(SimConfigError::NotAProbability { name, value: p });
            }
        }
        if self.latency_min_ns > self.latency_max_ns {
            return Err(SimConfigError::LatencyInverted { min_ns: self.latency_min_ns, max_ns: self.latency_max_ns });
        }
        Ok(())
    }
}

/// What is wrong with a [`SimConfig`].
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum SimConfigError {
    /// A probability outside `[0, 1]` (or NaN).
    #[error("{name} is {value}; it must be a probability in [0, 1]")]
    NotAProbability {
        /// The field.
        name: &'static str,
        /// Its value.
        value: f64,
    },
    /// The latency bounds are the wrong way round.
    #[error("latency_min_ns ({min_ns}) is larger than latency_max_ns ({max_ns})")]
    LatencyInverted {
        /// `latency_min_ns`.
        min_ns: u64,
        /// `latency_max_ns`.
        max_ns: u64,
    },
}

impl Default for SimConfig {
    /// [`SimConfig::reliable`].
    fn default() -> Self {
        Self::reliable()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid() {
        assert_eq!(SimConfig::reliable().validate(), Ok(()));
        assert_eq!(SimConfig::faulty().validate(), Ok(()));
    }

    #[test]
    fn rejects_bad_probabilities_and_latencies() {
        let bad = SimConfig { fail_prob: 1.5, ..SimConfig::reliable() };
        assert_eq!(bad.validate(), Err(SimConfigError::NotAProbability { name: "fail_prob", value: 1.5 }));
        let nan = SimConfig { torn_write_prob: f64::NAN, ..SimConfig::reliable() };
        assert!(matches!(nan.validate(), Err(SimConfigError::NotAProbability { name: "torn_write_prob", .. })));
        let neg = SimConfig { delay_prob: -0.1, ..SimConfig::reliable() };
        assert!(neg.validate().is_err_and(|e| e.to_string().contains("delay_prob is -0.1")));
        let inverted = SimConfig { latency_min_ns: 10, latency_max_ns: 9, ..SimConfig::reliable() };
        assert_eq!(inverted.validate(), Err(SimConfigError::LatencyInverted { min_ns: 10, max_ns: 9 }));
    }
}
