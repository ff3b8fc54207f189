//! Which slots a resharding moves next, pure and table-tested: from the
//! slots each shard's primary owns and the slots left open by a stopped
//! move, the next step (finish an open slot, settle a stale state, the next
//! bounded chunk of the rebalance, or nothing), and how slots move on this
//! engine. The `reshard` step runs it (see its header for the protocol).

use crate::api::v1alpha1::SlotMoveIntent;
use crate::redis::cluster::{SlotRange, ranges};
use crate::redis::reshard::{self as rs, OpenSlot};

use super::model::{Member, Plan};

/// Slots one classic step moves at most (one recorded intent).
pub const CLASSIC_CHUNK: u32 = 256;

/// Slots one atomic job moves at most.
pub const ATOMIC_CHUNK: u32 = 1024;

/// How slots move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// Valkey 9's `CLUSTER MIGRATESLOTS`.
    Atomic,
    /// `SETSLOT IMPORTING/MIGRATING`, `MIGRATE` in batches, `SETSLOT NODE`.
    Classic,
}

impl Path {
    pub fn name(self) -> &'static str {
        match self {
            Path::Atomic => "Atomic",
            Path::Classic => "Classic",
        }
    }
}

/// What a resharding pass does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Every shard holds its share and no slot is open.
    Idle,
    /// A slot a stopped move left open: move it (again) from shard `from`
    /// to shard `to`.
    Finish {
        /// The slot.
        slot: u16,
        /// Shard giving it.
        from: usize,
        /// Shard taking it.
        to: usize,
    },
    /// Shard `shard`'s primary shows a state for a slot that already has
    /// its owner: `CLUSTER SETSLOT <slot> NODE <owner>` clears it.
    Settle {
        /// The slot.
        slot: u16,
        /// The shard whose primary shows it.
        shard: usize,
        /// The owner's node ID.
        owner: String,
    },
    /// A slot open in a way no step can settle safely (reported).
    Stuck(String),
    /// The next chunk of the rebalance.
    Move {
        /// Shard giving.
        from: usize,
        /// Shard taking.
        to: usize,
        /// The slots.
        slots: Vec<SlotRange>,
    },
}

/// The first `n` slots of `slots`.
fn first_slots(slots: &[SlotRange], n: u32) -> Vec<SlotRange> {
    ranges(
        slots
            .iter()
            .flat_map(|r| r.start..=r.end)
            .take(usize::try_from(n).unwrap_or(usize::MAX)),
    )
}

/// Each shard's slots, as the plan found them.
pub fn owned(plan: &Plan) -> Vec<Vec<SlotRange>> {
    plan.shards.iter().map(|s| s.slots.clone()).collect()
}

/// The moves left to an even spread over `shards`.
pub fn remaining(plan: &Plan, shards: usize) -> Vec<rs::SlotMove> {
    rs::rebalance(&owned(plan), shards)
}

/// How many slots the moves left to an even spread over `shards` move.
pub fn slots_left(plan: &Plan, shards: usize) -> i64 {
    remaining(plan, shards)
        .iter()
        .map(|m| i64::from(m.count()))
        .sum()
}

/// Decides the next step (pure). `intent` is the move recorded before the
/// last one started; `chunk` bounds the slots of a new step.
pub fn next(
    plan: &Plan,
    members: &[Member],
    shards: usize,
    intent: Option<&SlotMoveIntent>,
    chunk: u32,
) -> Next {
    let owner_of = |slot: u16| {
        plan.shards
            .iter()
            .position(|s| s.slots.iter().any(|r| r.contains(slot)))
    };
    let shard_of_id = |id: &str| {
        plan.shards
            .iter()
            .position(|s| s.primary_id.as_deref() == Some(id))
    };
    for (i, s) in plan.shards.iter().enumerate() {
        let Some(view) = s
            .primary
            .as_ref()
            .and_then(|p| members.iter().find(|m| &m.pod == p))
            .and_then(|m| m.view.as_ref())
        else {
            continue;
        };
        for open in &view.open {
            match open {
                OpenSlot::Migrating { slot, to } => match owner_of(*slot) {
                    Some(j) if j == i => {
                        // The recorded target when the node it names is
                        // gone (its shard failed over meanwhile).
                        let target = shard_of_id(to).or_else(|| {
                            intent
                                .filter(|t| t.from_shard == i as i32)
                                .and_then(|t| usize::try_from(t.to_shard).ok())
                        });
                        return match target {
                            Some(k) if k != i && k < plan.shards.len() => Next::Finish {
                                slot: *slot,
                                from: i,
                                to: k,
                            },
                            _ => Next::Stuck(format!(
                                "slot {slot} is migrating from shard {i} to node {to}, which no \
                                 shard's primary runs and no recorded move names"
                            )),
                        };
                    }
                    Some(j) => {
                        if let Some(owner) = plan.shards[j].primary_id.clone() {
                            return Next::Settle {
                                slot: *slot,
                                shard: i,
                                owner,
                            };
                        }
                    }
                    None => {
                        return Next::Stuck(format!(
                            "slot {slot} is migrating on shard {i} but no primary serves it"
                        ));
                    }
                },
                OpenSlot::Importing { slot, .. } => match owner_of(*slot) {
                    Some(j) if j != i => {
                        return Next::Finish {
                            slot: *slot,
                            from: j,
                            to: i,
                        };
                    }
                    Some(_) => {
                        if let Some(owner) = s.primary_id.clone() {
                            return Next::Settle {
                                slot: *slot,
                                shard: i,
                                owner,
                            };
                        }
                    }
                    None => {
                        return Next::Stuck(format!(
                            "slot {slot} is importing on shard {i} but no primary serves it"
                        ));
                    }
                },
            }
        }
    }
    match remaining(plan, shards).into_iter().next() {
        Some(m) => Next::Move {
            from: m.from,
            to: m.to,
            slots: first_slots(&m.slots, chunk),
        },
        None => Next::Idle,
    }
}

