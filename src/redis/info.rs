//! Typed `INFO` parsing for Redis 6.2, 7.x and Valkey 8/9.
//!
//! The parser is total: any input (even arbitrary bytes) yields an [`Info`];
//! fields that are absent or malformed are `None`. Valkey's inclusive names
//! are accepted next to the historical ones (`primary`/`master`,
//! `replica`/`slave`), so callers see one vocabulary: primary and replica.
//!
//! Length: ~560 lines of code, most of it field tables for four engines.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use super::endpoint::Endpoint;

/// Which server software answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EngineKind {
    /// Redis.
    Redis,
    /// Valkey.
    Valkey,
}

/// A `major.minor.patch` version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Version {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
    /// Patch.
    pub patch: u32,
}

impl Version {
    /// Builds a version.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl FromStr for Version {
    type Err = ();

    /// Parses `7.0.15`, `8.1`, `9.1.2-rc1` (suffixes after the numbers are ignored).
    fn from_str(s: &str) -> Result<Self, ()> {
        let mut parts = s.trim().split('.');
        let num = |p: Option<&str>| -> Option<u32> {
            let p = p?;
            let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        };
        let major = num(parts.next()).ok_or(())?;
        let minor = num(parts.next()).ok_or(())?;
        let patch = num(parts.next()).unwrap_or(0);
        Ok(Self::new(major, minor, patch))
    }
}

/// Replication role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Accepts writes (`role:master` / `role:primary`).
    Primary,
    /// Follows a primary (`role:slave` / `role:replica`).
    Replica,
}

/// State of a replica's link to its primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkStatus {
    /// Connected and streaming.
    Up,
    /// Not connected (or still synchronising).
    Down,
}

/// The `# Server` section.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServerInfo {
    /// Redis or Valkey (`None` if the section was absent).
    pub engine: Option<EngineKind>,
    /// The engine's own version (`valkey_version` on Valkey, else `redis_version`).
    pub version: Option<Version>,
    /// The Redis-compatibility version (`redis_version`; Valkey reports 7.2.4).
    pub redis_compat_version: Option<Version>,
    /// `standalone`, `cluster` or `sentinel` (`redis_mode` / `server_mode`).
    pub mode: Option<String>,
    /// Run id (changes on every restart).
    pub run_id: Option<String>,
    /// `tcp_port`.
    pub tcp_port: Option<u16>,
    /// `uptime_in_seconds`.
    pub uptime_seconds: Option<u64>,
    /// `process_id`.
    pub process_id: Option<u32>,
    /// `executable`.
    pub executable: Option<String>,
    /// `config_file`.
    pub config_file: Option<String>,
}

/// The `# Clients` section.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClientsInfo {
    /// `connected_clients`.
    pub connected_clients: Option<u64>,
    /// `blocked_clients`.
    pub blocked_clients: Option<u64>,
    /// `maxclients`.
    pub maxclients: Option<u64>,
    /// `tracking_clients`.
    pub tracking_clients: Option<u64>,
    /// `clients_in_timeout_table`.
    pub clients_in_timeout_table: Option<u64>,
}

/// The `# Memory` section.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MemoryInfo {
    /// `used_memory` (bytes).
    pub used_memory: Option<u64>,
    /// `used_memory_rss` (bytes).
    pub used_memory_rss: Option<u64>,
    /// `used_memory_peak` (bytes).
    pub used_memory_peak: Option<u64>,
    /// `used_memory_dataset` (bytes).
    pub used_memory_dataset: Option<u64>,
    /// `maxmemory` (bytes, 0 = unlimited).
    pub maxmemory: Option<u64>,
    /// `maxmemory_policy`.
    pub maxmemory_policy: Option<String>,
    /// `mem_fragmentation_ratio`.
    pub mem_fragmentation_ratio: Option<f64>,
    /// `total_system_memory` (bytes).
    pub total_system_memory: Option<u64>,
    /// `mem_replication_backlog` (bytes).
    pub mem_replication_backlog: Option<u64>,
}

