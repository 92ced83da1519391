//! State transfer to a joiner (Derecho §3.4, simplified): the members that install a view with
//! a new member write, with one-sided WRITEs into the joiner's **state region**, the new view's
//! description and, per subgroup the joiner enters, the application's state of that subgroup
//! at the view boundary (everything delivered there in earlier views).
//!
//! ```text
//! state region (RegionId 1, every peer may always write it; fresh at the joiner's start):
//!   view section:           guard u64, len u64, checksum u64, the view (words, below), up to view_bytes_max
//!   per subgroup j:         guard u64, len u64, checksum u64, the application's state, up to state_bytes_max
//!   mailbox u64, answer u64 (a joiner's own request and its refusal: `ask.rs`)
//! ```
//!
//! A section's writer posts `len`, the checksum and the bytes first and the guard (`epoch + 1`
//! of the new view) after them on the same FIFO endpoint, so a joiner that reads the guard
//! (acquire) finds the section complete: the SST's guard rule.
//!
//! **Who writes a section.** Each section has a **writer order**: for the view, the kept old
//! members of the new view in rank order (its leader first); for a subgroup, the subgroup's
//! kept old members in rank order (its **holders**), or, when it has none, the view's kept old
//! members (nothing of the subgroup survives: they write an empty state). Every member in an
//! order prepares its bytes at the install (a subgroup's snapshot then is its state at the view
//! boundary, whatever it delivers later) and holds them; the first writes at once, and each
//! other one writes once it suspects, in the new view, every member before it in the order
//! (`Transfer::take_over`). So the joiner gets its state while any member that holds it runs: a
//! writer that failed before writing does not leave the joiner, and the new view that counts
//! it, stuck (simulator seed 655: a group of two, a join, and the writer's crash). Only a holder
//! writes a held state: a member writing an empty one in place of a holder it falsely suspects
//! (a partition) would hand the joiner a wrong state. So if every holder of a subgroup fails
//! after the install and before writing, the joiner never starts, as before (MULTICAST.md,
//! "Not built yet").
//!
//! Two writers may then write one section at once (one falsely suspected, or one whose WRITEs
//! were still in flight), and their bytes may differ: a subgroup that delivers at receipt has
//! no agreed history, and an application's snapshot need not be byte-identical across members.
//! The **checksum** (CRC32C of the epoch, the length and the bytes) makes a joiner take a
//! section only when it reads one writer's whole version; a mixture stays unreadable and the
//! joiner never starts (the next change removes it if a majority of the view runs).
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

/// Bytes of a section's header (guard, len, checksum).
const SECTION_HEADER_BYTES: u64 = 24;

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

    /// The region spec: the sections, then the join mailbox and answer words (`ask.rs`).
    pub(crate) fn region(&self) -> RegionSpec {
        RegionSpec::new(STATE_REGION, self.answer_at() + 8, RemoteWrite::Always)
    }

    /// Where a joiner leaves its request at a member (`ask.rs`).
    pub(crate) fn mailbox_at(&self) -> u64 {
        self.section_at(1 + self.subgroups)
    }

    /// Where a member tells a joiner why it refused it (`ask.rs`).
    pub(crate) fn answer_at(&self) -> u64 {
        self.mailbox_at() + 8
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

    /// The WRITEs of one section: `len`, the checksum and the bytes, then the guard.
    pub(crate) fn section(&self, index: usize, epoch: u64, bytes: &[u8]) -> Vec<(u64, Vec<u8>)> {
        let at = self.section_at(index);
        debug_assert!(bytes.len() as u64 <= self.max_of(index), "section {index} over its bound");
        let mut writes = Vec::new();
        let mut first = (bytes.len() as u64).to_le_bytes().to_vec();
        first.extend_from_slice(&checksum(epoch, bytes).to_le_bytes());
        let split = bytes.len().min(CHUNK_BYTES - 16);
        first.extend_from_slice(&bytes[..split]);
        writes.push((at + 8, first));
        for (i, chunk) in bytes[split..].chunks(CHUNK_BYTES).enumerate() {
            writes.push((at + SECTION_HEADER_BYTES + (split + i * CHUNK_BYTES) as u64, chunk.to_vec()));
        }
        writes.push((at, (epoch + 1).to_le_bytes().to_vec()));
        writes
    }

    /// The section `index` if one writer's whole version of it has arrived, and the epoch its
    /// guard names. A length over the bound or a checksum that does not match is a version
    /// still landing or a mixture of two writers' (module docs): not arrived.
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
            return Ok(None);
        }
        let sum = fabric.load_u64(STATE_REGION, at + 16)?;
        let mut bytes = vec![0; len as usize];
        fabric.read_local(STATE_REGION, at + SECTION_HEADER_BYTES, &mut bytes)?;
        Ok((sum == checksum(guard - 1, &bytes)).then_some((guard - 1, bytes)))
    }

    /// Whether a state of `len` bytes fits.
    pub(crate) fn check_state(&self, subgroup: usize, len: usize) -> Result<(), MulticastError> {
        if len as u64 > self.state_bytes_max {
            return Err(MulticastError::StateTooLarge { subgroup, len, max: self.state_bytes_max });
        }
        Ok(())
    }
}

