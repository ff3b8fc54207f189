//! A backup's source, checked on its server before a Job reads it.
//!
//! The candidates come from the Redis's status, which can be older than
//! the servers: an operator cut off from the API server, or one just
//! started, has not looked since a server restarted. A server restarted
//! without storage comes back empty — in a Cluster as a primary owning no
//! slot, in Replication as a primary of nothing — and a snapshot of it
//! would complete as a backup missing a shard. So each candidate is asked,
//! best first, what it is now:
//! - a replica must have its link to its primary up and no full copy
//!   under way (a replica whose link is down refuses a reader anyway);
//! - in a Cluster, it must own the shard's first slot, or follow the node
//!   that does (as it sees the cluster);
//! - in Replication, one the status lists as a replica must still be one
//!   (a primary there is either a fresh empty server or a promotion the
//!   next pass of the Redis controller will tell apart).
//!
//! The one chosen gives its replication offset, and the agent reads only a
//! snapshot that reached it (`--min-offset`): between this check and the
//! read (seconds, while the Job's pod starts) a server restarted empty
//! starts again from nothing and the read fails `SourceChanged` instead of
//! storing the wrong data. A failover in between does not: the new
//! primary's history continues the offsets (its replication ID changes,
//! so the ID is no test). A server without a replication backlog (a
//! primary no replica followed for `repl-backlog-ttl`, a Standalone
//! instance) counts no offset until the agent's read starts one, so none
//! is passed: that window stays open there.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;

use super::Pass;
use crate::api::v1alpha1::Redis;
use crate::controller::error::Error;
use crate::controller::layout;
use crate::controller::names;
use crate::redis::cluster::{self, ClusterNode};
use crate::redis::info::{LinkStatus, ReplicationInfo, Role};
use crate::redis::{ConnectOptions, Endpoint, Node, TlsOptions};

/// A source the servers confirmed.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Confirmed {
    /// The pod.
    pub pod: String,
    /// Its address.
    pub host: String,
    /// Its replication offset when it was checked, where the server counts
    /// one (it has a replication backlog).
    pub offset: Option<i64>,
}

/// Whether the instance `name`, which the status lists as `listed_as`
/// (`primary` or `replica`) and which answered `repl` (and, in a Cluster,
/// `nodes` with `first_slot` the shard's first slot), can serve the
/// backup, and the replication offset the agent's read must reach (none
/// when the server has no backlog to count one); or why it cannot.
pub(super) fn judge(
    name: &str,
    listed_as: &str,
    repl: &ReplicationInfo,
    shard: Option<(&[ClusterNode], u16)>,
) -> Result<Option<i64>, String> {
    match repl.role {
        Some(Role::Replica) => {
            if repl.link_status != Some(LinkStatus::Up) {
                return Err(format!("{name}'s link to its primary is down"));
            }
            if repl.sync_in_progress == Some(true) {
                return Err(format!(
                    "{name} is still taking a full copy from its primary"
                ));
            }
        }
        Some(Role::Primary) => {
            if shard.is_none() && listed_as != "primary" {
                return Err(format!(
                    "{name} answers as a primary though the status has it a replica: it \
                     restarted or was promoted since the status was written"
                ));
            }
        }
        _ => return Err(format!("{name} did not say its role")),
    }
    if let Some((nodes, slot)) = shard {
        let me = nodes
            .iter()
            .find(|n| n.myself)
            .ok_or_else(|| format!("{name} did not list itself among the cluster's nodes"))?;
        let owner = nodes
            .iter()
            .find(|n| n.primary && n.slots.iter().any(|r| r.contains(slot)))
            .ok_or_else(|| {
                format!("{name} knows of no node owning slot {slot}: it has not joined the cluster")
            })?;
        let serves = if me.primary {
            me.id == owner.id
        } else {
            me.replica_of.as_deref() == Some(owner.id.as_str())
        };
        if !serves {
            return Err(format!(
                "{name} neither owns slot {slot} nor follows the node that does: it restarted \
                 and has not rejoined its shard"
            ));
        }
    }
    if repl.backlog_active != Some(true) {
        return Ok(None);
    }
    repl.applied_offset()
        .map(Some)
        .ok_or_else(|| format!("{name} did not give its replication offset"))
}

