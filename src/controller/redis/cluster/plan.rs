//! Pure decisions of Cluster mode: from what every node says of the
//! cluster (`CLUSTER NODES`, `CLUSTER INFO`) and which pod it runs in, the
//! next steps (meet, assign slots, attach replicas, forget stale nodes),
//! each shard's primary and replicas, and what is wrong. Table-tested; the
//! steps run in [`super`].
//!
//! Rules that keep data safe:
//! - Slots are only ever given when nobody owns them: a node that failed
//!   keeps its slots until a replica of its shard takes them over, so an
//!   empty node that replaced it never gets them back (the Cluster-mode
//!   counterpart of the Replication boot rule).
//! - A node that claims slots the cluster does not know is never met into
//!   it (two clusters would merge); it is reported.
//! - A node ID is forgotten only once every pod of the Redis answers and
//!   none runs it, and never while it owns slots or a node follows it.

use std::collections::{BTreeMap, BTreeSet};

use super::model::{Electing, Member, Plan, Shard, Step, View};

use crate::redis::cluster::{SLOTS, SlotRange, spread};

pub use crate::redis::cluster::ranges;

/// Ranges as text: `0-5460,5462`.
pub fn show(ranges: &[SlotRange]) -> String {
    ranges
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Who owns each slot: of every claim the nodes of the cluster report, the
/// one with the highest configuration epoch (how the cluster itself
/// settles a conflict).
fn owners<'a>(views: impl Iterator<Item = &'a View>) -> Vec<Option<(u64, String)>> {
    let mut owner: Vec<Option<(u64, String)>> = vec![None; usize::from(SLOTS)];
    for view in views {
        for n in view.nodes.iter().filter(|n| n.primary) {
            for r in &n.slots {
                for s in r.start..=r.end {
                    let cur = &mut owner[usize::from(s)];
                    if cur.as_ref().is_none_or(|(e, _)| n.config_epoch > *e) {
                        *cur = Some((n.config_epoch, n.id.clone()));
                    }
                }
            }
        }
    }
    owner
}

/// Decides the next steps for `shards` shards of `instances` instances.
pub fn decide(members: &[Member], shards: i32, instances: i32) -> Plan {
    decide_restoring(members, shards, instances, false)
}

/// [`decide`] for a Cluster Redis that may be restoring from a backup
/// (`restoring`): the first instance of each shard loaded the shard's file
/// and, holding keys of slots nobody owned, claimed those slots at start.
/// Such a node is met although the cluster does not know its slots, as
/// long as they all lie in its own shard's range; and the slots of a shard
/// go only to its first instance, never to an empty node of the shard.
pub fn decide_restoring(members: &[Member], shards: i32, instances: i32, restoring: bool) -> Plan {
    decide_shape(
        members,
        &Shape {
            shards,
            instances,
            restoring,
            recorded: Vec::new(),
            homes: Vec::new(),
        },
    )
}

/// What the plan is asked for.
#[derive(Debug, Clone, Default)]
pub struct Shape {
    /// `spec.shards`. Pods of shards past it (being emptied by a
    /// resharding, then removed) are planned as shards too.
    pub shards: i32,
    /// `spec.instances`.
    pub instances: i32,
    /// Restoring from a backup (see [`decide_restoring`]).
    pub restoring: bool,
    /// The slots each shard served when the status was last written: a
    /// lost primary's slots are its shard's by this record (after a
    /// resharding a shard's slots are not its home range), and by the home
    /// range only when nothing is recorded.
    pub recorded: Vec<Vec<SlotRange>>,
    /// Each shard's home slots: the slots nobody owns go to their home
    /// shard, and a restored node may claim only slots of its home. Empty:
    /// the even spread over `shards`. A restore from a backup taken after
    /// a resharding gives the backed-up layout here.
    pub homes: Vec<Vec<SlotRange>>,
}

