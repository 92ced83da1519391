//! State transfer to a joiner (Derecho §3.4, simplified): the members that install a view with
//! a new member write, with one-sided WRITEs into the joiner's **state region**, the new view's
//! description and, per subgroup the joiner enters, the application's state of that subgroup
//! at the view boundary (everything delivered there in earlier views).
//!
//! ```text
//! state region (RegionId 1, every peer may always write it; fresh at the joiner's start):
//!   view section:           guard u64, len u64, the view (words, below), up to view_bytes_max
//!   per subgroup j:         guard u64, len u64, the application's state, up to state_bytes_max
//! ```
//!
//! A section's writer posts `len` and the bytes first and the guard (`epoch + 1` of the new
//! view) after them on the same FIFO endpoint, so a joiner that reads the guard (acquire) finds
//! the section complete: the SST's guard rule. The view is written by the new view's leader
//! (its live old member of lowest rank); a subgroup's state by the subgroup's live old member of
//! lowest rank, or by the leader, as an empty state, when the subgroup has none.
//!
//! The view's words: epoch, member count, member ids, then per subgroup its member count and
//! ids and its sender count and ids. Ring geometry and failure detection come from the
//! joiner's own configuration (the group's template), which must match the group's.

use microrep_fabric::{NodeId, RegionId, RegionSpec, RemoteAddr, RemoteWrite};

use super::api::{MulticastError, Stats};
use super::config::GroupConfig;
use super::member::{Link, post};

/// The region a joiner's state arrives in.
pub const STATE_REGION: RegionId = RegionId(1);

/// Bytes of a section's header (guard, len).
const SECTION_HEADER_BYTES: u64 = 16;

/// Largest WRITE of a section's bytes (a large state goes as several).
const CHUNK_BYTES: usize = 1 << 16;

/// Where the sections lie in the state region of a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StateLayout {
    view_bytes_max: u64,
    state_bytes_max: u64,
    subgroups: usize,
}

impl StateLayout {
    /// The state layout of a group with failure detection; `None` without (no views, no joins).
    pub(crate) fn new(config: &GroupConfig) -> Option<Self> {
        let detection = config.failure_detection?;
        let max = detection.max_members.max(config.members.len()) as u64;
        let view_bytes_max = 8 * (2 + max + config.subgroups.len() as u64 * (2 + 2 * max));
        Some(Self { view_bytes_max, state_bytes_max: detection.state_bytes_max, subgroups: config.subgroups.len() })
    }

    /// The region spec.
    pub(crate) fn region(&self) -> RegionSpec {
        let len = self.section_at(1 + self.subgroups);
        RegionSpec::new(STATE_REGION, len, RemoteWrite::Always)
    }

    /// Offset of section `index`: 0 the view, `1 + j` subgroup `j`'s state; `index` one past the
    /// last is the region's length.
    fn section_at(&self, index: usize) -> u64 {
        if index == 0 {
            return 0;
        }
        SECTION_HEADER_BYTES + self.view_bytes_max + (index as u64 - 1) * (SECTION_HEADER_BYTES + self.state_bytes_max)
    }

    fn max_of(&self, index: usize) -> u64 {
        if index == 0 { self.view_bytes_max } else { self.state_bytes_max }
    }

    /// The WRITEs of one section: `len` and the bytes, then the guard.
    pub(crate) fn section(&self, index: usize, epoch: u64, bytes: &[u8]) -> Vec<(u64, Vec<u8>)> {
        let at = self.section_at(index);
        debug_assert!(bytes.len() as u64 <= self.max_of(index), "section {index} over its bound");
        let mut writes = Vec::new();
        let mut first = (bytes.len() as u64).to_le_bytes().to_vec();
        let split = bytes.len().min(CHUNK_BYTES - 8);
        first.extend_from_slice(&bytes[..split]);
        writes.push((at + 8, first));
        for (i, chunk) in bytes[split..].chunks(CHUNK_BYTES).enumerate() {
            writes.push((at + SECTION_HEADER_BYTES + (split + i * CHUNK_BYTES) as u64, chunk.to_vec()));
        }
        writes.push((at, (epoch + 1).to_le_bytes().to_vec()));
        writes
    }

    /// The section `index` if it has arrived, and the epoch its guard names.
    pub(crate) fn read<F: microrep_fabric::Fabric>(
        &self,
        fabric: &F,
        index: usize,
    ) -> Result<Option<(u64, Vec<u8>)>, MulticastError> {
        let at = self.section_at(index);
        let guard = fabric.load_u64(STATE_REGION, at)?;
        if guard == 0 {
            return Ok(None);
        }
        let len = fabric.load_u64(STATE_REGION, at + 8)?;
        if len > self.max_of(index) {
            return Err(MulticastError::Transfer(format!("section {index} claims {len} bytes")));
        }
        let mut bytes = vec![0; len as usize];
        fabric.read_local(STATE_REGION, at + SECTION_HEADER_BYTES, &mut bytes)?;
        Ok(Some((guard - 1, bytes)))
    }

    /// Whether a state of `len` bytes fits.
    pub(crate) fn check_state(&self, subgroup: usize, len: usize) -> Result<(), MulticastError> {
        if len as u64 > self.state_bytes_max {
            return Err(MulticastError::StateTooLarge { subgroup, len, max: self.state_bytes_max });
        }
        Ok(())
    }
}

