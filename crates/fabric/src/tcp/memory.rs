//! A node's registered regions and their write permissions, shared by the node's NIC thread
//! (which applies peers' WRITEs and serves their READs) and the local process.
//!
//! # Memory model
//!
//! Region bytes are stored as `AtomicU64` words, so the NIC thread and local threads never race
//! on plain memory. A byte `b` at offset `o` is byte `o % 8` of the little-endian value of word
//! `o / 8`. Copies go word by word:
//!
//! * a whole aligned word is one `store(Release)` / `load(Acquire)`, so an aligned 8-byte word is
//!   never torn, while a multi-word copy may be observed partly applied (like an RDMA NIC's);
//! * a partly covered word (the unaligned head or tail of a copy) is merged with a
//!   compare-and-swap loop, which keeps the bytes of the word outside the copy intact even when
//!   another thread writes them at the same time.
//!
//! Because every store is a release and every load an acquire, a reader that observes any word of
//! a write also observes every write the same thread (the NIC thread applies one endpoint's
//! writes in order) completed before it. On x86-64 both are plain `mov`s.
//!
//! # Permissions
//!
//! The grant table is behind an `RwLock`. The NIC checks a [`RemoteWrite::Granted`] region's grant
//! and copies the write *while holding the read lock*; [`Memory::revoke`] changes the table under
//! the write lock. So a revocation waits for the one write being applied, if any, and every write
//! applied after the revocation released the lock sees the grant gone: when `revoke` returns, no
//! write of the peer lands any more (the check a NIC makes at the target, Mu §5.2).
//!
//! A revocation also ends the peer's connections for that region. Unlike an RDMA NIC's, a
//! connection can hold requests for as long as this node does not read them (a stopped
//! process): a write sent in a term the peer lost, read after a later grant to the same peer,
//! would land in the new term. So each inbound connection remembers how many revocations of its
//! peer it has seen when it was opened, and a write on a connection older than the last
//! revocation is refused even under a new grant. The refusal makes the peer reset the
//! connection; a Reset after a refusal was sent after the revocation, so the connection then
//! takes the current count and may write again.

use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::layout;
use crate::{FabricError, NodeId, OpError, RegionId, RegionSpec, RemoteWrite};

/// A node's regions, word-addressed, and who may write the granted ones.
#[derive(Debug)]
pub(super) struct Memory {
    node: NodeId,
    max_nodes: u16,
    specs: Vec<RegionSpec>,
    words: Vec<Box<[AtomicU64]>>,
    /// `grants[region index][peer]`: whether `peer` may write that (granted) region.
    grants: RwLock<Vec<Vec<Grant>>>,
}

/// One peer's permission on one granted region.
#[derive(Clone, Copy, Debug, Default)]
struct Grant {
    granted: bool,
    /// Revocations so far: connections opened before the last one may not write.
    revocations: u64,
}

impl Memory {
    /// Zeroed regions for `specs` (already validated).
    pub(super) fn new(node: NodeId, max_nodes: u16, specs: &[RegionSpec]) -> Self {
        let words = specs.iter().map(|s| (0..s.len_bytes / 8).map(|_| AtomicU64::new(0)).collect()).collect();
        let grants = RwLock::new(vec![vec![Grant::default(); usize::from(max_nodes)]; specs.len()]);
        Self { node, max_nodes, specs: specs.to_vec(), words, grants }
    }

    /// The registered region specs, in registration order.
    pub(super) fn specs(&self) -> &[RegionSpec] {
        &self.specs
    }

    /// The index of `region` after checking that `len` bytes at `offset` fit inside it.
    pub(super) fn locate(&self, region: RegionId, offset: u64, len: u64) -> Result<usize, FabricError> {
        let (index, spec) = layout::find_spec(self.node, &self.specs, region)?;
        layout::check_bounds(self.node, region, spec.len_bytes, offset, len)?;
        Ok(index)
    }

    /// The word at an aligned `offset` of `region`.
    pub(super) fn word(&self, region: RegionId, offset: u64) -> Result<&AtomicU64, FabricError> {
        let (index, spec) = layout::find_spec(self.node, &self.specs, region)?;
        layout::check_word(self.node, region, spec.len_bytes, offset)?;
        Ok(&self.words[index][(offset / 8) as usize])
    }

