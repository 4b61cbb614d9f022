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
        for (port, index) in ports {
            reserved
                .insert(port, index, 0)
                .map_err(map_err(RESERVED_PORTS_MAP))?;
        }
        let stale: Vec<ReservedPort> = reserved
            .keys()
            .filter_map(Result::ok)
            .filter(|port| !ports.contains_key(port))
            .collect();
        for port in stale {
            remove(&mut reserved, &port, RESERVED_PORTS_MAP)?;
        }
        Ok(())
    }
}

/// Removes a key; one already gone (the kernel side removed it meanwhile) is not an error.
pub(super) fn remove<K: aya::Pod, V: aya::Pod>(
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