impl Pass {
    /// The first of `candidates` (pods of `redis`, best first) its server
    /// confirms can serve ([`judge`]); else why none can, one reason per
    /// candidate. `shard` is the shard's index and slots in a Cluster.
    pub(super) async fn confirm_source(
        &self,
        redis: &Redis,
        candidates: &[String],
        shard: Option<(i32, &str)>,
    ) -> Result<Result<Confirmed, String>, Error> {
        let first_slot = match shard {
            Some((index, slots)) => {
                match cluster::parse_ranges(slots).and_then(|r| r.first().map(|r| r.start)) {
                    Some(s) => Some(s),
                    None => {
                        return Ok(Err(format!(
                            "shard {index}'s slots {slots:?} in the status cannot be read"
                        )));
                    }
                }
            }
            None => None,
        };
        let Some(opts) = self.operator_options(redis).await? else {
            return Ok(Err(format!(
                "the operator's credentials for Redis {} are not readable yet",
                redis.metadata.name.as_deref().unwrap_or_default()
            )));
        };
        let listed = |pod: &str| {
            redis
                .status
                .as_ref()
                .and_then(|s| s.instances.iter().find(|i| i.name == pod))
                .map(|i| i.role.clone())
                .unwrap_or_default()
        };
        let mut why = Vec::new();
        for pod in candidates {
            let host = match self.source_address(redis, pod).await? {
                Ok(host) => host,
                Err(wait) => {
                    why.push(wait);
                    continue;
                }
            };
            let endpoint = Endpoint::new(&host, names::REDIS_PORT);
            let asked = async {
                let mut node = Node::connect(&endpoint, &opts).await?;
                let repl = node.replication().await?;
                let nodes = match first_slot {
                    Some(_) => Some(cluster::nodes(&mut node).await?),
                    None => None,
                };
                Ok::<_, crate::redis::Error>((repl, nodes))
            };
            match asked.await {
                Ok((repl, nodes)) => {
                    let shard = nodes.as_deref().zip(first_slot);
                    match judge(pod, &listed(pod), &repl, shard) {
                        Ok(offset) => {
                            return Ok(Ok(Confirmed {
                                pod: pod.clone(),
                                host,
                                offset,
                            }));
                        }
                        Err(w) => why.push(w),
                    }
                }
                Err(e) => why.push(format!("{pod} did not answer ({})", e.category())),
            }
        }
        Ok(Err(why.join("; ")))
    }