/// Every slot open between shard `from`'s primary and shard `to`'s that
/// shard `from` still owns, `slot` among them: a classic move opens
/// several slots at once, and one stopped midway leaves them all open, to
/// be finished together. A slot counts when the source migrates it to the
/// target or the target imports it from the source.
pub fn open_between(
    plan: &Plan,
    members: &[Member],
    from: usize,
    to: usize,
    slot: u16,
) -> Vec<SlotRange> {
    let view = |shard: usize| {
        plan.shards
            .get(shard)
            .and_then(|s| s.primary.as_ref())
            .and_then(|p| members.iter().find(|m| &m.pod == p))
            .and_then(|m| m.view.as_ref())
    };
    let id = |shard: usize| plan.shards.get(shard).and_then(|s| s.primary_id.clone());
    let owned = |s: u16| {
        plan.shards
            .get(from)
            .is_some_and(|sh| sh.slots.iter().any(|r| r.contains(s)))
    };
    let (Some(src_id), Some(dst_id)) = (id(from), id(to)) else {
        return ranges([slot]);
    };
    let mut slots = vec![slot];
    if let Some(v) = view(from) {
        slots.extend(v.open.iter().filter_map(|o| match o {
            OpenSlot::Migrating { slot, to } if *to == dst_id => Some(*slot),
            _ => None,
        }));
    }
    if let Some(v) = view(to) {
        slots.extend(v.open.iter().filter_map(|o| match o {
            OpenSlot::Importing { slot, from } if *from == src_id => Some(*slot),
            _ => None,
        }));
    }
    slots.retain(|s| *s == slot || owned(*s));
    slots.sort_unstable();
    slots.dedup();
    ranges(slots)
}