    /// Copies `region[offset..offset + buf.len()]` into `buf` (see the module's memory model).
    pub(super) fn read(&self, index: usize, offset: u64, buf: &mut [u8]) {
        let words = &self.words[index];
        let mut at = offset as usize;
        let mut done = 0;
        while done < buf.len() {
            let in_word = at % 8;
            let take = (8 - in_word).min(buf.len() - done);
            let bytes = words[at / 8].load(Ordering::Acquire).to_le_bytes();
            buf[done..done + take].copy_from_slice(&bytes[in_word..in_word + take]);
            done += take;
            at += take;
        }
    }

    /// Copies `data` into `region[offset..]` (see the module's memory model).
    pub(super) fn write(&self, index: usize, offset: u64, data: &[u8]) {
        let words = &self.words[index];
        let mut at = offset as usize;
        let mut done = 0;
        while done < data.len() {
            let in_word = at % 8;
            let take = (8 - in_word).min(data.len() - done);
            let word = &words[at / 8];
            let part = &data[done..done + take];
            if take == 8 {
                word.store(u64::from_le_bytes(part.try_into().expect("8 bytes")), Ordering::Release);
            } else {
                let mut merged = [0u8; 8];
                merged[in_word..in_word + take].copy_from_slice(part);
                let value = u64::from_le_bytes(merged);
                let mask = (u64::MAX >> (64 - 8 * take as u32)) << (8 * in_word as u32);
                // The closure never returns None, so the update always succeeds.
                let _ = word.fetch_update(Ordering::Release, Ordering::Relaxed, |old| Some((old & !mask) | value));
            }
            done += take;
            at += take;
        }
    }

    /// Applies a remote WRITE of `writer` if its permission allows, holding the permission state
    /// while copying (see the module docs: this is what makes `revoke` exact).
    /// `opened` is what [`Memory::revocations`] said when the writer's connection was opened.
    pub(super) fn apply_remote_write(
        &self,
        writer: NodeId,
        opened: &[u64],
        index: usize,
        offset: u64,
        data: &[u8],
    ) -> Result<(), OpError> {
        match self.specs[index].remote_write {
            RemoteWrite::Never => Err(OpError::PermissionDenied),
            RemoteWrite::Always => {
                self.write(index, offset, data);
                Ok(())
            }
            RemoteWrite::Granted => {
                let grants = self.grants.read().unwrap_or_else(std::sync::PoisonError::into_inner);
                let grant = grants[index].get(usize::from(writer.0)).copied().unwrap_or_default();
                if !grant.granted || opened.get(index) != Some(&grant.revocations) {
                    return Err(OpError::PermissionDenied);
                }
                self.write(index, offset, data);
                drop(grants);
                Ok(())
            }
        }
    }

    fn grant_slot(&self, region: RegionId, peer: NodeId) -> Result<usize, FabricError> {
        layout::check_peer(self.node, peer, self.max_nodes)?;
        let (index, spec) = layout::find_spec(self.node, &self.specs, region)?;
        if spec.remote_write != RemoteWrite::Granted {
            return Err(FabricError::NotGrantable { region });
        }
        Ok(index)
    }

    /// Lets `peer` write `region` (through connections opened since its last revocation).
    pub(super) fn grant(&self, region: RegionId, peer: NodeId) -> Result<(), FabricError> {
        let index = self.grant_slot(region, peer)?;
        self.grants.write().unwrap_or_else(std::sync::PoisonError::into_inner)[index][usize::from(peer.0)].granted =
            true;
        Ok(())
    }

    /// Takes write access to `region` away from `peer`. Taking the write lock waits for a write
    /// of the peer that is being applied; once it is released, none can start, and none of the
    /// peer's connections open now may ever write the region again.
    pub(super) fn revoke(&self, region: RegionId, peer: NodeId) -> Result<(), FabricError> {
        let index = self.grant_slot(region, peer)?;
        let mut grants = self.grants.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        let grant = &mut grants[index][usize::from(peer.0)];
        grant.granted = false;
        grant.revocations += 1;
        Ok(())
    }