    /// How the operator connects to the instances of `redis`: its own user
    /// and password from the server-auth Secret, and TLS as the spec asks
    /// (the Secret's CA; its certificate presented where clients must
    /// present one). `None` while the Secret has no password entry.
    async fn operator_options(&self, redis: &Redis) -> Result<Option<ConnectOptions>, Error> {
        let children = names::Names::new(&self.b.spec.redis);
        let secrets: Api<Secret> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        self.ctx.metrics.kube("get_secret");
        let Some(data) = secrets
            .get_opt(&children.server_auth())
            .await?
            .and_then(|s| s.data)
        else {
            return Ok(None);
        };
        let Some(password) = data.get(names::PASSWORD_KEY) else {
            return Ok(None);
        };
        let password = String::from_utf8_lossy(&password.0).into_owned();
        let opts =
            ConnectOptions::default().with_timeouts(Duration::from_secs(2), Duration::from_secs(5));
        let opts = if password.is_empty() {
            opts
        } else {
            opts.with_user_or_default(names::OPERATOR_USER, password)
        };
        let Some(name) = layout::secret_of(redis) else {
            return Ok(Some(opts));
        };
        self.ctx.metrics.kube("get_secret");
        let files = secrets.get_opt(&name).await?.and_then(|s| s.data);
        let file = |key: &str| {
            files
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|b| b.0.clone())
                .filter(|b| !b.is_empty())
        };
        let Some(ca) = file(layout::CA_FILE) else {
            return Ok(None);
        };
        let mut t = TlsOptions::servers_of_ca(ca);
        if layout::asks_clients(redis) {
            t.client_cert_pem = file(layout::CERT_FILE);
            t.client_key_pem = file(layout::KEY_FILE);
        }
        Ok(Some(opts.with_tls(t)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::cluster::SlotRange;

    fn replica(link: LinkStatus, syncing: bool) -> ReplicationInfo {
        ReplicationInfo {
            role: Some(Role::Replica),
            link_status: Some(link),
            sync_in_progress: Some(syncing),
            replica_offset: Some(700),
            backlog_active: Some(true),
            ..Default::default()
        }
    }

    fn primary() -> ReplicationInfo {
        ReplicationInfo {
            role: Some(Role::Primary),
            repl_offset: Some(900),
            backlog_active: Some(true),
            ..Default::default()
        }
    }

    fn node(id: &str, myself: bool, of: Option<&str>, slots: &[(u16, u16)]) -> ClusterNode {
        ClusterNode {
            id: id.into(),
            addr: None,
            bus_port: None,
            myself,
            primary: of.is_none(),
            replica_of: of.map(str::to_string),
            fail: false,
            pfail: false,
            handshake: false,
            connected: true,
            config_epoch: 1,
            slots: slots
                .iter()
                .map(|&(start, end)| SlotRange { start, end })
                .collect(),
        }
    }

    #[test]
    fn a_linked_replica_serves_with_its_replication_offset() {
        assert_eq!(
            judge("c-1", "replica", &replica(LinkStatus::Up, false), None),
            Ok(Some(700))
        );
    }

    #[test]
    fn a_replica_down_or_copying_does_not_serve() {
        let down = judge("c-1", "replica", &replica(LinkStatus::Down, false), None);
        assert!(down.unwrap_err().contains("link to its primary is down"));
        let copying = judge("c-1", "replica", &replica(LinkStatus::Up, true), None);
        assert!(copying.unwrap_err().contains("full copy"));
    }

    #[test]
    fn a_listed_replica_answering_as_a_primary_does_not_serve_outside_a_cluster() {
        let why = judge("c-1", "replica", &primary(), None).unwrap_err();
        assert!(why.contains("answers as a primary"), "{why}");
        assert_eq!(judge("c-0", "primary", &primary(), None), Ok(Some(900)));
    }

    #[test]
    fn in_a_cluster_the_source_owns_the_first_slot_or_follows_its_owner() {
        let owner = node("p0", true, None, &[(0, 5460)]);
        let other = node("p1", false, None, &[(5461, 16383)]);
        let nodes = [owner.clone(), other.clone()];
        assert_eq!(
            judge("s0-0", "primary", &primary(), Some((&nodes, 0))),
            Ok(Some(900))
        );
        // A replica of the owner.
        let me = node("r0", true, Some("p0"), &[]);
        let nodes = [node("p0", false, None, &[(0, 5460)]), me, other.clone()];
        assert_eq!(
            judge(
                "s0-1",
                "replica",
                &replica(LinkStatus::Up, false),
                Some((&nodes, 0))
            ),
            Ok(Some(700))
        );
        // A replica of another shard's primary.
        let me = node("r0", true, Some("p1"), &[]);
        let nodes = [node("p0", false, None, &[(0, 5460)]), me, other.clone()];
        let why = judge(
            "s0-1",
            "replica",
            &replica(LinkStatus::Up, false),
            Some((&nodes, 0)),
        );
        assert!(why.unwrap_err().contains("nor follows"));
    }

    #[test]
    fn a_server_restarted_empty_in_a_cluster_does_not_serve() {
        // Restarted without its nodes file: a primary of nothing, alone,
        // though the status still lists it a linked replica.
        let alone = [node("fresh", true, None, &[])];
        let why = judge("s0-1", "replica", &primary(), Some((&alone, 0))).unwrap_err();
        assert!(why.contains("has not joined"), "{why}");
        // Met again but not yet a replica: a primary owning nothing.
        let met = [
            node("fresh", true, None, &[]),
            node("p0", false, None, &[(0, 5460)]),
        ];
        let why = judge("s0-1", "replica", &primary(), Some((&met, 0))).unwrap_err();
        assert!(why.contains("has not rejoined"), "{why}");
    }

    #[test]
    fn a_server_without_an_offset_does_not_serve() {
        let mut r = primary();
        r.repl_offset = None;
        assert!(judge("c-0", "primary", &r, None).is_err());
    }

    #[test]
    fn a_server_without_a_backlog_serves_without_an_id_to_check() {
        // It counts no offset until the agent's read starts its backlog.
        let mut r = primary();
        r.backlog_active = Some(false);
        assert_eq!(judge("c-0", "primary", &r, None), Ok(None));
    }
}