pub fn count(slots: &[SlotRange]) -> i64 {
    slots.iter().map(|r| i64::from(r.count())).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::redis::cluster::model::{Shard, View};
    use crate::redis::cluster::spread;

    fn id(i: usize) -> String {
        format!("{i:0>40}")
    }

    /// A plan whose shard `i` is served by pod `r-s<i>-0` (node `id(i)`)
    /// with `slots[i]`, and members whose primaries show `open`.
    fn case(slots: &[Vec<SlotRange>], open: &[(usize, OpenSlot)]) -> (Plan, Vec<Member>) {
        let plan = Plan {
            shards: slots
                .iter()
                .enumerate()
                .map(|(i, s)| Shard {
                    index: i as i32,
                    primary: Some(format!("r-s{i}-0")),
                    primary_id: Some(id(i)),
                    slots: s.clone(),
                    ..Default::default()
                })
                .collect(),
            healthy: true,
            ..Default::default()
        };
        let members = (0..slots.len())
            .map(|i| Member {
                pod: format!("r-s{i}-0"),
                shard: i as i32,
                view: Some(View {
                    open: open
                        .iter()
                        .filter(|(s, _)| *s == i)
                        .map(|(_, o)| o.clone())
                        .collect(),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect();
        (plan, members)
    }

    fn r(start: u16, end: u16) -> SlotRange {
        SlotRange { start, end }
    }

    fn three_and_a_new_one() -> Vec<Vec<SlotRange>> {
        let mut v: Vec<Vec<SlotRange>> = spread(3).into_iter().map(|r| vec![r]).collect();
        v.push(Vec::new());
        v
    }

    #[test]
    fn a_stopped_group_is_finished_together_and_only_with_its_own_pair() {
        // Shard 0 migrates 4096-4098 to shard 3 (the target imports 4097
        // and 4099 too); 4099 is also still owned by shard 0. Slot 10 is
        // migrating to shard 1 instead, and 20000 is not a slot shard 0 owns.
        let open = [
            (
                0,
                OpenSlot::Migrating {
                    slot: 4096,
                    to: id(3),
                },
            ),
            (
                0,
                OpenSlot::Migrating {
                    slot: 4097,
                    to: id(3),
                },
            ),
            (
                0,
                OpenSlot::Migrating {
                    slot: 4098,
                    to: id(3),
                },
            ),
            (
                0,
                OpenSlot::Migrating {
                    slot: 10,
                    to: id(1),
                },
            ),
            (
                3,
                OpenSlot::Importing {
                    slot: 4099,
                    from: id(0),
                },
            ),
            (
                3,
                OpenSlot::Importing {
                    slot: 6000,
                    from: id(1),
                },
            ),
        ];
        let (plan, members) = case(&three_and_a_new_one(), &open);
        assert_eq!(
            next(&plan, &members, 4, None, 64),
            Next::Finish {
                slot: 4096,
                from: 0,
                to: 3
            }
        );
        assert_eq!(
            open_between(&plan, &members, 0, 3, 4096),
            vec![r(4096, 4099)]
        );
        // Nothing open: the one slot asked for.
        let (plan, members) = case(&three_and_a_new_one(), &[]);
        assert_eq!(open_between(&plan, &members, 0, 3, 7), vec![r(7, 7)]);
    }

    #[test]
    fn a_new_shard_gets_the_highest_slots_of_the_first_in_chunks() {
        let (plan, members) = case(&three_and_a_new_one(), &[]);
        // Even over 4: 4096 each; shard 0 (0-5461) gives 4096-5461.
        assert_eq!(
            next(&plan, &members, 4, None, 64),
            Next::Move {
                from: 0,
                to: 3,
                slots: vec![r(4096, 4159)]
            }
        );
        let total: u32 = remaining(&plan, 4).iter().map(rs::SlotMove::count).sum();
        assert_eq!(total, 4096, "what shard 3 takes in all");
        // At the count asked for, nothing moves.
        assert_eq!(next(&plan, &members, 3, None, 64), Next::Idle);
    }

    #[test]
    fn a_shard_past_the_count_is_emptied_onto_the_others() {
        let four: Vec<Vec<SlotRange>> = spread(4).into_iter().map(|r| vec![r]).collect();
        let (plan, members) = case(&four, &[]);
        let moves = remaining(&plan, 3);
        assert!(moves.iter().all(|m| m.from == 3), "{moves:?}");
        let n: u32 = moves.iter().map(rs::SlotMove::count).sum();
        assert_eq!(n, 4096);
        assert!(matches!(
            next(&plan, &members, 3, None, 64),
            Next::Move { from: 3, to: 0, .. }
        ));
    }

    #[test]
    fn a_slot_left_open_is_finished_before_anything_else() {
        // Shard 0 still owns 4096 and migrates it to shard 3.
        let open = [(
            0,
            OpenSlot::Migrating {
                slot: 4096,
                to: id(3),
            },
        )];
        let (plan, members) = case(&three_and_a_new_one(), &open);
        assert_eq!(
            next(&plan, &members, 4, None, 64),
            Next::Finish {
                slot: 4096,
                from: 0,
                to: 3
            }
        );
        // Only the target's half was set (stopped between the two
        // SETSLOTs): the same.
        let open = [(
            3,
            OpenSlot::Importing {
                slot: 4096,
                from: id(0),
            },
        )];
        let (plan, members) = case(&three_and_a_new_one(), &open);
        assert_eq!(
            next(&plan, &members, 4, None, 64),
            Next::Finish {
                slot: 4096,
                from: 0,
                to: 3
            }
        );
    }

    #[test]
    fn a_slot_whose_owner_changed_is_settled_on_the_source() {
        // The target took 4096 (stopped before the source's SETSLOT NODE).
        let mut slots = three_and_a_new_one();
        slots[0] = vec![r(0, 4095), r(4097, 5461)];
        slots[3] = vec![r(4096, 4096)];
        let open = [(
            0,
            OpenSlot::Migrating {
                slot: 4096,
                to: id(3),
            },
        )];
        let (plan, members) = case(&slots, &open);
        assert_eq!(
            next(&plan, &members, 4, None, 64),
            Next::Settle {
                slot: 4096,
                shard: 0,
                owner: id(3)
            }
        );
    }

    #[test]
    fn a_target_that_failed_over_is_found_through_the_recorded_move() {
        // Shard 3's primary changed: the node the slot migrates to is gone.
        let open = [(
            0,
            OpenSlot::Migrating {
                slot: 4096,
                to: "gone".into(),
            },
        )];
        let (plan, members) = case(&three_and_a_new_one(), &open);
        let intent = SlotMoveIntent {
            slots: "4096-4159".into(),
            from_shard: 0,
            to_shard: 3,
            source: id(0),
            target: "gone".into(),
        };
        assert_eq!(
            next(&plan, &members, 4, Some(&intent), 64),
            Next::Finish {
                slot: 4096,
                from: 0,
                to: 3
            }
        );
        // Without a record nothing guesses where the moved keys went.
        assert!(matches!(next(&plan, &members, 4, None, 64), Next::Stuck(_)));
    }
}