impl MemoryInfo {
    /// `used_memory / maxmemory` in percent, when a limit is set.
    pub fn used_percent(&self) -> Option<f64> {
        match (self.used_memory, self.maxmemory) {
            (Some(used), Some(max)) if max > 0 => Some(used as f64 * 100.0 / max as f64),
            _ => None,
        }
    }
}

/// The `# Persistence` section.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PersistenceInfo {
    /// `loading` (a dataset is being loaded).
    pub loading: Option<bool>,
    /// `async_loading` (7.0+).
    pub async_loading: Option<bool>,
    /// `rdb_changes_since_last_save`.
    pub rdb_changes_since_last_save: Option<u64>,
    /// `rdb_bgsave_in_progress`.
    pub rdb_bgsave_in_progress: Option<bool>,
    /// `rdb_last_save_time` (unix seconds).
    pub rdb_last_save_time: Option<i64>,
    /// `rdb_last_bgsave_status` is `ok`.
    pub rdb_last_bgsave_ok: Option<bool>,
    /// `aof_enabled`.
    pub aof_enabled: Option<bool>,
    /// `aof_rewrite_in_progress`.
    pub aof_rewrite_in_progress: Option<bool>,
    /// `aof_last_write_status` is `ok`.
    pub aof_last_write_ok: Option<bool>,
}

/// The `# Stats` section.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StatsInfo {
    /// `total_connections_received`.
    pub total_connections_received: Option<u64>,
    /// `total_commands_processed`.
    pub total_commands_processed: Option<u64>,
    /// `instantaneous_ops_per_sec`.
    pub instantaneous_ops_per_sec: Option<u64>,
    /// `rejected_connections`.
    pub rejected_connections: Option<u64>,
    /// `sync_full`.
    pub sync_full: Option<u64>,
    /// `sync_partial_ok`.
    pub sync_partial_ok: Option<u64>,
    /// `sync_partial_err`.
    pub sync_partial_err: Option<u64>,
    /// `expired_keys`.
    pub expired_keys: Option<u64>,
    /// `evicted_keys`.
    pub evicted_keys: Option<u64>,
    /// `keyspace_hits`.
    pub keyspace_hits: Option<u64>,
    /// `keyspace_misses`.
    pub keyspace_misses: Option<u64>,
    /// `latest_fork_usec`.
    pub latest_fork_usec: Option<u64>,
    /// `total_net_input_bytes`.
    pub total_net_input_bytes: Option<u64>,
    /// `total_net_output_bytes`.
    pub total_net_output_bytes: Option<u64>,
    /// `total_error_replies`.
    pub total_error_replies: Option<u64>,
}

/// One replica as listed by its primary (`slaveN:` / `replicaN:` lines).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaEntry {
    /// Address the replica announced.
    pub endpoint: Endpoint,
    /// `state` (`online`, `wait_bgsave`, `send_bulk`, ...).
    pub state: String,
    /// Replication offset the replica acknowledged.
    pub offset: Option<i64>,
    /// Seconds since the last acknowledgement.
    pub lag_seconds: Option<i64>,
}

