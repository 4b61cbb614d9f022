//! The maps: the rules, the egress limits, the event ring, the summaries and the counters.

use agent_common::{
    connect::EVENTS_MAP,
    counters,
    rule::{
        CIDR_MAP, CidrKey, EGRESS_ALLOW_MAP, EGRESS_FIXED_BITS, EGRESS_SCOPE_MAP, ENDPOINTS_MAP,
        EgressKey, EndpointKey, EndpointRule,
    },
    summary::{SUMMARY_MAP, SUMMARY_SEEN_MAP, SummaryKey, SummarySeen, SummaryValue},
};
use aya::maps::{
    HashMap, MapData, PerCpuArray, PerCpuHashMap, RingBuf,
    lpm_trie::{Key, LpmTrie},
};

use super::{KernelMonitor, NetmonError, map_err};
use crate::netmon::rules::{MapContents, Rule};

/// Sums of the per-CPU counters (see `agent_common::counters`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Every connect seen.
    pub connects: u64,
    /// Datagrams sent with an address (`sendto`/`sendmsg`) seen.
    pub sendmsgs: u64,
    /// Connects and datagrams that matched no rule.
    pub unmatched: u64,
    /// Connects and datagrams that matched a FLAG rule.
    pub flagged: u64,
    /// Connects and datagrams refused by a DENY rule.
    pub denied: u64,
    /// Events lost because the ring buffer was full.
    pub ring_drops: u64,
    /// Matched connections counted in a summary instead of sent one by one (reported as
    /// summary events, not lost).
    pub summarised: u64,
    /// Packets of egress-limited cgroups dropped by the guards.
    pub egress_drops: u64,
    /// Binds of sessions that got their port.
    pub binds: u64,
    /// Connects and datagrams to the host let through because the socket taking them is the
    /// session's own.
    pub own_port: u64,
    /// Unix socket connects and datagrams sent to an address that the programs saw.
    pub unix_connects: u64,
}

/// A key's summary, summed over CPUs: connections over their key's burst (or that found the
/// ring full), with the latest one's details.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Summary {
    /// Connections summarised since the entry was made.
    pub summarised: u64,
    /// The earliest `bpf_ktime_get_ns` of one.
    pub first_ns: u64,
    /// The latest one's share of the map (its time, destination, process).
    pub last: SummaryValue,
    /// What was reported of the key so far.
    pub seen: SummarySeen,
}

impl KernelMonitor {
    /// Makes the rule maps hold exactly `rules` (after widening local addresses to `locals`): new entries are
    /// written before stale ones are removed, so a rule being changed is never briefly absent.
    /// Takes effect on the next connect; nothing is re-attached.
    pub fn sync_rules(
        &mut self,
        rules: &[Rule],
        locals: &[std::net::IpAddr],
    ) -> Result<(), NetmonError> {
        let want = MapContents::from_rules(rules, locals);

        let map = self
            .ebpf
            .map_mut(ENDPOINTS_MAP)
            .ok_or(NetmonError::Missing("ENDPOINTS map"))?;
        let mut exact = HashMap::<_, EndpointKey, EndpointRule>::try_from(map)
            .map_err(map_err(ENDPOINTS_MAP))?;
        for (key, value) in &want.exact {
            exact
                .insert(key, value, 0)
                .map_err(map_err(ENDPOINTS_MAP))?;
        }
        let stale: Vec<EndpointKey> = exact
            .keys()
            .filter_map(Result::ok)
            .filter(|k| !want.exact.contains_key(k))
            .collect();
        for key in stale {
            exact.remove(&key).map_err(map_err(ENDPOINTS_MAP))?;
        }

        let map = self
            .ebpf
            .map_mut(CIDR_MAP)
            .ok_or(NetmonError::Missing("CIDR_RULES map"))?;
        let mut cidr =
            LpmTrie::<_, CidrKey, EndpointRule>::try_from(map).map_err(map_err(CIDR_MAP))?;
        for ((bits, key), value) in &want.cidr {
            cidr.insert(&Key::new(*bits, *key), value, 0)
                .map_err(map_err(CIDR_MAP))?;
        }
        let stale: Vec<Key<CidrKey>> = cidr
            .keys()
            .filter_map(Result::ok)
            .filter(|k| !want.cidr.contains_key(&(k.prefix_len(), k.data())))
            .collect();
        for key in stale {
            cidr.remove(&key).map_err(map_err(CIDR_MAP))?;
        }
        Ok(())
    }