/// [`decide`] with every input named.
pub fn decide_shape(members: &[Member], shape: &Shape) -> Plan {
    let (shards, instances, restoring) = (shape.shards, shape.instances, shape.restoring);
    // Shards being emptied after `spec.shards` went down still have pods.
    let width = members
        .iter()
        .map(|m| m.shard + 1)
        .max()
        .unwrap_or(0)
        .max(shards);
    let mut plan = Plan::default();
    let live: Vec<&Member> = members.iter().filter(|m| m.live()).collect();
    let by_id: BTreeMap<&str, &Member> = live.iter().filter_map(|m| Some((m.id()?, *m))).collect();

    // The anchor: the node that knows the most of the cluster.
    let anchor = live.iter().copied().max_by_key(|m| {
        let v = m.view.as_ref();
        let known = v.map_or(0, |v| v.nodes.iter().filter(|n| !n.handshake).count());
        let owns = m.me().is_some_and(|n| !n.slots.is_empty());
        (known, owns, -m.shard, -m.ordinal)
    });
    let Some(anchor) = anchor else {
        plan.waiting
            .push("waiting for the nodes to answer".to_string());
        plan.shards = (0..width)
            .map(|i| {
                let s = Shard {
                    index: i,
                    ..Default::default()
                };
                shard_counts(members, i, s)
            })
            .collect();
        return plan;
    };
    let anchor_view = anchor.view.as_ref();
    // The cluster: the anchor and the nodes it knows. A node outside it
    // does not decide who owns a slot.
    let inside = |m: &Member| {
        m.pod == anchor.pod
            || m.id()
                .is_some_and(|id| anchor_view.is_some_and(|v| v.knows(id)))
    };
    let owner = owners(
        live.iter()
            .copied()
            .filter(|m| inside(m))
            .filter_map(|m| m.view.as_ref()),
    );
    // Each owner's slots, gathered once (ascending).
    let mut owned: BTreeMap<&str, Vec<u16>> = BTreeMap::new();
    for (s, o) in (0..SLOTS).zip(&owner) {
        if let Some((_, id)) = o {
            owned.entry(id.as_str()).or_default().push(s);
        }
    }
    let owned_by = |id: &str| -> &[u16] { owned.get(id).map_or(&[], Vec::as_slice) };

    let want: Vec<Vec<SlotRange>> = if shape.homes.is_empty() {
        spread(u16::try_from(shards.max(0)).unwrap_or(0))
            .into_iter()
            .map(|r| vec![r])
            .collect()
    } else {
        shape.homes.clone()
    };
    let in_home = |home: &[SlotRange], s: u16| home.iter().any(|r| r.contains(s));

    // 1. Meet every node the anchor does not know.
    for m in &live {
        let (Some(id), Some(ip)) = (m.id(), m.ip.as_deref()) else {
            continue;
        };
        if m.pod == anchor.pod {
            continue;
        }
        // Known, but at an address its pod no longer has (every pod of a
        // Redis woken from hibernation has a new IP, and the nodes cannot
        // reach one another): met again at the new one, which the cluster
        // takes as the node's address.
        let known_at = anchor_view.and_then(|v| {
            v.nodes
                .iter()
                .find(|n| n.id == id && !n.handshake)
                .map(|n| n.addr.as_ref().map(|a| a.host().to_string()))
        });
        if let Some(at) = known_at
            && at.as_deref() == Some(ip)
        {
            continue;
        }
        if anchor_view.is_some_and(|v| v.joining(ip)) {
            plan.waiting
                .push(format!("{} is joining the cluster", m.pod));
            continue;
        }
        // Slots it claims that the cluster does not hold at a higher
        // epoch: met, it would take them (or two clusters would merge).
        let foreign: Vec<u16> = m
            .me()
            .map(|n| {
                n.slots
                    .iter()
                    .flat_map(|r| r.start..=r.end)
                    .filter(|s| {
                        owner[usize::from(*s)]
                            .as_ref()
                            .is_none_or(|(e, o)| o != id && *e <= n.config_epoch)
                    })
                    .collect()
            })
            .unwrap_or_default();
        let restored = restoring
            && m.ordinal == 0
            && usize::try_from(m.shard)
                .ok()
                .and_then(|i| want.get(i))
                .is_some_and(|home| foreign.iter().all(|s| in_home(home, *s)));
        if !foreign.is_empty() && !restored {
            plan.problems.push(format!(
                "{} serves slots {} that the cluster of {} does not know: it is not joined \
                 (two clusters would merge)",
                m.pod,
                show(&ranges(foreign)),
                anchor.pod
            ));
            continue;
        }
        plan.steps.push(Step::Meet {
            from: anchor.pod.clone(),
            to: m.pod.clone(),
            ip: ip.to_string(),
        });
    }

    // Nodes that own slots and that no pod runs, by shard: the shard of a
    // pod following it, else the shard whose recorded slots hold its
    // slots, else the home range's shard.
    let mut lost_by_shard: BTreeMap<i32, BTreeSet<&str>> = BTreeMap::new();
    for (&id, slots) in &owned {
        if by_id.contains_key(id) {
            continue;
        }
        let follower = live
            .iter()
            .find(|m| m.me().and_then(|n| n.replica_of.as_deref()) == Some(id))
            .map(|m| m.shard);
        let first = slots.first().copied().unwrap_or(0);
        let recorded = shape
            .recorded
            .iter()
            .position(|r| r.iter().any(|r| r.contains(first)))
            .and_then(|i| i32::try_from(i).ok());
        let home = want
            .iter()
            .position(|home| in_home(home, first))
            .and_then(|i| i32::try_from(i).ok());
        if let Some(shard) = follower.or(recorded).or(home) {
            lost_by_shard.entry(shard).or_default().insert(id);
        }
    }

    // 2. Each shard's primary: the node of its pods that owns slots; for a
    // shard that owns none and lost none (new, or emptied by a resharding),
    // the pod its other pods follow, else its lowest-ordinal pod, while that
    // is a primary following nobody.
    for i in 0..width {
        let mut shard = Shard {
            index: i,
            ..Default::default()
        };
        let owning: Vec<&Member> = live
            .iter()
            .copied()
            .filter(|m| m.shard == i)
            .filter(|m| m.id().is_some_and(|id| !owned_by(id).is_empty()))
            .collect();
        if owning.len() > 1 {
            let pods: Vec<&str> = owning.iter().map(|m| m.pod.as_str()).collect();
            plan.problems.push(format!(
                "shard {i}: {} all serve slots; a shard has one primary",
                pods.join(", ")
            ));
        }
        if let Some(p) = owning.first()
            && let Some(id) = p.id()
        {
            shard.primary = Some(p.pod.clone());
            shard.primary_id = Some(id.to_string());
            shard.slots = ranges(owned_by(id).iter().copied());
        }
        if shard.primary.is_none() && !lost_by_shard.contains_key(&i) {
            // The pod the shard's others follow (a shard emptied after a
            // failover), else the lowest-ordinal pod.
            let followed = |m: &Member| {
                m.id().is_some_and(|id| {
                    live.iter().any(|o| {
                        o.shard == i && o.me().and_then(|n| n.replica_of.as_deref()) == Some(id)
                    })
                })
            };
            let first = live
                .iter()
                .copied()
                .filter(|m| m.shard == i)
                .min_by_key(|m| (!followed(m), m.ordinal));
            if let Some(m) = first
                && (!restoring || m.ordinal == 0)
                && m.me()
                    .is_some_and(|n| n.primary && n.slots.is_empty() && n.replica_of.is_none())
                && let Some(id) = m.id()
                && (m.pod == anchor.pod || anchor_view.is_some_and(|v| v.knows(id)))
            {
                shard.primary = Some(m.pod.clone());
                shard.primary_id = Some(id.to_string());
            }
        }
        plan.shards.push(shard_counts(members, i, shard));
    }

    // 3. Slots nobody owns go to their shard: to its primary, or on a new
    // cluster to the shard's first empty node the anchor knows.
    let fresh = owner.iter().all(Option::is_none);
    for (i, home) in want.iter().enumerate() {
        let Some(shard) = plan.shards.get(i) else {
            continue;
        };
        let home_slots = || home.iter().flat_map(|r| r.start..=r.end);
        let unowned: Vec<u16> = home_slots()
            .filter(|s| owner[usize::from(*s)].is_none())
            .collect();
        if unowned.is_empty() {
            continue;
        }
        let target = match &shard.primary {
            Some(p) => Some(p.clone()),
            None if fresh || home_slots().all(|s| owner[usize::from(s)].is_none()) => live
                .iter()
                .filter(|m| m.shard == shard.index && (!restoring || m.ordinal == 0))
                .filter(|m| {
                    m.me().is_some_and(|n| n.primary && n.slots.is_empty())
                        && m.id().is_some_and(|id| {
                            m.pod == anchor.pod || anchor_view.is_some_and(|v| v.knows(id))
                        })
                })
                .min_by_key(|m| m.ordinal)
                .map(|m| m.pod.clone()),
            None => None,
        };
        match target {
            Some(pod) => plan.steps.push(Step::AddSlots {
                pod,
                ranges: ranges(unowned),
            }),
            None => plan.waiting.push(format!(
                "shard {}: slots {} wait for a node of the shard to join",
                shard.index,
                show(&ranges(unowned))
            )),
        }
    }

    // 4. Replicas follow their shard's primary.
    for m in &live {
        let Some(me) = m.me() else { continue };
        let Some(shard) = plan
            .shards
            .get(usize::try_from(m.shard).unwrap_or(usize::MAX))
        else {
            plan.problems.push(format!(
                "{} belongs to shard {}, beyond spec.shards",
                m.pod, m.shard
            ));
            continue;
        };
        let (Some(primary), Some(primary_id)) = (&shard.primary, &shard.primary_id) else {
            continue;
        };
        if primary == &m.pod {
            continue;
        }
        if me.replica_of.as_deref() == Some(primary_id.as_str()) {
            // Following the right node at an address it no longer has: a
            // primary made anew on another address (its volume kept) is
            // learned by gossip, but the engines keep the replication link
            // on the address the replica started with, down for good
            // (chaos seed 306). `CLUSTER REPLICATE` again points the link
            // at the address the replica's own view now has.
            let known = m.view.as_ref().and_then(|v| {
                v.nodes
                    .iter()
                    .find(|n| n.id == *primary_id)
                    .and_then(|n| n.addr.as_ref().map(|a| a.host().to_string()))
            });
            if m.link_up == Some(false)
                && let (Some(at), Some(known)) = (&m.following, known)
                && *at != known
            {
                plan.steps.push(Step::Replicate {
                    pod: m.pod.clone(),
                    primary: primary.clone(),
                    primary_id: primary_id.clone(),
                });
            }
            continue;
        }
        let follows_lost_owner = me
            .replica_of
            .as_deref()
            .is_some_and(|o| !by_id.contains_key(o) && !owned_by(o).is_empty());
        if follows_lost_owner {
            plan.waiting.push(format!(
                "{}: its primary failed; the cluster is electing a replica",
                m.pod
            ));
            continue;
        }
        if me.primary && !me.slots.is_empty() {
            continue; // reported above: two primaries in one shard
        }
        if !m.view.as_ref().is_some_and(|v| v.knows(primary_id)) {
            // Gossip usually tells it within a second. A node that neither
            // knows its primary nor is joining it is introduced directly
            // (a MEET of a node it already knows is harmless), so a lost
            // handshake does not leave the replica waiting for ever.
            let primary_ip = live
                .iter()
                .find(|p| &p.pod == primary)
                .and_then(|p| p.ip.clone());
            let joining = |ip: &str| m.view.as_ref().is_some_and(|v| v.joining(ip));
            // Only a node the cluster already holds (one the anchor does
            // not know yet is met by the anchor above).
            match primary_ip {
                Some(ip) if inside(m) && !joining(&ip) => plan.steps.push(Step::Meet {
                    from: m.pod.clone(),
                    to: primary.clone(),
                    ip,
                }),
                _ => plan.waiting.push(format!(
                    "{} has not yet learned of its shard's primary {primary}",
                    m.pod
                )),
            }
            continue;
        }
        plan.steps.push(Step::Replicate {
            pod: m.pod.clone(),
            primary: primary.clone(),
            primary_id: primary_id.clone(),
        });
    }

    // 5. Shards that lost their primary.
    for shard in &plan.shards {
        if shard.primary.is_some() {
            continue;
        }
        let Some(lost) = lost_by_shard.get(&shard.index) else {
            continue;
        };
        let slots = ranges(lost.iter().flat_map(|id| owned_by(id).iter().copied()));
        let electing = live.iter().any(|m| {
            m.shard == shard.index
                && m.me()
                    .and_then(|n| n.replica_of.as_deref())
                    .is_some_and(|o| lost.contains(o))
        });
        if electing {
            plan.waiting.push(format!(
                "shard {}: its primary is gone; a replica is taking over slots {}",
                shard.index,
                show(&slots)
            ));
            // The lost primary is gone for good only when every pod of the
            // shard is there and answers (none as it): a pod that does not
            // answer may be it, restarting with its data (the boot rule
            // holds it up to 30 s), and would then follow whoever was
            // promoted and drop what it holds.
            let of_shard: Vec<&Member> =
                members.iter().filter(|m| m.shard == shard.index).collect();
            let gone = of_shard.len() == usize::try_from(instances).unwrap_or(0)
                && of_shard.iter().all(|m| m.live());
            let candidates = of_shard
                .iter()
                .filter(|_| gone)
                .filter(|m| {
                    let follows = m.me().and_then(|n| n.replica_of.as_deref());
                    follows.is_some_and(|o| {
                        lost.contains(o)
                            && m.view
                                .as_ref()
                                .is_some_and(|v| v.nodes.iter().any(|n| n.id == o && n.fail))
                    })
                })
                .map(|m| m.pod.clone())
                .collect();
            plan.electing.push(Electing {
                shard: shard.index,
                candidates,
            });
        } else {
            plan.problems.push(format!(
                "shard {}: no primary and no replica to take over; slots {} are not served",
                shard.index,
                show(&slots)
            ));
        }
    }

    // 6. Stale node IDs, once every pod answers.
    let total = usize::try_from(width * instances).unwrap_or(0);
    let all_answer = live.len() == total && members.len() == total;
    if all_answer {
        // A node in a handshake shows a made-up ID until the handshake
        // completes: forgetting it would break the join under way.
        let known: BTreeSet<&str> = live
            .iter()
            .filter_map(|m| m.view.as_ref())
            .flat_map(|v| v.nodes.iter().filter(|n| !n.handshake))
            .map(|n| n.id.as_str())
            .collect();
        for id in known {
            if by_id.contains_key(id) || !owned_by(id).is_empty() {
                continue;
            }
            let followed = live
                .iter()
                .any(|m| m.me().and_then(|n| n.replica_of.as_deref()) == Some(id));
            if followed {
                continue;
            }
            plan.steps.push(Step::Forget { id: id.to_string() });
        }
    }

    // Healthy: nothing to do and every node agrees.
    let infos_ok = live.iter().all(|m| {
        m.view
            .as_ref()
            .is_some_and(|v| v.info.ok && v.info.slots_ok == u32::from(SLOTS))
    });
    let shards_whole = plan.shards.iter().all(|s| {
        s.primary.is_some() && s.replicas.len() == usize::try_from(instances - 1).unwrap_or(0)
    });
    plan.whole = all_answer && plan.steps.is_empty() && plan.problems.is_empty() && shards_whole;
    plan.healthy = plan.whole && infos_ok;
    // Not healthy, and nothing above says why: the checks that failed are
    // named, so a pause or a Ready=False always explains itself.
    if !plan.healthy && plan.steps.is_empty() && plan.problems.is_empty() && plan.waiting.is_empty()
    {
        plan.waiting = unsettled(members, &plan.shards, total, instances);
    }
    plan
}