/// The `# Replication` section.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplicationInfo {
    /// `role`.
    pub role: Option<Role>,
    /// Replica: the primary it follows (`master_host`/`master_port`, or `primary_*`).
    pub primary: Option<Endpoint>,
    /// Replica: `master_link_status`.
    pub link_status: Option<LinkStatus>,
    /// Replica: `master_last_io_seconds_ago`.
    pub last_io_seconds_ago: Option<i64>,
    /// Replica: `master_sync_in_progress`.
    pub sync_in_progress: Option<bool>,
    /// Replica: `master_link_down_since_seconds`.
    pub link_down_since_seconds: Option<i64>,
    /// Replica: `slave_repl_offset` (applied offset).
    pub replica_offset: Option<i64>,
    /// Replica: `slave_read_repl_offset` (read offset, 7.0+).
    pub replica_read_offset: Option<i64>,
    /// Replica: `slave_priority` (0 = never promote).
    pub replica_priority: Option<u32>,
    /// Replica: `slave_read_only`.
    pub replica_read_only: Option<bool>,
    /// `connected_slaves`.
    pub connected_replicas: Option<u32>,
    /// Primary with a write fence (`min-replicas-to-write` and
    /// `min-replicas-max-lag` both set): how many replicas acknowledged
    /// within the lag bound (`min_slaves_good_slaves`); `None` without a
    /// fence.
    pub good_replicas: Option<u32>,
    /// Replicas listed by this primary, in index order.
    pub replicas: Vec<ReplicaEntry>,
    /// `master_failover_state` (6.2+).
    pub failover_state: Option<String>,
    /// `master_replid`.
    pub replid: Option<String>,
    /// `master_replid2`.
    pub replid2: Option<String>,
    /// `master_repl_offset`: the offset of this node's replication stream.
    pub repl_offset: Option<i64>,
    /// `second_repl_offset`.
    pub second_repl_offset: Option<i64>,
    /// `repl_backlog_active`.
    pub backlog_active: Option<bool>,
    /// `repl_backlog_size`.
    pub backlog_size: Option<u64>,
    /// `repl_backlog_first_byte_offset`.
    pub backlog_first_byte_offset: Option<i64>,
    /// `repl_backlog_histlen`.
    pub backlog_histlen: Option<u64>,
}

impl ReplicationInfo {
    /// The offset this node has applied: the replica offset on replicas,
    /// `master_repl_offset` on primaries.
    pub fn applied_offset(&self) -> Option<i64> {
        match self.role {
            Some(Role::Replica) => self.replica_offset.or(self.repl_offset),
            _ => self.repl_offset,
        }
    }
}

/// One `dbN:` line of the `# Keyspace` section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyspaceDb {
    /// Database index.
    pub db: u32,
    /// `keys`.
    pub keys: u64,
    /// `expires`.
    pub expires: u64,
    /// `avg_ttl` (ms).
    pub avg_ttl: u64,
}

/// Parsed `INFO` output.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Info {
    /// `# Server`.
    pub server: ServerInfo,
    /// `# Clients`.
    pub clients: ClientsInfo,
    /// `# Memory`.
    pub memory: MemoryInfo,
    /// `# Persistence`.
    pub persistence: PersistenceInfo,
    /// `# Stats`.
    pub stats: StatsInfo,
    /// `# Replication`.
    pub replication: ReplicationInfo,
    /// `# Keyspace`, by database index.
    pub keyspace: Vec<KeyspaceDb>,
    /// Every `field:value` pair, as sent (later duplicates win).
    pub fields: BTreeMap<String, String>,
}

/// Looks up the first present alias.
fn get<'a>(fields: &'a BTreeMap<String, String>, names: &[&str]) -> Option<&'a str> {
    names
        .iter()
        .find_map(|n| fields.get(*n))
        .map(|s| s.as_str())
}

fn num<T: FromStr>(fields: &BTreeMap<String, String>, names: &[&str]) -> Option<T> {
    get(fields, names).and_then(|v| v.trim().parse().ok())
}

fn flag(fields: &BTreeMap<String, String>, names: &[&str]) -> Option<bool> {
    match get(fields, names)?.trim() {
        "1" | "yes" => Some(true),
        "0" | "no" => Some(false),
        _ => None,
    }
}

fn text(fields: &BTreeMap<String, String>, names: &[&str]) -> Option<String> {
    get(fields, names).map(str::to_string)
}

fn status_ok(fields: &BTreeMap<String, String>, names: &[&str]) -> Option<bool> {
    get(fields, names).map(|v| v == "ok")
}

/// Splits `a=1,b=2` into pairs (entries without `=` are ignored).
pub(crate) fn kv_list(value: &str) -> BTreeMap<&str, &str> {
    value
        .split(',')
        .filter_map(|part| part.split_once('='))
        .collect()
}