/// One section a member may write: its WRITEs, and the members before this one in the
/// section's writer order (module docs), all of which it must suspect before it writes.
#[derive(Debug)]
pub(crate) struct Section {
    after: Vec<NodeId>,
    writes: Vec<(u64, Vec<u8>)>,
    /// Whether this member writes it (every member before it is suspected, or none is).
    open: bool,
    /// Writes posted since the last (re)connect.
    posted: usize,
}

impl Section {
    pub(crate) fn new(after: Vec<NodeId>, writes: Vec<(u64, Vec<u8>)>) -> Self {
        Self { open: after.is_empty(), after, writes, posted: 0 }
    }
}

/// The sections one member owes a joiner, posted on its link and posted again after a
/// reconnect of that link (a failed WRITE and every one behind it did not land).
#[derive(Debug)]
pub(crate) struct Transfer {
    pub(crate) joiner: NodeId,
    /// The view the joiner joins.
    pub(crate) epoch: u64,
    sections: Vec<Section>,
}

impl Transfer {
    pub(crate) fn new(joiner: NodeId, epoch: u64, sections: Vec<Section>) -> Self {
        Self { joiner, epoch, sections }
    }

    /// Opens the sections every earlier writer of which is in `suspected` (this member's
    /// suspicions in the joiner's view); returns how many it opened.
    pub(crate) fn take_over(&mut self, suspected: &[NodeId]) -> u64 {
        let mut opened = 0;
        for section in self.sections.iter_mut().filter(|s| !s.open) {
            if section.after.iter().all(|m| suspected.contains(m)) {
                section.open = true;
                opened += 1;
            }
        }
        opened
    }

    /// Posts what is not posted yet of the open sections on `link` (the joiner's); returns
    /// whether it posted any.
    pub(crate) fn push<E: microrep_fabric::Endpoint>(
        &mut self,
        link: &mut Link<E>,
        stats: &mut Stats,
    ) -> Result<bool, MulticastError> {
        let mut work = false;
        for section in self.sections.iter_mut().filter(|s| s.open) {
            while let Some((at, bytes)) = section.writes.get(section.posted) {
                if link.broken || !post(link, RemoteAddr::new(STATE_REGION, *at), bytes, stats)? {
                    return Ok(work);
                }
                section.posted += 1;
                work = true;
            }
        }
        Ok(work)
    }

    /// The link was reconnected: post everything again.
    pub(crate) fn rewind(&mut self) {
        for section in &mut self.sections {
            section.posted = 0;
        }
    }
}

/// A section's checksum: CRC32C of the epoch, the length and the bytes.
fn checksum(epoch: u64, bytes: &[u8]) -> u64 {
    let head = microrep_fabric::checksum::crc32c_append(
        microrep_fabric::checksum::crc32c(&epoch.to_le_bytes()),
        &(bytes.len() as u64).to_le_bytes(),
    );
    u64::from(microrep_fabric::checksum::crc32c_append(head, bytes))
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
    if !bytes.len().is_multiple_of(8) {
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
                    copy_at_receipt_bytes: crate::multicast::COPY_AT_RECEIPT_BYTES,
                },
                SubgroupConfig {
                    members: vec![],
                    senders: vec![],
                    window: 2,
                    max_payload_bytes: 16,
                    delivery: Delivery::Ordered,
                    copy_at_receipt_bytes: crate::multicast::COPY_AT_RECEIPT_BYTES,
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
    fn a_successor_writes_a_section_once_it_suspects_every_writer_before_it() {
        let state = StateLayout::new(&template()).expect("detection");
        let sections = vec![
            Section::new(vec![], state.section(0, 3, &[1; 8])),
            Section::new(vec![NodeId(0), NodeId(1)], state.section(1, 3, &[2; 8])),
        ];
        let mut transfer = Transfer::new(NodeId(5), 3, sections);
        assert_eq!(transfer.take_over(&[NodeId(1)]), 0, "writer 0 is not suspected");
        assert_eq!(transfer.take_over(&[NodeId(1), NodeId(0)]), 1);
        assert_eq!(transfer.take_over(&[NodeId(1), NodeId(0)]), 0, "opened once");
    }

    #[test]
    fn a_mixture_of_two_writers_versions_fails_the_checksum() {
        let (a, b) = ([1u8; 16], [2u8; 16]);
        let mixed = [&a[..8], &b[8..]].concat();
        assert_ne!(checksum(3, &mixed), checksum(3, &a));
        assert_ne!(checksum(3, &mixed), checksum(3, &b));
        assert_ne!(checksum(3, &a), checksum(4, &a), "a version of another view");
        assert_ne!(checksum(3, &[]), checksum(3, &[0; 8]), "the length counts");
    }

    #[test]
    fn sections_put_the_guard_last_and_fit_the_region() {
        let state = StateLayout::new(&template()).expect("detection");
        let region = state.region();
        let writes = state.section(2, 3, &[7; 64]);
        assert_eq!(writes.last().map(|(_, b)| b.clone()), Some(4u64.to_le_bytes().to_vec()), "the guard: epoch + 1");
        let end = writes.iter().map(|(at, b)| at + b.len() as u64).max().expect("writes");
        assert_eq!(end + 16, region.len_bytes, "the last subgroup's section, then the mailbox and answer words");
        assert!(state.check_state(1, 65).is_err());
    }
}