/// The sections one member owes a joiner, posted on its link and posted again after a
/// reconnect of that link (a failed WRITE and every one behind it did not land).
#[derive(Debug)]
pub(crate) struct Transfer {
    pub(crate) joiner: NodeId,
    /// The view the joiner joins.
    pub(crate) epoch: u64,
    writes: Vec<(u64, Vec<u8>)>,
    /// Writes posted since the last (re)connect.
    posted: usize,
}

impl Transfer {
    pub(crate) fn new(joiner: NodeId, epoch: u64, writes: Vec<(u64, Vec<u8>)>) -> Self {
        Self { joiner, epoch, writes, posted: 0 }
    }

    /// Posts what is not posted yet on `link` (the joiner's); returns whether it posted any.
    pub(crate) fn push<E: microrep_fabric::Endpoint>(
        &mut self,
        link: &mut Link<E>,
        stats: &mut Stats,
    ) -> Result<bool, MulticastError> {
        let before = self.posted;
        while let Some((at, bytes)) = self.writes.get(self.posted) {
            if link.broken || !post(link, RemoteAddr::new(STATE_REGION, *at), bytes, stats)? {
                break;
            }
            self.posted += 1;
        }
        Ok(self.posted > before)
    }

    /// The link was reconnected: post everything again.
    pub(crate) fn rewind(&mut self) {
        self.posted = 0;
    }
}

/// The words describing view `epoch` of `config`.
pub(crate) fn encode_view(epoch: u64, config: &GroupConfig) -> Vec<u8> {
    let mut words = vec![epoch, config.members.len() as u64];
    words.extend(config.members.iter().map(|n| u64::from(n.0)));
    for sub in &config.subgroups {
        for list in [&sub.members, &sub.senders] {
            words.push(list.len() as u64);
            words.extend(list.iter().map(|n| u64::from(n.0)));
        }
    }
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// Decodes a view written by [`encode_view`] into the joiner's configuration (`template`
/// gives `me`, ring geometry and failure detection); checks it like any configuration.
pub(crate) fn decode_view(bytes: &[u8], template: &GroupConfig) -> Result<(u64, GroupConfig), MulticastError> {
    let bad = |what: &str| MulticastError::Transfer(format!("the view description {what}"));
    if bytes.len() % 8 != 0 {
        return Err(bad("is not whole words"));
    }
    let mut words = bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")));
    let mut next = || words.next().ok_or_else(|| bad("ends early"));
    let list = |next: &mut dyn FnMut() -> Result<u64, MulticastError>| -> Result<Vec<NodeId>, MulticastError> {
        let n = next()?;
        if n > 64 {
            return Err(bad("lists more than 64 nodes"));
        }
        (0..n)
            .map(|_| next().and_then(|w| u16::try_from(w).map(NodeId).map_err(|_| bad("names a node id over 65535"))))
            .collect()
    };
    let epoch = next()?;
    let members = list(&mut next)?;
    let mut subgroups = template.subgroups.clone();
    for sub in &mut subgroups {
        sub.members = list(&mut next)?;
        sub.senders = list(&mut next)?;
    }
    if next().is_ok() {
        return Err(bad("has trailing words"));
    }
    let config = GroupConfig { members, subgroups, ..template.clone() };
    config.validate_view()?;
    Ok((epoch, config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::multicast::config::{Delivery, FailureDetection, SubgroupConfig};

    fn template() -> GroupConfig {
        let ids = |v: &[u16]| v.iter().map(|&i| NodeId(i)).collect::<Vec<_>>();
        GroupConfig {
            subgroups: vec![
                SubgroupConfig {
                    members: ids(&[0, 1, 5]),
                    senders: ids(&[5, 0]),
                    window: 4,
                    max_payload_bytes: 8,
                    delivery: Delivery::Ordered,
                },
                SubgroupConfig {
                    members: vec![],
                    senders: vec![],
                    window: 2,
                    max_payload_bytes: 16,
                    delivery: Delivery::Ordered,
                },
            ],
            failure_detection: Some(FailureDetection::new(10, 100, 4, 64)),
            ..GroupConfig::single(NodeId(5), ids(&[0, 1, 5]), 1, 8)
        }
    }

    #[test]
    fn a_view_description_round_trips_and_garbage_is_refused() {
        let config = template();
        let bytes = encode_view(9, &config);
        assert_eq!(decode_view(&bytes, &config), Ok((9, config.clone())));
        assert!(matches!(decode_view(&bytes[..bytes.len() - 8], &config), Err(MulticastError::Transfer(_))));
        assert!(matches!(decode_view(&bytes[..5], &config), Err(MulticastError::Transfer(_))));
        let mut long = bytes.clone();
        long.extend_from_slice(&[0; 8]);
        assert!(matches!(decode_view(&long, &config), Err(MulticastError::Transfer(_))));
        let mut outsider = bytes;
        outsider[8 * 3..8 * 4].copy_from_slice(&77u64.to_le_bytes());
        assert!(
            matches!(decode_view(&outsider, &config), Err(MulticastError::Config(_))),
            "a subgroup member left out"
        );
    }

    #[test]
    fn sections_put_the_guard_last_and_fit_the_region() {
        let state = StateLayout::new(&template()).expect("detection");
        let region = state.region();
        let writes = state.section(2, 3, &[7; 64]);
        assert_eq!(writes.last().map(|(_, b)| b.clone()), Some(4u64.to_le_bytes().to_vec()), "the guard: epoch + 1");
        let end = writes.iter().map(|(at, b)| at + b.len() as u64).max().expect("writes");
        assert_eq!(end, region.len_bytes, "the last subgroup's section ends the region");
        assert!(state.check_state(1, 65).is_err());
    }
}