/// `slave3` / `replica3` → `Some(3)`.
fn replica_index(key: &str) -> Option<u32> {
    let rest = key
        .strip_prefix("slave")
        .or_else(|| key.strip_prefix("replica"))?;
    if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    rest.parse().ok()
}

fn parse_replica(value: &str) -> Option<ReplicaEntry> {
    let kv = kv_list(value);
    let ip = kv.get("ip")?;
    let port = kv.get("port")?.parse().ok()?;
    Some(ReplicaEntry {
        endpoint: Endpoint::new(ip, port),
        state: kv.get("state").map(|s| s.to_string()).unwrap_or_default(),
        offset: kv.get("offset").and_then(|v| v.parse().ok()),
        lag_seconds: kv.get("lag").and_then(|v| v.parse().ok()),
    })
}

fn parse_keyspace(key: &str, value: &str) -> Option<KeyspaceDb> {
    let rest = key.strip_prefix("db")?;
    if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let db = rest.parse().ok()?;
    let kv = kv_list(value);
    let n = |k: &str| kv.get(k).and_then(|v| v.parse().ok());
    Some(KeyspaceDb {
        db,
        keys: n("keys")?,
        expires: n("expires").unwrap_or(0),
        avg_ttl: n("avg_ttl").unwrap_or(0),
    })
}

