//! What Cluster mode's decisions are made of: each pod and what its server
//! says of the cluster ([`Member`], [`View`]), the steps a pass may take
//! ([`Step`]), each shard's primary and replicas ([`Shard`]) and the plan
//! ([`Plan`]). Plain data; the `plan` module decides from it.

use crate::redis::cluster::{ClusterInfo, ClusterNode, SlotRange};

/// One pod of a Cluster Redis and what its server said.
#[derive(Debug, Clone, Default)]
pub struct Member {
    /// Pod name.
    pub pod: String,
    /// The shard (from the pod's StatefulSet).
    pub shard: i32,
    /// The pod's ordinal within its shard.
    pub ordinal: i32,
    /// Pod IP.
    pub ip: Option<String>,
    /// Pod Ready condition.
    pub ready: bool,
    /// Being deleted.
    pub terminating: bool,
    /// What the server answered; `None` when it did not.
    pub view: Option<View>,
    /// A replica's replication link: the address it follows
    /// (`master_host`), and whether the link is up.
    pub following: Option<String>,
    /// See `following`.
    pub link_up: Option<bool>,
}

/// One node's view of the cluster.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// `CLUSTER NODES`.
    pub nodes: Vec<ClusterNode>,
    /// `CLUSTER INFO`.
    pub info: ClusterInfo,
    /// Slots a classic move left importing or migrating on this node.
    pub open: Vec<crate::redis::reshard::OpenSlot>,
}

impl View {
    /// The answering node's own line.
    pub fn myself(&self) -> Option<&ClusterNode> {
        self.nodes.iter().find(|n| n.myself)
    }

    /// Whether the node knows `id` past the handshake.
    pub fn knows(&self, id: &str) -> bool {
        self.nodes.iter().any(|n| n.id == id && !n.handshake)
    }

    /// Whether the node is in a handshake with the node at `ip`.
    pub fn joining(&self, ip: &str) -> bool {
        self.nodes
            .iter()
            .any(|n| n.handshake && n.addr.as_ref().is_some_and(|a| a.host() == ip))
    }
}

impl Member {
    pub fn me(&self) -> Option<&ClusterNode> {
        self.view.as_ref()?.myself()
    }

    /// The node ID it answered with.
    pub fn id(&self) -> Option<&str> {
        self.me().map(|n| n.id.as_str())
    }

    pub fn live(&self) -> bool {
        !self.terminating && self.ip.is_some() && self.me().is_some()
    }
}

/// A step toward the desired cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// `CLUSTER MEET` from `from` (a pod) to the node at `ip`.
    Meet {
        /// Pod that meets.
        from: String,
        /// The pod that is met.
        to: String,
        /// Its IP.
        ip: String,
    },
    /// `CLUSTER ADDSLOTSRANGE` on `pod` (slots nobody owns).
    AddSlots {
        /// Pod that takes the slots.
        pod: String,
        /// The slots.
        ranges: Vec<SlotRange>,
    },
    /// `CLUSTER REPLICATE` on `pod`: follow its shard's primary.
    Replicate {
        /// Pod that follows.
        pod: String,
        /// The shard primary's pod.
        primary: String,
        /// The shard primary's node ID.
        primary_id: String,
    },
    /// `CLUSTER FORGET` of a node ID no pod runs, on every node.
    Forget {
        /// The stale node ID.
        id: String,
    },
}

/// One shard as decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shard {
    /// Index.
    pub index: i32,
    /// The pod serving the shard's slots.
    pub primary: Option<String>,
    /// Its node ID.
    pub primary_id: Option<String>,
    /// Pods following it.
    pub replicas: Vec<String>,
    /// The slots it serves.
    pub slots: Vec<SlotRange>,
    /// Pods of the shard, and how many are Ready.
    pub pods: usize,
    /// See `pods`.
    pub ready: usize,
}

/// What a pass decided.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// Steps to take now, in order.
    pub steps: Vec<Step>,
    /// Per shard, in order.
    pub shards: Vec<Shard>,
    /// What is wrong (Degraded).
    pub problems: Vec<String>,
    /// What is under way or awaited (Progressing).
    pub waiting: Vec<String>,
    /// The cluster is as desired: every pod answers, every slot is served
    /// and `ok` on every node, every shard has its primary and replicas.
    pub healthy: bool,
    /// All of [`Self::healthy`] but every node seeing every slot served:
    /// what an open slot alone can leave (a target importing a slot
    /// ignores news of its owner), and finishing that slot mends.
    pub whole: bool,
    /// Shards whose primary is gone and whose replicas are to elect one.
    pub electing: Vec<Electing>,
}

/// A shard that lost its primary, with the replicas that could take over.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Electing {
    /// The shard.
    pub shard: i32,
    /// Pods following the lost primary whose own view marks it failed (the
    /// cluster agreed it is gone: a majority of primaries lost it for the
    /// node timeout), so a vote is what promotes one; none while a pod of
    /// the shard does not answer (it may be the lost primary restarting).
    pub candidates: Vec<String>,
}

impl Plan {
    /// The indexes of the shards no node serves as primary.
    pub fn without_primary(&self) -> Vec<String> {
        self.shards
            .iter()
            .filter(|s| s.primary.is_none())
            .map(|s| s.index.to_string())
            .collect()
    }
}