    /// Limits what the cgroup `cgroup_id` may connect to: `allowed` (address, prefix length
    /// over the IPv4-mapped form, port or 0), nothing else. The allowed entries are written
    /// before the cgroup is marked limited, so none is briefly refused.
    pub fn limit_egress(
        &mut self,
        session: &str,
        cgroup_id: u64,
        allowed: &[(std::net::Ipv6Addr, u32, u16)],
    ) -> Result<(), NetmonError> {
        let map = self
            .ebpf
            .map_mut(EGRESS_ALLOW_MAP)
            .ok_or(NetmonError::Missing("EGRESS_ALLOW map"))?;
        let mut allow =
            LpmTrie::<_, EgressKey, u8>::try_from(map).map_err(map_err(EGRESS_ALLOW_MAP))?;
        for (addr, bits, port) in allowed {
            let key = EgressKey {
                cgroup: cgroup_id.to_be_bytes(),
                port: port.to_be_bytes(),
                addr: crate::netmon::rules::mask(*addr, *bits).octets(),
            };
            allow
                .insert(&Key::new(EGRESS_FIXED_BITS + bits, key), 1, 0)
                .map_err(map_err(EGRESS_ALLOW_MAP))?;
        }
        let map = self
            .ebpf
            .map_mut(EGRESS_SCOPE_MAP)
            .ok_or(NetmonError::Missing("EGRESS_SCOPE map"))?;
        let mut scope = HashMap::<_, u64, u32>::try_from(map).map_err(map_err(EGRESS_SCOPE_MAP))?;
        scope
            .insert(cgroup_id, 1, 0)
            .map_err(map_err(EGRESS_SCOPE_MAP))?;
        self.attach_guards(session)
    }