impl Info {
    /// Parses the text of an `INFO` reply. Never fails and never panics.
    pub fn parse(input: &str) -> Self {
        let mut fields = BTreeMap::new();
        let mut replicas: Vec<(u32, ReplicaEntry)> = Vec::new();
        let mut keyspace = Vec::new();
        for line in input.lines() {
            let line = line.trim_end_matches('\r');
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            if let Some(idx) = replica_index(key) {
                if let Some(entry) = parse_replica(value) {
                    replicas.retain(|(i, _)| *i != idx);
                    replicas.push((idx, entry));
                }
            } else if let Some(db) = parse_keyspace(key, value) {
                keyspace.retain(|d: &KeyspaceDb| d.db != db.db);
                keyspace.push(db);
            }
            fields.insert(key.to_string(), value.to_string());
        }
        replicas.sort_by_key(|(i, _)| *i);
        keyspace.sort_by_key(|d| d.db);
        let f = &fields;

        let is_valkey =
            get(f, &["server_name"]) == Some("valkey") || f.contains_key("valkey_version");
        let redis_compat_version = get(f, &["redis_version"]).and_then(|v| v.parse().ok());
        let server = ServerInfo {
            engine: if is_valkey {
                Some(EngineKind::Valkey)
            } else if f.contains_key("redis_version") {
                Some(EngineKind::Redis)
            } else {
                None
            },
            version: if is_valkey {
                get(f, &["valkey_version"]).and_then(|v| v.parse().ok())
            } else {
                redis_compat_version
            },
            redis_compat_version,
            mode: text(f, &["server_mode", "redis_mode"]),
            run_id: text(f, &["run_id"]),
            tcp_port: num(f, &["tcp_port"]),
            uptime_seconds: num(f, &["uptime_in_seconds"]),
            process_id: num(f, &["process_id"]),
            executable: text(f, &["executable"]),
            config_file: text(f, &["config_file"]),
        };
        let clients = ClientsInfo {
            connected_clients: num(f, &["connected_clients"]),
            blocked_clients: num(f, &["blocked_clients"]),
            maxclients: num(f, &["maxclients"]),
            tracking_clients: num(f, &["tracking_clients"]),
            clients_in_timeout_table: num(f, &["clients_in_timeout_table"]),
        };
        let memory = MemoryInfo {
            used_memory: num(f, &["used_memory"]),
            used_memory_rss: num(f, &["used_memory_rss"]),
            used_memory_peak: num(f, &["used_memory_peak"]),
            used_memory_dataset: num(f, &["used_memory_dataset"]),
            maxmemory: num(f, &["maxmemory"]),
            maxmemory_policy: text(f, &["maxmemory_policy"]),
            mem_fragmentation_ratio: num::<f64>(f, &["mem_fragmentation_ratio"])
                .filter(|r| r.is_finite()),
            total_system_memory: num(f, &["total_system_memory"]),
            mem_replication_backlog: num(f, &["mem_replication_backlog"]),
        };
        let persistence = PersistenceInfo {
            loading: flag(f, &["loading"]),
            async_loading: flag(f, &["async_loading"]),
            rdb_changes_since_last_save: num(f, &["rdb_changes_since_last_save"]),
            rdb_bgsave_in_progress: flag(f, &["rdb_bgsave_in_progress"]),
            rdb_last_save_time: num(f, &["rdb_last_save_time"]),
            rdb_last_bgsave_ok: status_ok(f, &["rdb_last_bgsave_status"]),
            aof_enabled: flag(f, &["aof_enabled"]),
            aof_rewrite_in_progress: flag(f, &["aof_rewrite_in_progress"]),
            aof_last_write_ok: status_ok(f, &["aof_last_write_status"]),
        };
        let stats = StatsInfo {
            total_connections_received: num(f, &["total_connections_received"]),
            total_commands_processed: num(f, &["total_commands_processed"]),
            instantaneous_ops_per_sec: num(f, &["instantaneous_ops_per_sec"]),
            rejected_connections: num(f, &["rejected_connections"]),
            sync_full: num(f, &["sync_full"]),
            sync_partial_ok: num(f, &["sync_partial_ok"]),
            sync_partial_err: num(f, &["sync_partial_err"]),
            expired_keys: num(f, &["expired_keys"]),
            evicted_keys: num(f, &["evicted_keys"]),
            keyspace_hits: num(f, &["keyspace_hits"]),
            keyspace_misses: num(f, &["keyspace_misses"]),
            latest_fork_usec: num(f, &["latest_fork_usec"]),
            total_net_input_bytes: num(f, &["total_net_input_bytes"]),
            total_net_output_bytes: num(f, &["total_net_output_bytes"]),
            total_error_replies: num(f, &["total_error_replies"]),
        };
        let role = match get(f, &["role"]) {
            Some("master" | "primary") => Some(Role::Primary),
            Some("slave" | "replica") => Some(Role::Replica),
            _ => None,
        };
        let primary_host = get(f, &["primary_host", "master_host"]);
        let primary_port: Option<u16> = num(f, &["primary_port", "master_port"]);
        let replication = ReplicationInfo {
            role,
            primary: match (primary_host, primary_port) {
                (Some(h), Some(p)) if !h.is_empty() => Some(Endpoint::new(h, p)),
                _ => None,
            },
            link_status: match get(f, &["primary_link_status", "master_link_status"]) {
                Some("up") => Some(LinkStatus::Up),
                Some(_) => Some(LinkStatus::Down),
                None => None,
            },
            last_io_seconds_ago: num(
                f,
                &["primary_last_io_seconds_ago", "master_last_io_seconds_ago"],
            ),
            sync_in_progress: flag(f, &["primary_sync_in_progress", "master_sync_in_progress"]),
            link_down_since_seconds: num(
                f,
                &[
                    "primary_link_down_since_seconds",
                    "master_link_down_since_seconds",
                ],
            ),
            replica_offset: num(f, &["replica_repl_offset", "slave_repl_offset"]),
            replica_read_offset: num(f, &["replica_read_repl_offset", "slave_read_repl_offset"]),
            replica_priority: num(f, &["replica_priority", "slave_priority"]),
            replica_read_only: flag(f, &["replica_read_only", "slave_read_only"]),
            connected_replicas: num(f, &["connected_replicas", "connected_slaves"]),
            good_replicas: num(f, &["min_replicas_good_replicas", "min_slaves_good_slaves"]),
            replicas: replicas.into_iter().map(|(_, e)| e).collect(),
            failover_state: text(f, &["primary_failover_state", "master_failover_state"]),
            replid: text(f, &["primary_replid", "master_replid"]),
            replid2: text(f, &["primary_replid2", "master_replid2"]),
            repl_offset: num(f, &["primary_repl_offset", "master_repl_offset"]),
            second_repl_offset: num(f, &["second_repl_offset"]),
            backlog_active: flag(f, &["repl_backlog_active"]),
            backlog_size: num(f, &["repl_backlog_size"]),
            backlog_first_byte_offset: num(f, &["repl_backlog_first_byte_offset"]),
            backlog_histlen: num(f, &["repl_backlog_histlen"]),
        };
        Self {
            server,
            clients,
            memory,
            persistence,
            stats,
            replication,
            keyspace,
            fields,
        }
    }

