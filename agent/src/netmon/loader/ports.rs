//! The bind programs' map: the ports no session may bind.

use std::collections::BTreeMap;

use agent_common::rule::{RESERVED_PORTS_MAP, ReservedPort};
use aya::maps::HashMap;

use super::{KernelMonitor, NetmonError, map_err};

impl KernelMonitor {
    /// Makes `RESERVED_PORTS` hold exactly `ports` (port → `server_index`): new entries first,
    /// so a port that stays reserved is never briefly open.
    pub fn sync_reserved_ports(&mut self, ports: &BTreeMap<u16, u32>) -> Result<(), NetmonError> {
        let map = self
            .ebpf
            .map_mut(RESERVED_PORTS_MAP)
            .ok_or(NetmonError::Missing("RESERVED_PORTS map"))?;
        let mut reserved =
            HashMap::<_, ReservedPort, u32>::try_from(map).map_err(map_err(RESERVED_PORTS_MAP))?;
        make_exactly(
            &mut reserved,
            ports.iter().map(|(k, v)| (*k, *v)),
            RESERVED_PORTS_MAP,
        )
    }
}

/// Makes a hash map hold exactly `wanted`: every wanted entry written first, then every other
/// key removed, so a key that stays is never briefly missing.
pub(super) fn make_exactly<K: aya::Pod + PartialEq, V: aya::Pod>(
    map: &mut HashMap<&mut aya::maps::MapData, K, V>,
    wanted: impl Iterator<Item = (K, V)> + Clone,
    name: &'static str,
) -> Result<(), NetmonError> {
    for (key, value) in wanted.clone() {
        map.insert(key, value, 0).map_err(map_err(name))?;
    }
    let stale: Vec<K> = map
        .keys()
        .filter_map(Result::ok)
        .filter(|key| !wanted.clone().any(|(k, _)| k == *key))
        .collect();
    for key in stale {
        remove(map, &key, name)?;
    }
    Ok(())
}

/// Removes a key; one already gone (the kernel side removed it meanwhile) is not an error.
fn remove<K: aya::Pod, V: aya::Pod>(
    map: &mut HashMap<&mut aya::maps::MapData, K, V>,
    key: &K,
    name: &'static str,
) -> Result<(), NetmonError> {
    match map.remove(key) {
        Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
        Err(aya::maps::MapError::SyscallError(e))
            if e.io_error.raw_os_error() == Some(libc::ENOENT) =>
        {
            Ok(())
        }
        Err(source) => Err(NetmonError::Map { name, source }),
    }
}