/// Why a cluster with no step to take and no problem is not yet healthy:
/// pods that do not answer, nodes that do not see every slot served, shards
/// short of a primary or of replicas.
fn unsettled(members: &[Member], shards: &[Shard], total: usize, instances: i32) -> Vec<String> {
    let mut why = Vec::new();
    if members.len() != total {
        why.push(format!("{} of {total} pods exist", members.len()));
    }
    for m in members {
        if m.terminating {
            why.push(format!("{} is being deleted", m.pod));
        } else if !m.live() {
            why.push(format!("{} does not answer as a cluster node", m.pod));
        }
    }
    for m in members.iter().filter(|m| m.live()) {
        let Some(v) = &m.view else { continue };
        let i = &v.info;
        if !i.ok || i.slots_ok != u32::from(SLOTS) {
            why.push(format!(
                "{} sees the cluster {}: {} of {SLOTS} slots ok ({} assigned, {} possibly \
                 failing, {} failing)",
                m.pod,
                if i.ok { "ok" } else { "failing" },
                i.slots_ok,
                i.slots_assigned,
                i.slots_pfail,
                i.slots_fail
            ));
        }
    }
    let want = usize::try_from(instances - 1).unwrap_or(0);
    for s in shards {
        let Some(primary) = &s.primary else {
            why.push(format!("shard {} has no primary", s.index));
            continue;
        };
        if s.replicas.len() == want {
            continue;
        }
        let others: Vec<String> = members
            .iter()
            .filter(|m| m.shard == s.index && &m.pod != primary && !s.replicas.contains(&m.pod))
            .map(|m| match m.me() {
                Some(n) => match n.replica_of.as_deref() {
                    Some(o) => format!("{} follows node {}", m.pod, short(o)),
                    None => format!("{} is a primary", m.pod),
                },
                None => format!("{} does not answer", m.pod),
            })
            .collect();
        why.push(format!(
            "shard {}: {} of {want} replica(s) follow {primary}{}",
            s.index,
            s.replicas.len(),
            if others.is_empty() {
                String::new()
            } else {
                format!(" ({})", others.join(", "))
            }
        ));
    }
    if why.is_empty() {
        why.push("the cluster is still being formed".into());
    }
    why
}