    /// Total keys over all databases.
    pub fn total_keys(&self) -> u64 {
        self.keyspace.iter().map(|d| d.keys).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const REDIS62_PRIMARY: &str = "# Server\r\nredis_version:6.2.14\r\nredis_mode:standalone\r\nrun_id:6c57\r\ntcp_port:17100\r\nuptime_in_seconds:2\r\n\r\n# Clients\r\nconnected_clients:1\r\nblocked_clients:0\r\nmaxclients:10000\r\n\r\n# Memory\r\nused_memory:2044968\r\nmaxmemory:4089936\r\nmaxmemory_policy:noeviction\r\nmem_fragmentation_ratio:2.07\r\n\r\n# Persistence\r\nloading:0\r\nrdb_changes_since_last_save:1\r\nrdb_bgsave_in_progress:0\r\nrdb_last_bgsave_status:ok\r\naof_enabled:0\r\n\r\n# Stats\r\ntotal_connections_received:5\r\nsync_full:3\r\n\r\n# Replication\r\nrole:master\r\nconnected_slaves:2\r\nslave0:ip=127.0.0.1,port=17101,state=online,offset=50,lag=0\r\nslave1:ip=127.0.0.1,port=17102,state=online,offset=42,lag=1\r\nmaster_failover_state:no-failover\r\nmaster_replid:4d58\r\nmaster_repl_offset:50\r\nsecond_repl_offset:-1\r\nrepl_backlog_active:1\r\n\r\n# Keyspace\r\ndb0:keys=1,expires=0,avg_ttl=0\r\ndb3:keys=10,expires=2,avg_ttl=7\r\n";

    const VALKEY_REPLICA_NEW_NAMES: &str = "# Server\nredis_version:7.2.4\nserver_name:valkey\nvalkey_version:9.1.2\nserver_mode:standalone\n# Replication\nrole:replica\nprimary_host:127.0.0.1\nprimary_port:17100\nprimary_link_status:down\nprimary_sync_in_progress:0\nreplica_read_repl_offset:50\nreplica_repl_offset:48\nreplica_priority:0\nreplica_read_only:1\nreplica_announced:1\nconnected_replicas:1\nreplica0:ip=127.0.0.1,port=17101,state=online,offset=50,lag=1,type=replica\nreplicas_waiting_psync:0\nprimary_repl_offset:50\n# Keyspace\ndb0:keys=1,expires=0,avg_ttl=0,keys_with_volatile_items=0\n";

    #[test]
    fn parses_redis_62_primary() {
        let info = Info::parse(REDIS62_PRIMARY);
        assert_eq!(info.server.engine, Some(EngineKind::Redis));
        assert_eq!(info.server.version, Some(Version::new(6, 2, 14)));
        assert_eq!(info.server.mode.as_deref(), Some("standalone"));
        assert_eq!(info.server.tcp_port, Some(17100));
        assert_eq!(info.clients.connected_clients, Some(1));
        assert_eq!(info.memory.used_memory, Some(2044968));
        assert_eq!(info.memory.used_percent().map(|p| p.round()), Some(50.0));
        assert_eq!(info.memory.mem_fragmentation_ratio, Some(2.07));
        assert_eq!(info.persistence.loading, Some(false));
        assert_eq!(info.persistence.rdb_last_bgsave_ok, Some(true));
        assert_eq!(info.stats.sync_full, Some(3));
        let r = &info.replication;
        assert_eq!(r.role, Some(Role::Primary));
        assert_eq!(r.connected_replicas, Some(2));
        assert_eq!(r.replicas.len(), 2);
        assert_eq!(r.replicas[1].endpoint, Endpoint::new("127.0.0.1", 17102));
        assert_eq!(r.replicas[1].offset, Some(42));
        assert_eq!(r.replicas[1].lag_seconds, Some(1));
        assert_eq!(r.repl_offset, Some(50));
        assert_eq!(r.applied_offset(), Some(50));
        assert_eq!(info.keyspace.len(), 2);
        assert_eq!(info.total_keys(), 11);
    }

    #[test]
    fn accepts_valkey_inclusive_names() {
        let info = Info::parse(VALKEY_REPLICA_NEW_NAMES);
        assert_eq!(info.server.engine, Some(EngineKind::Valkey));
        assert_eq!(info.server.version, Some(Version::new(9, 1, 2)));
        assert_eq!(
            info.server.redis_compat_version,
            Some(Version::new(7, 2, 4))
        );
        let r = &info.replication;
        assert_eq!(r.role, Some(Role::Replica));
        assert_eq!(r.primary, Some(Endpoint::new("127.0.0.1", 17100)));
        assert_eq!(r.link_status, Some(LinkStatus::Down));
        assert_eq!(r.replica_offset, Some(48));
        assert_eq!(r.applied_offset(), Some(48));
        assert_eq!(r.replica_priority, Some(0));
        // `replica_announced` and `replicas_waiting_psync` are not replica entries.
        assert_eq!(r.replicas.len(), 1);
        assert_eq!(r.connected_replicas, Some(1));
        assert_eq!(info.total_keys(), 1);
    }

    #[test]
    fn versions_parse_loosely() {
        assert_eq!("8.1".parse::<Version>(), Ok(Version::new(8, 1, 0)));
        assert_eq!("9.1.2-rc1".parse::<Version>(), Ok(Version::new(9, 1, 2)));
        assert!("x".parse::<Version>().is_err());
        assert!(Version::new(6, 2, 14) < Version::new(7, 0, 0));
    }

    #[test]
    fn malformed_values_become_none() {
        let info = Info::parse(
            "role:leader\nmaster_port:99999\nmaster_host:h\nslave0:ip=x\nslave1:ip=1.2.3.4,port=-1\ndb0:keys=abc\nused_memory:-5\nmem_fragmentation_ratio:nan\n",
        );
        assert_eq!(info.replication.role, None);
        assert_eq!(info.replication.primary, None);
        assert!(info.replication.replicas.is_empty());
        assert!(info.keyspace.is_empty());
        assert_eq!(info.memory.used_memory, None);
        assert_eq!(info.memory.mem_fragmentation_ratio, None);
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let text = String::from_utf8_lossy(&bytes);
            let _ = Info::parse(&text);
        }

        #[test]
        fn arbitrary_info_like_lines_never_panic(
            lines in proptest::collection::vec(
                (
                    prop_oneof![
                        Just("role".to_string()), Just("master_host".to_string()),
                        Just("master_port".to_string()), Just("slave0".to_string()),
                        Just("replica12".to_string()), Just("db0".to_string()),
                        Just("db".to_string()), Just("valkey_version".to_string()),
                        Just("redis_version".to_string()), "[a-z_0-9]{0,12}",
                    ],
                    "[ -~]{0,64}",
                ),
                0..64,
            )
        ) {
            let text: String = lines.iter().map(|(k, v)| format!("{k}:{v}\r\n")).collect();
            let info = Info::parse(&text);
            prop_assert!(info.replication.replicas.len() <= lines.len());
        }
    }
}
