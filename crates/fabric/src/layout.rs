//! Region layout checks shared by every backend, so they all reject bad input the same way.

use crate::{FabricError, NodeId, RegionId, RegionSpec};

/// Largest number of regions one node may register.
pub const MAX_REGIONS: usize = 16;

/// Largest cluster the fabric addresses (node ids `0..MAX_NODES`).
pub const MAX_NODES: u16 = 256;

/// Checks a node's region specs: at most [`MAX_REGIONS`], unique ids, lengths non-zero
/// multiples of 8.
pub fn validate_specs(specs: &[RegionSpec]) -> Result<(), FabricError> {
    if specs.len() > MAX_REGIONS {
        return Err(FabricError::InvalidLayout(format!(
            "{} regions given, at most {MAX_REGIONS} allowed",
            specs.len()
        )));
    }
    for (i, spec) in specs.iter().enumerate() {
        if spec.len_bytes == 0 || spec.len_bytes % 8 != 0 {
            return Err(FabricError::InvalidLayout(format!(
                "{} has length {} bytes; it must be a non-zero multiple of 8",
                spec.id, spec.len_bytes
            )));
        }
        if specs[..i].iter().any(|s| s.id == spec.id) {
            return Err(FabricError::InvalidLayout(format!("{} is registered twice", spec.id)));
        }
    }
    Ok(())
}

/// Checks a cluster size and a node id in it.
pub fn validate_membership(node: NodeId, max_nodes: u16) -> Result<(), FabricError> {
    if max_nodes == 0 || max_nodes > MAX_NODES {
        return Err(FabricError::InvalidLayout(format!("max_nodes is {max_nodes}; it must be in 1..={MAX_NODES}")));
    }
    if node.0 >= max_nodes {
        return Err(FabricError::InvalidLayout(format!("{node} is outside the cluster of {max_nodes} nodes")));
    }
    Ok(())
}

/// Finds `region` among `specs` or reports it unknown at `node`.
pub fn find_spec(node: NodeId, specs: &[RegionSpec], region: RegionId) -> Result<(usize, &RegionSpec), FabricError> {
    // Not `ok_or`: the error has drop glue, and building and dropping it on every successful
    // lookup cost about 5% of a commit on the replication hot path (perf).
    match specs.iter().enumerate().find(|(_, s)| s.id == region) {
        Some(found) => Ok(found),
        None => Err(FabricError::UnknownRegion { node, region }),
    }
}

/// Checks that `len` bytes at `offset` fit in a region of `region_len` bytes.
pub fn check_bounds(node: NodeId, region: RegionId, region_len: u64, offset: u64, len: u64) -> Result<(), FabricError> {
    match offset.checked_add(len) {
        Some(end) if end <= region_len => Ok(()),
        _ => Err(FabricError::OutOfBounds { node, region, offset, len, region_len }),
    }
}

/// Checks that an 8-byte word at `offset` is aligned and inside the region.
pub fn check_word(node: NodeId, region: RegionId, region_len: u64, offset: u64) -> Result<(), FabricError> {
    if !offset.is_multiple_of(8) {
        return Err(FabricError::Misaligned { region, offset });
    }
    check_bounds(node, region, region_len, offset, 8)
}

/// Checks that `peer` is a valid peer of `this` in a cluster of `max_nodes`.
pub fn check_peer(this: NodeId, peer: NodeId, max_nodes: u16) -> Result<(), FabricError> {
    if peer == this || peer.0 >= max_nodes {
        return Err(FabricError::InvalidPeer { node: peer, this, max_nodes });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RemoteWrite;

    #[test]
    fn rejects_duplicate_and_unaligned_regions() {
        let a = RegionSpec::new(RegionId(1), 64, RemoteWrite::Granted);
        assert!(validate_specs(&[a]).is_ok());
        assert!(matches!(validate_specs(&[a, a]), Err(FabricError::InvalidLayout(_))));
        let odd = RegionSpec::new(RegionId(2), 12, RemoteWrite::Never);
        assert!(matches!(validate_specs(&[odd]), Err(FabricError::InvalidLayout(_))));
        let empty = RegionSpec::new(RegionId(2), 0, RemoteWrite::Never);
        assert!(matches!(validate_specs(&[empty]), Err(FabricError::InvalidLayout(_))));
    }

    #[test]
    fn bounds_checks_catch_overflow() {
        let (n, r) = (NodeId(0), RegionId(0));
        assert!(check_bounds(n, r, 64, 0, 64).is_ok());
        assert!(check_bounds(n, r, 64, 1, 64).is_err());
        assert!(check_bounds(n, r, 64, u64::MAX, 2).is_err());
        assert!(check_word(n, r, 64, 4).is_err());
        assert!(check_word(n, r, 64, 56).is_ok());
        assert!(check_word(n, r, 64, 64).is_err());
    }

    #[test]
    fn membership_limits() {
        assert!(validate_membership(NodeId(2), 3).is_ok());
        assert!(validate_membership(NodeId(3), 3).is_err());
        assert!(validate_membership(NodeId(0), 0).is_err());
        assert!(check_peer(NodeId(0), NodeId(0), 3).is_err());
        assert!(check_peer(NodeId(0), NodeId(2), 3).is_ok());
    }
}