/// The first 8 characters of a node ID (as `CLUSTER NODES` readers show it).
fn short(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

/// Fills in a shard's pod counts and replicas (pods following its primary).
fn shard_counts(members: &[Member], index: i32, mut shard: Shard) -> Shard {
    let pods: Vec<&Member> = members.iter().filter(|m| m.shard == index).collect();
    shard.pods = pods.len();
    shard.ready = pods.iter().filter(|m| m.ready).count();
    if let Some(pid) = &shard.primary_id {
        shard.replicas = pods
            .iter()
            .filter(|m| m.live())
            .filter(|m| m.me().and_then(|n| n.replica_of.as_deref()) == Some(pid.as_str()))
            .map(|m| m.pod.clone())
            .collect();
    }
    shard
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::cluster::ClusterInfo;
    use crate::redis::cluster::parse_nodes;

    const IDS: [&str; 6] = [
        "a000000000000000000000000000000000000000",
        "b000000000000000000000000000000000000000",
        "c000000000000000000000000000000000000000",
        "d000000000000000000000000000000000000000",
        "e000000000000000000000000000000000000000",
        "f000000000000000000000000000000000000000",
    ];

    /// A node line: `id ip flags master epoch slots`.
    fn line(id: &str, ip: &str, flags: &str, master: &str, epoch: u64, slots: &str) -> String {
        format!("{id} {ip}:6379@16379 {flags} {master} 0 0 {epoch} connected {slots}")
    }

    /// Pod `s<shard>-<ord>` with node `id` at `10.0.<shard>.<ord>`, whose
    /// view is `lines` (its own line gets `myself`).
    fn member(shard: i32, ord: i32, id: &str, lines: &[String], ok: bool) -> Member {
        let text: Vec<String> = lines
            .iter()
            .map(|l| {
                if l.starts_with(id) {
                    l.replacen(" master", " myself,master", 1).replacen(
                        " slave",
                        " myself,slave",
                        1,
                    )
                } else {
                    l.clone()
                }
            })
            .collect();
        let nodes = parse_nodes(&text.join("\n")).unwrap_or_else(|e| panic!("{e}"));
        Member {
            pod: format!("r-s{shard}-{ord}"),
            shard,
            ordinal: ord,
            ip: Some(ip(shard, ord)),
            ready: true,
            terminating: false,
            view: Some(View {
                nodes,
                info: ClusterInfo {
                    ok,
                    slots_ok: if ok { 16384 } else { 0 },
                    ..Default::default()
                },
                open: crate::redis::reshard::open_slots(&text.join("\n")),
            }),
            ..Default::default()
        }
    }

    /// A handshake under way with the node at `ip` (a made-up ID).
    fn handshake_line(ip: &str) -> String {
        format!(
            "9999999999999999999999999999999999999999 {ip}:6379@16379 handshake - 0 0 0 disconnected"
        )
    }

    fn ip(shard: i32, ord: i32) -> String {
        format!("10.0.{shard}.{ord}")
    }

    /// Six fresh nodes, 3 shards x 2, each knowing only itself.
    fn fresh() -> Vec<Member> {
        (0..6)
            .map(|k| {
                let (s, o) = (k / 2, k % 2);
                let l = line(IDS[k as usize], &ip(s, o), "master", "-", 0, "");
                member(s, o, IDS[k as usize], &[l], false)
            })
            .collect()
    }

    /// The full table of a formed 3 x 2 cluster: shard i's primary is pod
    /// s<i>-0 (id IDS[2i]) and its replica s<i>-1 (IDS[2i+1]).
    fn formed_lines() -> Vec<String> {
        let r = spread(3);
        let mut out = Vec::new();
        for s in 0..3 {
            let (p, q) = (IDS[2 * s], IDS[2 * s + 1]);
            out.push(line(
                p,
                &ip(s as i32, 0),
                "master",
                "-",
                s as u64 + 1,
                &r[s].to_string(),
            ));
            out.push(line(q, &ip(s as i32, 1), "slave", p, s as u64 + 1, ""));
        }
        out
    }

    fn formed() -> Vec<Member> {
        let lines = formed_lines();
        (0..6)
            .map(|k| member(k / 2, k % 2, IDS[k as usize], &lines, true))
            .collect()
    }

    #[test]
    fn fresh_nodes_are_met_before_anything_else() {
        let plan = decide(&fresh(), 3, 2);
        let meets: Vec<&Step> = plan
            .steps
            .iter()
            .filter(|s| matches!(s, Step::Meet { .. }))
            .collect();
        assert_eq!(meets.len(), 5, "{:?}", plan.steps);
        assert!(
            meets
                .iter()
                .all(|s| matches!(s, Step::Meet { from, .. } if from == "r-s0-0"))
        );
        // The anchor knows only itself: only its own shard gets slots now.
        let adds: Vec<&Step> = plan
            .steps
            .iter()
            .filter(|s| matches!(s, Step::AddSlots { .. }))
            .collect();
        assert_eq!(
            adds,
            vec![&Step::AddSlots {
                pod: "r-s0-0".into(),
                ranges: vec![spread(3)[0]],
            }]
        );
        assert!(!plan.healthy);
    }

    /// The line of a restored first instance of shard `s`: it claimed the
    /// slots it holds keys of (a few at the start of its range), epoch 0.
    fn restored_line(s: i32) -> String {
        let r = spread(3)[s as usize];
        let held = format!("{}-{}", r.start + 1, r.start + 5);
        line(IDS[2 * s as usize], &ip(s, 0), "master", "-", 0, &held)
    }

    #[test]
    fn restored_first_instances_are_met_and_given_the_rest_of_their_shard() {
        // Fresh: each restored node knows itself and owns the slots it has
        // keys of; the others are empty.
        let fresh: Vec<Member> = (0..6)
            .map(|k| {
                let (s, o) = (k / 2, k % 2);
                let l = if o == 0 {
                    restored_line(s)
                } else {
                    line(IDS[k as usize], &ip(s, o), "master", "-", 0, "")
                };
                member(s, o, IDS[k as usize], &[l], false)
            })
            .collect();
        // Not restoring, the other restored nodes are refused: their slots
        // are unknown to the anchor's cluster.
        let plain = decide(&fresh, 3, 2);
        assert_eq!(plain.problems.len(), 2, "{:?}", plain.problems);
        let plan = decide_restoring(&fresh, 3, 2, true);
        assert!(plan.problems.is_empty(), "{:?}", plan.problems);
        let meets = plan
            .steps
            .iter()
            .filter(|s| matches!(s, Step::Meet { from, .. } if from == "r-s0-0"))
            .count();
        assert_eq!(meets, 5, "{:?}", plan.steps);
        let r0 = spread(3)[0];
        assert!(
            plan.steps.contains(&Step::AddSlots {
                pod: "r-s0-0".into(),
                ranges: vec![
                    SlotRange {
                        start: r0.start,
                        end: r0.start
                    },
                    SlotRange {
                        start: r0.start + 6,
                        end: r0.end
                    },
                ],
            }),
            "{:?}",
            plan.steps
        );

        // s1-1 (empty) is known but s1-0 (restored) not yet: shard 1's
        // slots wait for s1-0 instead of going to the empty node.
        let mut lines: Vec<String> = vec![restored_line(0), restored_line(2)];
        lines.push(line(IDS[1], &ip(0, 1), "master", "-", 0, ""));
        lines.push(line(IDS[3], &ip(1, 1), "master", "-", 0, ""));
        lines.push(line(IDS[5], &ip(2, 1), "master", "-", 0, ""));
        let mut members: Vec<Member> = [(0, 0, 0), (0, 1, 1), (1, 1, 3), (2, 0, 4), (2, 1, 5)]
            .iter()
            .map(|&(s, o, k)| member(s, o, IDS[k], &lines, false))
            .collect();
        members.push(member(1, 0, IDS[2], &[restored_line(1)], false));
        let plan = decide_restoring(&members, 3, 2, true);
        assert!(
            !plan
                .steps
                .iter()
                .any(|s| matches!(s, Step::AddSlots { pod, .. } if pod == "r-s1-1")),
            "{:?}",
            plan.steps
        );
        assert!(plan.steps.contains(&Step::Meet {
            from: "r-s0-0".into(),
            to: "r-s1-0".into(),
            ip: ip(1, 0),
        }));
        // Without a restore, an empty node of a shard nobody serves takes
        // its slots (a new cluster).
        let plain = decide(&members, 3, 2);
        assert!(
            plain
                .steps
                .iter()
                .any(|s| matches!(s, Step::AddSlots { pod, .. } if pod == "r-s1-1")),
            "{:?}",
            plain.steps
        );
    }

    #[test]
    fn nodes_known_at_an_old_address_are_met_at_their_new_one() {
        // Woken from hibernation: every node knows the whole cluster from
        // its nodes.conf, at the addresses of before; the pods have new ones.
        let old_lines = formed_lines();
        let members: Vec<Member> = (0..6)
            .map(|k| {
                let (s, o) = (k / 2, k % 2);
                let mut m = member(s, o, IDS[k as usize], &old_lines, false);
                m.ip = Some(format!("10.1.{s}.{o}"));
                if let Some(v) = m.view.as_mut()
                    && let Some(me) = v.nodes.iter_mut().find(|n| n.myself)
                {
                    me.addr = Some(crate::redis::Endpoint::new(format!("10.1.{s}.{o}"), 6379));
                }
                m
            })
            .collect();
        let plan = decide(&members, 3, 2);
        assert!(plan.problems.is_empty(), "{:?}", plan.problems);
        let met: Vec<(&str, &str)> = plan
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Meet { to, ip, .. } => Some((to.as_str(), ip.as_str())),
                _ => None,
            })
            .collect();
        assert_eq!(met.len(), 5, "{:?}", plan.steps);
        assert!(met.contains(&("r-s2-1", "10.1.2.1")), "{met:?}");
        // Nothing else moves: every shard keeps its primary and slots.
        assert!(
            plan.steps.iter().all(|s| matches!(s, Step::Meet { .. })),
            "{:?}",
            plan.steps
        );
        // Once met, at the right addresses, nothing is left to do.
        assert!(decide(&formed(), 3, 2).steps.is_empty());
    }

    #[test]
    fn met_nodes_get_even_slots_on_ordinal_zero_and_replicas_follow_at_once() {
        // Everyone knows everyone, nobody owns slots.
        let lines: Vec<String> = (0..6)
            .map(|k| line(IDS[k as usize], &ip(k / 2, k % 2), "master", "-", 0, ""))
            .collect();
        let members: Vec<Member> = (0..6)
            .map(|k| member(k / 2, k % 2, IDS[k as usize], &lines, false))
            .collect();
        let plan = decide(&members, 3, 2);
        let r = spread(3);
        // Ordinal 0 of each shard is its primary before it owns a slot, so
        // ordinal 1 follows it in the same pass.
        let slots = (0..3).map(|s| Step::AddSlots {
            pod: format!("r-s{s}-0"),
            ranges: vec![r[s as usize]],
        });
        let follow = (0..3).map(|s| Step::Replicate {
            pod: format!("r-s{s}-1"),
            primary: format!("r-s{s}-0"),
            primary_id: IDS[2 * s].into(),
        });
        assert_eq!(plan.steps, slots.chain(follow).collect::<Vec<_>>());
        assert_eq!(
            plan.shards
                .iter()
                .map(|s| s.primary.as_deref())
                .collect::<Vec<_>>(),
            [Some("r-s0-0"), Some("r-s1-0"), Some("r-s2-0")]
        );
    }

    #[test]
    fn empty_nodes_follow_their_shard_primary() {
        let mut lines = formed_lines();
        // s1-1 is still an empty primary.
        lines[3] = line(IDS[3], &ip(1, 1), "master", "-", 0, "");
        let members: Vec<Member> = (0..6)
            .map(|k| member(k / 2, k % 2, IDS[k as usize], &lines, true))
            .collect();
        let plan = decide(&members, 3, 2);
        assert_eq!(
            plan.steps,
            vec![Step::Replicate {
                pod: "r-s1-1".into(),
                primary: "r-s1-0".into(),
                primary_id: IDS[2].into(),
            }]
        );
        assert!(!plan.healthy);
    }

    #[test]
    fn a_formed_cluster_needs_nothing() {
        let plan = decide(&formed(), 3, 2);
        assert!(plan.steps.is_empty(), "{:?}", plan.steps);
        assert!(plan.problems.is_empty(), "{:?}", plan.problems);
        assert!(plan.healthy);
        assert_eq!(plan.shards[1].primary.as_deref(), Some("r-s1-0"));
        assert_eq!(plan.shards[1].replicas, vec!["r-s1-1".to_string()]);
        assert_eq!(show(&plan.shards[2].slots), "10923-16383");
    }

    #[test]
    fn a_handshake_under_way_is_never_forgotten() {
        // s1-1 is joining a node at 10.0.9.9 (gossip started it): the
        // entry carries a made-up ID until the handshake completes.
        let temp = "9999999999999999999999999999999999999999";
        let mut members = formed();
        let mut lines = formed_lines();
        lines.push(handshake_line("10.0.9.9"));
        members[3] = member(1, 1, IDS[3], &lines, true);
        let plan = decide(&members, 3, 2);
        assert!(
            !plan
                .steps
                .iter()
                .any(|s| matches!(s, Step::Forget { id } if id == temp)),
            "{:?}",
            plan.steps
        );
    }

    #[test]
    fn a_replica_that_does_not_know_its_primary_is_introduced_to_it() {
        // s2-1 is an empty primary that knows every node but s2-0 (its
        // shard's primary), and is not joining it.
        let mut lines = formed_lines();
        lines[5] = line(IDS[5], &ip(2, 1), "master", "-", 0, "");
        let without: Vec<String> = lines
            .iter()
            .filter(|l| !l.starts_with(IDS[4]))
            .cloned()
            .collect();
        let mut members: Vec<Member> = (0..6)
            .map(|k| member(k / 2, k % 2, IDS[k as usize], &lines, true))
            .collect();
        members[5] = member(2, 1, IDS[5], &without, true);
        let plan = decide(&members, 3, 2);
        assert_eq!(
            plan.steps,
            vec![Step::Meet {
                from: "r-s2-1".into(),
                to: "r-s2-0".into(),
                ip: ip(2, 0),
            }]
        );

        // Joining it already: it waits for the handshake.
        let mut joining = without.clone();
        joining.push(handshake_line(&ip(2, 0)));
        members[5] = member(2, 1, IDS[5], &joining, true);
        let plan = decide(&members, 3, 2);
        assert!(plan.steps.is_empty(), "{:?}", plan.steps);
        assert_eq!(
            plan.waiting,
            vec!["r-s2-1 has not yet learned of its shard's primary r-s2-0".to_string()]
        );
    }

    #[test]
    fn an_unhealthy_cluster_with_nothing_to_do_says_why() {
        // One node still counts a primary as possibly failing.
        let mut members = formed();
        if let Some(v) = members[3].view.as_mut() {
            v.info.slots_ok = 16384 - 5462;
            v.info.slots_pfail = 5462;
            v.info.slots_assigned = 16384;
        }
        let plan = decide(&members, 3, 2);
        assert!(plan.steps.is_empty() && plan.problems.is_empty());
        assert!(!plan.healthy);
        assert_eq!(
            plan.waiting,
            vec![
                "r-s1-1 sees the cluster ok: 10922 of 16384 slots ok (16384 assigned, 5462 \
                 possibly failing, 0 failing)"
                    .to_string()
            ]
        );

        // A third instance per shard is asked for and not there yet.
        let plan = decide(&formed(), 3, 3);
        assert!(!plan.healthy);
        assert_eq!(
            plan.waiting,
            vec![
                "6 of 9 pods exist".to_string(),
                "shard 0: 1 of 2 replica(s) follow r-s0-0".to_string(),
                "shard 1: 1 of 2 replica(s) follow r-s1-0".to_string(),
                "shard 2: 1 of 2 replica(s) follow r-s2-0".to_string(),
            ]
        );
    }

    #[test]
    fn a_promoted_replica_is_the_shards_primary() {
        // Shard 0 failed over: s0-1 owns the slots at a higher epoch; the old
        // primary s0-0 came back and follows it.
        let mut lines = formed_lines();
        lines[0] = line(IDS[0], &ip(0, 0), "slave", IDS[1], 1, "");
        lines[1] = line(IDS[1], &ip(0, 1), "master", "-", 7, "0-5461");
        let members: Vec<Member> = (0..6)
            .map(|k| member(k / 2, k % 2, IDS[k as usize], &lines, true))
            .collect();
        let plan = decide(&members, 3, 2);
        assert!(plan.steps.is_empty(), "{:?}", plan.steps);
        assert_eq!(plan.shards[0].primary.as_deref(), Some("r-s0-1"));
        assert_eq!(plan.shards[0].replicas, vec!["r-s0-0".to_string()]);
        assert!(plan.healthy);
    }

    #[test]
    fn a_stale_claim_loses_to_the_higher_epoch() {
        // The old primary restarted with its nodes.conf and still claims
        // shard 0's slots at epoch 1; the cluster gave them to s0-1 at 7.
        let mut lines = formed_lines();
        lines[1] = line(IDS[1], &ip(0, 1), "master", "-", 7, "0-5461");
        let mut members: Vec<Member> = (0..6)
            .map(|k| member(k / 2, k % 2, IDS[k as usize], &lines, true))
            .collect();
        let own = [line(IDS[0], &ip(0, 0), "master", "-", 1, "0-5461")];
        members[0] = member(0, 0, IDS[0], &[own[0].clone(), lines[1].clone()], false);
        let plan = decide(&members, 3, 2);
        assert_eq!(plan.shards[0].primary.as_deref(), Some("r-s0-1"));
        assert!(
            !plan
                .steps
                .iter()
                .any(|s| matches!(s, Step::AddSlots { .. })),
            "{:?}",
            plan.steps
        );
    }

    #[test]
    fn an_empty_node_in_place_of_a_lost_primary_never_gets_its_slots() {
        // Shard 0 had no replica (instances 1); its primary came back
        // empty with a new ID. The old ID still owns the slots.
        let r = spread(3);
        let mut lines: Vec<String> = (0..3)
            .map(|s| {
                line(
                    IDS[2 * s],
                    &ip(s as i32, 0),
                    "master",
                    "-",
                    1,
                    &r[s].to_string(),
                )
            })
            .collect();
        lines[0] = line(IDS[0], &ip(0, 9), "master,fail", "-", 1, &r[0].to_string());
        lines.push(line(IDS[5], &ip(0, 0), "master", "-", 0, ""));
        let mut members: Vec<Member> = (1..3)
            .map(|s| member(s, 0, IDS[2 * s as usize], &lines, true))
            .collect();
        members.insert(0, member(0, 0, IDS[5], &lines, false));
        let plan = decide(&members, 3, 1);
        assert!(
            !plan
                .steps
                .iter()
                .any(|s| matches!(s, Step::AddSlots { .. })),
            "{:?}",
            plan.steps
        );
        assert!(
            !plan.steps.iter().any(|s| matches!(s, Step::Forget { .. })),
            "an ID owning slots is never forgotten: {:?}",
            plan.steps
        );
        assert_eq!(plan.problems.len(), 1, "{:?}", plan.problems);
        assert!(plan.problems[0].contains("slots 0-5461 are not served"));
        assert!(!plan.healthy);
    }

    #[test]
    fn a_replica_linked_to_its_primary_s_old_address_is_pointed_at_the_new_one() {
        let lines = formed_lines();
        let mut members: Vec<Member> = (0..6)
            .map(|k| member(k / 2, k % 2, IDS[k as usize], &lines, true))
            .collect();
        // r-s0-1 follows the right node, its view has its address, its link
        // is on that address: nothing to do.
        members[1].following = Some(ip(0, 0));
        members[1].link_up = Some(false);
        let plan = decide(&members, 3, 2);
        assert!(plan.steps.is_empty(), "{:?}", plan.steps);
        // Its link on an address the primary had before (made anew): it is
        // pointed at the one its view now has.
        members[1].following = Some("10.0.9.9".into());
        let plan = decide(&members, 3, 2);
        assert_eq!(
            plan.steps,
            vec![Step::Replicate {
                pod: "r-s0-1".into(),
                primary: "r-s0-0".into(),
                primary_id: IDS[0].into(),
            }]
        );
        // The same with the link up (the engine moved it itself): nothing.
        members[1].link_up = Some(true);
        let plan = decide(&members, 3, 2);
        assert!(plan.steps.is_empty(), "{:?}", plan.steps);
    }

    #[test]
    fn a_shard_with_a_replica_waits_for_the_election() {
        let mut lines = formed_lines();
        lines[0] = line(IDS[0], &ip(0, 0), "master,fail", "-", 1, "0-5461");
        let members: Vec<Member> = (1..6)
            .map(|k| member(k / 2, k % 2, IDS[k as usize], &lines, false))
            .collect();
        let plan = decide(&members, 3, 2);
        assert!(plan.problems.is_empty(), "{:?}", plan.problems);
        assert!(
            plan.waiting.iter().any(|w| w.contains("taking over")),
            "{:?}",
            plan.waiting
        );
        assert!(plan.steps.is_empty(), "{:?}", plan.steps);
        // The primary's pod missing or silent (restarting with its data,
        // say): no candidate, whatever the others see.
        assert_eq!(
            plan.electing,
            vec![Electing {
                shard: 0,
                candidates: vec![],
            }]
        );
        // Its pod answering as another node (made anew, its data gone): the
        // replica, which sees the primary failed, is the candidate a forced
        // takeover would promote.
        let new_id = "9000000000000000000000000000000000000000";
        lines.push(line(new_id, &ip(0, 0), "master", "-", 0, ""));
        let members: Vec<Member> = (0..6)
            .map(|k| {
                let id = if k == 0 { new_id } else { IDS[k as usize] };
                member(k / 2, k % 2, id, &lines, false)
            })
            .collect();
        let plan = decide(&members, 3, 2);
        assert_eq!(
            plan.electing,
            vec![Electing {
                shard: 0,
                candidates: vec!["r-s0-1".to_string()],
            }]
        );
        // Suspected only (`pfail`): the cluster has not agreed it is gone,
        // and no one is a candidate.
        lines[0] = line(IDS[0], &ip(0, 0), "master,pfail", "-", 1, "0-5461");
        let members: Vec<Member> = (1..6)
            .map(|k| member(k / 2, k % 2, IDS[k as usize], &lines, false))
            .collect();
        let plan = decide(&members, 3, 2);
        assert_eq!(plan.electing.len(), 1, "{:?}", plan.electing);
        assert!(
            plan.electing[0].candidates.is_empty(),
            "{:?}",
            plan.electing
        );
    }

    #[test]
    fn a_replaced_replica_is_attached_and_its_old_id_forgotten() {
        // s2-1 came back without storage: new ID IDS[5] -> "9...", the old
        // one failed.
        let new_id = "9000000000000000000000000000000000000000";
        let mut lines = formed_lines();
        lines[5] = line(IDS[5], &ip(2, 7), "slave,fail", IDS[4], 3, "");
        lines.push(line(new_id, &ip(2, 1), "master", "-", 0, ""));
        let mut members: Vec<Member> = (0..5)
            .map(|k| member(k / 2, k % 2, IDS[k as usize], &lines, true))
            .collect();
        members.push(member(2, 1, new_id, &lines, true));
        let plan = decide(&members, 3, 2);
        assert_eq!(
            plan.steps,
            vec![
                Step::Replicate {
                    pod: "r-s2-1".into(),
                    primary: "r-s2-0".into(),
                    primary_id: IDS[4].into(),
                },
                Step::Forget { id: IDS[5].into() },
            ]
        );
    }

    #[test]
    fn nothing_is_forgotten_while_a_pod_does_not_answer() {
        let mut lines = formed_lines();
        lines[5] = line(IDS[5], &ip(2, 1), "slave,fail", IDS[4], 3, "");
        let members: Vec<Member> = (0..5)
            .map(|k| member(k / 2, k % 2, IDS[k as usize], &lines, true))
            .collect();
        let plan = decide(&members, 3, 2);
        assert!(plan.steps.is_empty(), "{:?}", plan.steps);
        assert!(!plan.healthy);
    }

    #[test]
    fn a_node_of_another_cluster_is_not_met() {
        let mut members = formed();
        let stranger = "7000000000000000000000000000000000000000";
        members[5] = member(
            2,
            1,
            stranger,
            &[line(stranger, &ip(2, 1), "master", "-", 9, "0-100")],
            false,
        );
        let plan = decide(&members, 3, 2);
        assert!(
            !plan.steps.iter().any(|s| matches!(s, Step::Meet { .. })),
            "{:?}",
            plan.steps
        );
        assert!(plan.problems.iter().any(|p| p.contains("two clusters")));
    }

    #[test]
    fn a_creation_cut_short_is_finished_where_it_stopped() {
        // The operator stopped after shard 0 got its slots and shard 1 part
        // of its own; no replica was attached yet.
        let r = spread(3);
        let mut lines: Vec<String> = (0..6)
            .map(|k| line(IDS[k as usize], &ip(k / 2, k % 2), "master", "-", 0, ""))
            .collect();
        lines[0] = line(IDS[0], &ip(0, 0), "master", "-", 1, &r[0].to_string());
        lines[2] = line(
            IDS[2],
            &ip(1, 0),
            "master",
            "-",
            2,
            &format!("{}-6000", r[1].start),
        );
        let members: Vec<Member> = (0..6)
            .map(|k| member(k / 2, k % 2, IDS[k as usize], &lines, false))
            .collect();
        let plan = decide(&members, 3, 2);
        assert_eq!(
            plan.steps,
            vec![
                Step::AddSlots {
                    pod: "r-s1-0".into(),
                    ranges: vec![SlotRange {
                        start: 6001,
                        end: r[1].end
                    }],
                },
                Step::AddSlots {
                    pod: "r-s2-0".into(),
                    ranges: vec![r[2]],
                },
                Step::Replicate {
                    pod: "r-s0-1".into(),
                    primary: "r-s0-0".into(),
                    primary_id: IDS[0].into(),
                },
                Step::Replicate {
                    pod: "r-s1-1".into(),
                    primary: "r-s1-0".into(),
                    primary_id: IDS[2].into(),
                },
                Step::Replicate {
                    pod: "r-s2-1".into(),
                    primary: "r-s2-0".into(),
                    primary_id: IDS[4].into(),
                },
            ]
        );
    }

    /// A 3 x 2 cluster after a resharding: shard 1's primary serves
    /// 12000-13000 (not its home range) and its pod is gone, its replica
    /// replaced by an empty node.
    fn resharded_with_shard_1_lost() -> Vec<Member> {
        let lines = vec![
            line(IDS[0], &ip(0, 0), "master", "-", 1, "0-10922"),
            line(IDS[1], &ip(0, 1), "slave", IDS[0], 1, ""),
            line(IDS[2], &ip(1, 0), "master,fail", "-", 4, "12000-13000"),
            line(IDS[3], &ip(1, 1), "master", "-", 0, ""),
            line(
                IDS[4],
                &ip(2, 0),
                "master",
                "-",
                3,
                "10923-11999 13001-16383",
            ),
            line(IDS[5], &ip(2, 1), "slave", IDS[4], 3, ""),
        ];
        [0, 1, 3, 4, 5]
            .into_iter()
            .map(|k| member(k / 2, k % 2, IDS[k as usize], &lines, false))
            .collect()
    }

    #[test]
    fn a_lost_primary_after_a_resharding_is_its_recorded_shards() {
        let members = resharded_with_shard_1_lost();
        let recorded = vec![
            vec![SlotRange {
                start: 0,
                end: 10922,
            }],
            vec![SlotRange {
                start: 12000,
                end: 13000,
            }],
            vec![],
        ];
        let shape = Shape {
            shards: 3,
            instances: 2,
            restoring: false,
            recorded,
            homes: Vec::new(),
        };
        let plan = decide_shape(&members, &shape);
        // The empty node is not made shard 1's primary: shard 1 lost its
        // slots, it is not a new shard.
        assert_eq!(plan.shards[1].primary, None, "{plan:?}");
        assert!(
            plan.problems
                .iter()
                .any(|p| p.contains("shard 1: no primary") && p.contains("12000-13000")),
            "{:?}",
            plan.problems
        );
        assert!(
            !plan
                .steps
                .iter()
                .any(|s| matches!(s, Step::AddSlots { .. })),
            "{:?}",
            plan.steps
        );
    }

    #[test]
    fn a_new_shard_has_its_first_pod_as_primary_before_it_owns_a_slot() {
        // A formed 3 x 2 cluster that met shard 3's two empty nodes.
        let mut lines = formed_lines();
        let (p, q) = ("1".repeat(40), "2".repeat(40));
        lines.push(line(&p, &ip(3, 0), "master", "-", 0, ""));
        lines.push(line(&q, &ip(3, 1), "master", "-", 0, ""));
        let ids: Vec<String> = IDS
            .iter()
            .map(|s| s.to_string())
            .chain([p.clone(), q])
            .collect();
        let members: Vec<Member> = (0..8)
            .map(|k| member(k / 2, k % 2, &ids[k as usize], &lines, true))
            .collect();
        let plan = decide(&members, 4, 2);
        assert_eq!(plan.shards.len(), 4);
        assert_eq!(plan.shards[3].primary.as_deref(), Some("r-s3-0"));
        assert!(plan.shards[3].slots.is_empty());
        assert_eq!(
            plan.steps,
            vec![Step::Replicate {
                pod: "r-s3-1".into(),
                primary: "r-s3-0".into(),
                primary_id: p,
            }]
        );
        // Shards past the count (being emptied) are still planned.
        let plan = decide(&members, 3, 2);
        assert_eq!(plan.shards.len(), 4);
        assert!(plan.problems.is_empty(), "{:?}", plan.problems);
    }

    #[test]
    fn an_emptied_shard_keeps_the_primary_its_other_pod_follows() {
        // Shard 3 failed over (its pod 1 is primary, pod 0 follows it),
        // then gave all its slots away: pod 1 stays its primary.
        let mut lines = formed_lines();
        let (p, q) = ("1".repeat(40), "2".repeat(40));
        lines.push(line(&p, &ip(3, 0), "slave", &q, 0, ""));
        lines.push(line(&q, &ip(3, 1), "master", "-", 0, ""));
        let ids: Vec<String> = IDS
            .iter()
            .map(|s| s.to_string())
            .chain([p, q.clone()])
            .collect();
        let members: Vec<Member> = (0..8)
            .map(|k| member(k / 2, k % 2, &ids[k as usize], &lines, true))
            .collect();
        let plan = decide(&members, 3, 2);
        assert_eq!(plan.shards.len(), 4);
        assert_eq!(plan.shards[3].primary.as_deref(), Some("r-s3-1"));
        assert_eq!(plan.shards[3].primary_id.as_deref(), Some(q.as_str()));
        assert!(plan.without_primary().is_empty(), "{plan:?}");
        assert!(plan.steps.is_empty(), "{:?}", plan.steps);
    }

    #[test]
    fn ranges_merge_neighbours() {
        assert_eq!(show(&ranges([5, 1, 2, 3, 9, 10])), "1-3,5,9-10");
        assert!(ranges([]).is_empty());
    }
}