    /// Forgets a cgroup's egress limit (its cgroup is gone; ids are not reused while it exists).
    pub fn forget_egress(&mut self, cgroup_id: u64) -> Result<(), NetmonError> {
        let map = self
            .ebpf
            .map_mut(EGRESS_SCOPE_MAP)
            .ok_or(NetmonError::Missing("EGRESS_SCOPE map"))?;
        let mut scope = HashMap::<_, u64, u32>::try_from(map).map_err(map_err(EGRESS_SCOPE_MAP))?;
        match scope.remove(&cgroup_id) {
            Ok(()) => {}
            Err(aya::maps::MapError::SyscallError(e))
                if e.io_error.raw_os_error() == Some(libc::ENOENT) => {}
            Err(error) => return Err(map_err(EGRESS_SCOPE_MAP)(error)),
        }
        let map = self
            .ebpf
            .map_mut(EGRESS_ALLOW_MAP)
            .ok_or(NetmonError::Missing("EGRESS_ALLOW map"))?;
        let mut allow =
            LpmTrie::<_, EgressKey, u8>::try_from(map).map_err(map_err(EGRESS_ALLOW_MAP))?;
        let ours: Vec<Key<EgressKey>> = allow
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.data().cgroup == cgroup_id.to_be_bytes())
            .collect();
        for key in ours {
            allow.remove(&key).map_err(map_err(EGRESS_ALLOW_MAP))?;
        }
        Ok(())
    }

    /// Hands out the event ring buffer (once) for [`crate::netmon::events::spawn_reader`].
    pub fn take_event_ring(&mut self) -> Result<RingBuf<MapData>, NetmonError> {
        let map = self
            .ebpf
            .take_map(EVENTS_MAP)
            .ok_or(NetmonError::Missing("EVENTS ring buffer"))?;
        RingBuf::try_from(map).map_err(|source| NetmonError::Map {
            name: EVENTS_MAP,
            source,
        })
    }

    /// Every key's summary with what was reported of it.
    pub fn summaries(&self) -> Result<Vec<(SummaryKey, Summary)>, NetmonError> {
        let map = self
            .ebpf
            .map(SUMMARY_MAP)
            .ok_or(NetmonError::Missing("SUMMARY map"))?;
        let summaries = PerCpuHashMap::<_, SummaryKey, SummaryValue>::try_from(map)
            .map_err(map_err(SUMMARY_MAP))?;
        let seen_map = self
            .ebpf
            .map(SUMMARY_SEEN_MAP)
            .ok_or(NetmonError::Missing("SUMMARY_SEEN map"))?;
        let seen = HashMap::<_, SummaryKey, SummarySeen>::try_from(seen_map)
            .map_err(map_err(SUMMARY_SEEN_MAP))?;
        let mut out = Vec::new();
        for entry in summaries.iter() {
            let (key, values) = entry.map_err(map_err(SUMMARY_MAP))?;
            let busy = values.iter().filter(|v| v.summarised > 0);
            let Some(last) = busy.clone().max_by_key(|v| v.last_ns).copied() else {
                continue;
            };
            out.push((
                key,
                Summary {
                    summarised: values.iter().map(|v| v.summarised).sum(),
                    first_ns: busy.map(|v| v.first_ns).min().unwrap_or(last.first_ns),
                    last,
                    seen: seen.get(&key, 0).unwrap_or_default(),
                },
            ));
        }
        Ok(out)
    }

    /// Records what was reported of a key (pinned: the next daemon does not report it again).
    pub fn summary_reported(
        &mut self,
        key: SummaryKey,
        seen: SummarySeen,
    ) -> Result<(), NetmonError> {
        let map = self
            .ebpf
            .map_mut(SUMMARY_SEEN_MAP)
            .ok_or(NetmonError::Missing("SUMMARY_SEEN map"))?;
        let mut map = HashMap::<_, SummaryKey, SummarySeen>::try_from(map)
            .map_err(map_err(SUMMARY_SEEN_MAP))?;
        map.insert(key, seen, 0).map_err(map_err(SUMMARY_SEEN_MAP))
    }

    /// Forgets a key of a session that is gone, once all of it was reported.
    pub fn forget_summary(&mut self, key: SummaryKey) -> Result<(), NetmonError> {
        for name in [SUMMARY_MAP, SUMMARY_SEEN_MAP] {
            let map = self
                .ebpf
                .map_mut(name)
                .ok_or(NetmonError::Missing("SUMMARY map"))?;
            let removed = match name {
                SUMMARY_MAP => PerCpuHashMap::<_, SummaryKey, SummaryValue>::try_from(map)
                    .map_err(map_err(name))?
                    .remove(&key),
                _ => HashMap::<_, SummaryKey, SummarySeen>::try_from(map)
                    .map_err(map_err(name))?
                    .remove(&key),
            };
            match removed {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
                Err(source) => return Err(NetmonError::Map { name, source }),
            }
        }
        Ok(())
    }

    /// Reads and sums the per-CPU counters.
    pub fn counters(&self) -> Result<Counters, NetmonError> {
        let map = self
            .ebpf
            .map(counters::MAP_NAME)
            .ok_or(NetmonError::Missing("COUNTERS map"))?;
        let array = PerCpuArray::<_, u64>::try_from(map).map_err(|source| NetmonError::Map {
            name: counters::MAP_NAME,
            source,
        })?;
        let sum = |index: u32| -> Result<u64, NetmonError> {
            let values = array.get(&index, 0).map_err(|source| NetmonError::Map {
                name: counters::MAP_NAME,
                source,
            })?;
            Ok(values.iter().sum())
        };
        Ok(Counters {
            connects: sum(counters::CONNECTS)?,
            sendmsgs: sum(counters::SENDMSGS)?,
            unmatched: sum(counters::UNMATCHED)?,
            flagged: sum(counters::FLAGGED)?,
            denied: sum(counters::DENIED)?,
            ring_drops: sum(counters::RING_DROPS)?,
            summarised: sum(counters::SUMMARISED)?,
            egress_drops: sum(counters::EGRESS_DROPS)?,
            binds: sum(counters::BINDS)?,
            own_port: sum(counters::OWN_PORT)?,
            unix_connects: sum(counters::UNIX_CONNECTS)?,
        })
    }
}
