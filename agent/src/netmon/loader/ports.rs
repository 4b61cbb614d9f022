//! The bind programs' maps: the ports no session may bind, and the ports sessions hold.

use std::collections::BTreeMap;

use agent_common::rule::{
    PORT_HOLDERS_MAP, RESERVED_PORTS_MAP, ReservedPort, SESSION_PORTS_MAP, SessionPort,
};
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

    /// Forgets the ports a closed session's cgroup held (its sockets' release normally did).
    pub fn forget_session_ports(&mut self, cgroup_id: u64) -> Result<(), NetmonError> {
        let map = self
            .ebpf
            .map_mut(SESSION_PORTS_MAP)
            .ok_or(NetmonError::Missing("SESSION_PORTS map"))?;
        let mut ports =
            HashMap::<_, SessionPort, u64>::try_from(map).map_err(map_err(SESSION_PORTS_MAP))?;
        let ours: Vec<(SessionPort, u64)> = ports
            .iter()
            .filter_map(Result::ok)
            .filter(|(key, _)| key.cgroup_id == cgroup_id)
            .collect();
        for (key, _) in &ours {
            remove(&mut ports, key, SESSION_PORTS_MAP)?;
        }
        let map = self
            .ebpf
            .map_mut(PORT_HOLDERS_MAP)
            .ok_or(NetmonError::Missing("PORT_HOLDERS map"))?;
        let mut holders =
            HashMap::<_, u64, SessionPort>::try_from(map).map_err(map_err(PORT_HOLDERS_MAP))?;
        for (_, cookie) in &ours {
            remove(&mut holders, cookie, PORT_HOLDERS_MAP)?;
        }
        Ok(())
    }
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