    /// `peer`'s revocations so far, per region: a connection remembers them when it opens.
    pub(super) fn revocations(&self, peer: NodeId) -> Vec<u64> {
        let grants = self.grants.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        grants.iter().map(|g| g.get(usize::from(peer.0)).map_or(0, |g| g.revocations)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory() -> Memory {
        let specs = [
            RegionSpec::new(RegionId(0), 64, RemoteWrite::Granted),
            RegionSpec::new(RegionId(1), 64, RemoteWrite::Always),
            RegionSpec::new(RegionId(2), 64, RemoteWrite::Never),
        ];
        Memory::new(NodeId(0), 3, &specs)
    }

    #[test]
    fn unaligned_copies_keep_neighbouring_bytes() {
        let m = memory();
        m.write(1, 0, &[0xAA; 64]);
        m.write(1, 3, b"hello, world");
        let mut all = [0u8; 64];
        m.read(1, 0, &mut all);
        assert_eq!(&all[..3], &[0xAA; 3]);
        assert_eq!(&all[3..15], b"hello, world");
        assert!(all[15..].iter().all(|&b| b == 0xAA));
        let mut middle = [0u8; 5];
        m.read(1, 10, &mut middle);
        assert_eq!(&middle, b"world");
    }

    #[test]
    fn words_are_little_endian_bytes() {
        let m = memory();
        m.word(RegionId(1), 8).expect("word").store(0x0102_0304_0506_0708, Ordering::Release);
        let mut bytes = [0u8; 8];
        m.read(1, 8, &mut bytes);
        assert_eq!(bytes, 0x0102_0304_0506_0708u64.to_le_bytes());
        assert!(matches!(m.word(RegionId(1), 4), Err(FabricError::Misaligned { .. })));
    }

    #[test]
    fn remote_writes_follow_the_policy_and_grants() {
        let m = memory();
        let opened = m.revocations(NodeId(1));
        assert_eq!(m.apply_remote_write(NodeId(1), &opened, 0, 0, b"x"), Err(OpError::PermissionDenied));
        assert_eq!(m.apply_remote_write(NodeId(1), &opened, 2, 0, b"x"), Err(OpError::PermissionDenied));
        assert_eq!(m.apply_remote_write(NodeId(1), &opened, 1, 0, b"x"), Ok(()));
        m.grant(RegionId(0), NodeId(1)).expect("grant");
        assert_eq!(m.apply_remote_write(NodeId(1), &opened, 0, 0, b"y"), Ok(()));
        let other = m.revocations(NodeId(2));
        assert_eq!(m.apply_remote_write(NodeId(2), &other, 0, 0, b"z"), Err(OpError::PermissionDenied), "per peer");
        m.revoke(RegionId(0), NodeId(1)).expect("revoke");
        assert_eq!(m.apply_remote_write(NodeId(1), &opened, 0, 0, b"w"), Err(OpError::PermissionDenied));
        let mut b = [0u8; 1];
        m.read(0, 0, &mut b);
        assert_eq!(&b, b"y");
        assert!(matches!(m.grant(RegionId(1), NodeId(1)), Err(FabricError::NotGrantable { .. })));
        assert!(matches!(m.grant(RegionId(0), NodeId(0)), Err(FabricError::InvalidPeer { .. })));
    }

    #[test]
    fn a_connection_older_than_a_revocation_never_writes_again() {
        let m = memory();
        let old = m.revocations(NodeId(1));
        m.grant(RegionId(0), NodeId(1)).expect("grant");
        m.revoke(RegionId(0), NodeId(1)).expect("revoke");
        m.grant(RegionId(0), NodeId(1)).expect("grant again");
        assert_eq!(
            m.apply_remote_write(NodeId(1), &old, 0, 0, b"stale"),
            Err(OpError::PermissionDenied),
            "a write held in a connection across the revocation must not land in the new term"
        );
        let new = m.revocations(NodeId(1));
        assert_eq!(m.apply_remote_write(NodeId(1), &new, 0, 0, b"fresh"), Ok(()));
        assert_eq!(m.apply_remote_write(NodeId(1), &old, 1, 0, b"open"), Ok(()), "open regions ignore revocations");
    }

    #[test]
    fn concurrent_writers_never_tear_an_aligned_word() {
        let m = memory();
        std::thread::scope(|s| {
            for seed in [0x1111_1111_1111_1111u64, 0x2222_2222_2222_2222] {
                let m = &m;
                s.spawn(move || {
                    for i in 0..2000u64 {
                        let v = seed.wrapping_mul(i % 7 + 1);
                        m.write(1, 0, &[v.to_le_bytes(), v.to_le_bytes()].concat());
                    }
                });
            }
            for _ in 0..2000 {
                let mut word = [0u8; 8];
                m.read(1, 8, &mut word);
                let v = u64::from_le_bytes(word);
                assert!(v == 0 || v % 0x1111_1111_1111_1111 == 0, "torn word {v:#x}");
            }
        });
    }
}
