//! Share partitions' durable state: `__share_group_state`, a machine of
//! the coordinator runtime ([`crate::coordinator`]: it creates the topic,
//! replays it into [`ShareStates`], writes durably). Kafka's share
//! coordinator's job: a share partition lives on the core that owns its
//! topic partition, its state on the core leading
//! `crc32c(group, topic, partition) % partitions` of this topic — on this
//! node (through the mesh) or another (node to node,
//! [`weir_replication::data::DataRequest::ShareState`]). A share
//! partition is loaded from here when a core first serves it (after a
//! restart, or when it starts leading the topic partition) and stored
//! here before an acknowledgement is answered.

use std::rc::Rc;

use bytes::Bytes;
use weir_share::partition::ShareSnapshot;
use weir_share::records::{self, ShareKey};

use super::registry::ShareStates;
use crate::coordinator::{Hosting, Machine, TopicPlan};
use crate::error::BrokerError;
use crate::metadata::SHARE_STATE_TOPIC;
use crate::shard::mesh::CoreMsg;
use crate::shard::Core;

/// Partitions of a new `__share_group_state` (Kafka's
/// `share.coordinator.state.topic.num.partitions`).
pub const SHARE_STATE_PARTITIONS: u32 = 50;

impl Machine for ShareStates {
    fn topic(&self) -> &'static str {
        SHARE_STATE_TOPIC
    }

    fn hosting(&self) -> &Hosting {
        &self.hosting
    }

    fn topic_plan(&self, core: &Core) -> TopicPlan {
        TopicPlan::compacted(core, SHARE_STATE_PARTITIONS)
    }

    fn forget(&self, p: u32, _n: u32) {
        self.parts.borrow_mut().remove(&p);
    }

    fn replay(&self, _core: &Core, p: u32, key: Option<&[u8]>, value: Option<&[u8]>) {
        let Some(key) = key else {
            return;
        };
        let k = match records::decode_key(key) {
            Ok(k) => k,
            Err(why) => {
                tracing::warn!(
                    partition = p,
                    why,
                    "unreadable {SHARE_STATE_TOPIC} key skipped"
                );
                return;
            }
        };
        let mut parts = self.parts.borrow_mut();
        let states = parts.entry(p).or_default();
        match value.map(records::decode_value) {
            None => {
                states.remove(&k);
            }
            Some(Ok(s)) => {
                states.insert(k, s);
            }
            Some(Err(why)) => {
                tracing::warn!(
                    partition = p,
                    why,
                    "unreadable {SHARE_STATE_TOPIC} value skipped"
                )
            }
        }
    }

    fn replayed(&self, _core: &Rc<Core>, _p: Option<(u32, u32)>) {}

    fn started(&self, _core: &Rc<Core>) {}

    fn on_demand(&self) -> bool {
        true
    }
}

/// The string a share partition is placed by.
fn placement_key(k: &ShareKey) -> String {
    format!("{}\u{0}{}\u{0}{}", k.group, k.topic, k.partition)
}

/// Where share partition `k`'s state lives: this node's core, or
/// another node.
enum Home {
    Core(usize, u32),
    Node(u64, u32),
}

/// `None`: the topic does not exist (nothing was ever stored).
fn home_of(core: &Core, k: &ShareKey) -> Result<Option<Home>, BrokerError> {
    let Some(q) = crate::coordinator::partition_of(core, SHARE_STATE_TOPIC, &placement_key(k))
    else {
        return Ok(None);
    };
    match core.locate(SHARE_STATE_TOPIC, q) {
        Ok(c) => Ok(Some(Home::Core(c, q))),
        Err(BrokerError::NotLeader { leader, .. }) if leader != 0 => {
            Ok(Some(Home::Node(leader, q)))
        }
        Err(e) => Err(e),
    }
}

/// The stored state of share partition `k`, if any.
pub async fn load(core: &Rc<Core>, k: &ShareKey) -> Result<Option<ShareSnapshot>, BrokerError> {
    let value = at_home(core, k, None, false).await?;
    value
        .map(|v| records::decode_value(&v))
        .transpose()
        .map_err(|why| BrokerError::Corrupt(format!("{SHARE_STATE_TOPIC} record: {why}")))
}

/// Stores share partition `k`'s state (`None`: forgets it); returns once
/// durable.
///
/// A partition of `__share_group_state` not served yet (just created on
/// demand, being replayed after a change of leader) is waited for, up to
/// [`STORE_WAIT_MS`]: the acknowledgement waiting on this store is
/// answered late rather than refused.
pub async fn store(
    core: &Rc<Core>,
    k: &ShareKey,
    s: Option<&ShareSnapshot>,
) -> Result<(), BrokerError> {
    let value = s.map(records::encode_value);
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(STORE_WAIT_MS);
    loop {
        match at_home(core, k, Some(value.clone()), true).await {
            Err(e) if transient(&e) && std::time::Instant::now() < deadline => {
                glommio::timer::sleep(std::time::Duration::from_millis(STORE_RETRY_MS)).await;
            }
            r => return r.map(|_| ()),
        }
    }
}

/// How long a store waits for its partition to be served.
pub const STORE_WAIT_MS: u64 = 5_000;
/// Between two tries of a store.
const STORE_RETRY_MS: u64 = 20;

/// An error that a moment fixes: the partition is being replayed, or its
/// leader is moving.
fn transient(e: &BrokerError) -> bool {
    matches!(
        e,
        BrokerError::NotLeader { .. }
            | BrokerError::CoreUnavailable { .. }
            | BrokerError::Storage {
                kind: crate::error::StorageFailure::Recovering,
                ..
            }
    )
}

/// Reads or writes at the state's home.
async fn at_home(
    core: &Rc<Core>,
    k: &ShareKey,
    value: Option<Option<Vec<u8>>>,
    write: bool,
) -> Result<Option<Vec<u8>>, BrokerError> {
    let home = match home_of(core, k)? {
        Some(h) => h,
        // Nothing was ever stored: nothing to read; the first store
        // creates the topic (then retried by the client if its
        // partitions are not served yet).
        None if !write => return Ok(None),
        None => {
            crate::coordinator::create_on_demand(core, &core.shares.states).await?;
            home_of(core, k)?.ok_or_else(|| BrokerError::NotLeader {
                topic: SHARE_STATE_TOPIC.to_string(),
                partition: 0,
                leader: 0,
            })?
        }
    };
    match home {
        Home::Core(c, q) if c == core.id => here(core, q, k.clone(), value, write).await,
        Home::Core(c, q) => {
            let key = k.clone();
            core.call(c, std::time::Duration::ZERO, |reply| CoreMsg::ShareState {
                partition: q,
                key,
                value,
                write,
                reply,
            })
            .await?
        }
        Home::Node(node, q) => {
            let at = (SHARE_STATE_TOPIC.to_string(), q);
            let unavailable = on_node_failed(&at, node);
            let link = crate::replica::link_to(core, node, &at)
                .await
                .map_err(unavailable)?;
            let (r, v) = link
                .share_state(records::encode_key(k), value.flatten(), write)
                .await
                .map_err(|e| unavailable(e.chain().to_string()))?;
            if r.error != 0 {
                return Err(unavailable(r.message.unwrap_or_default()));
            }
            Ok(v)
        }
    }
}

/// The error of a call to the node holding `topic`-`partition` that
/// failed or was refused (`why`).
pub(crate) fn on_node_failed(
    (topic, partition): &(String, u32),
    node: u64,
) -> impl Fn(String) -> BrokerError + Copy + '_ {
    move |why| BrokerError::CoreUnavailable {
        core: 0,
        reason: format!("{topic}-{partition} on node {node}: {why}"),
    }
}

/// Reads or writes share partition `k`'s state in partition `q` of
/// `__share_group_state`, which this core leads (another core's or
/// node's request, or this core's own).
pub async fn here(
    core: &Rc<Core>,
    q: u32,
    k: ShareKey,
    value: Option<Option<Vec<u8>>>,
    write: bool,
) -> Result<Option<Vec<u8>>, BrokerError> {
    let states = &core.shares.states;
    if core.locate(SHARE_STATE_TOPIC, q)? != core.id {
        return Err(BrokerError::NotLeader {
            topic: SHARE_STATE_TOPIC.to_string(),
            partition: q,
            leader: 0,
        });
    }
    if !states.hosting.ready(q) {
        return Err(BrokerError::Storage {
            kind: crate::error::StorageFailure::Recovering,
            message: format!("{SHARE_STATE_TOPIC}-{q} is being loaded: retry"),
        });
    }
    if !write {
        let parts = states.parts.borrow();
        return Ok(parts
            .get(&q)
            .and_then(|m| m.get(&k))
            .map(records::encode_value));
    }
    let value = value.flatten();
    let decoded = value
        .as_deref()
        .map(records::decode_value)
        .transpose()
        .map_err(|why| BrokerError::InvalidRequest(format!("share state: {why}")))?;
    let record = (Bytes::from(records::encode_key(&k)), value.map(Bytes::from));
    crate::coordinator::write(core, SHARE_STATE_TOPIC, q, std::iter::once(record)).await?;
    let mut parts = states.parts.borrow_mut();
    let m = parts.entry(q).or_default();
    match decoded {
        Some(s) => {
            m.insert(k, s);
        }
        None => {
            m.remove(&k);
        }
    }
    Ok(None)
}

/// Another node's read or write (this core leads the partition).
pub async fn serve_remote(
    core: &Rc<Core>,
    key: Vec<u8>,
    value: Option<Vec<u8>>,
    write: bool,
) -> (weir_replication::data::MarkerResult, Option<Vec<u8>>) {
    let r = match records::decode_key(&key) {
        Err(why) => Err(BrokerError::InvalidRequest(format!(
            "share state key: {why}"
        ))),
        Ok(k) => match home_of(core, &k) {
            Ok(Some(Home::Core(c, q))) if c == core.id => {
                here(core, q, k, Some(value), write).await
            }
            Ok(_) => Err(BrokerError::NotLeader {
                topic: SHARE_STATE_TOPIC.to_string(),
                partition: 0,
                leader: 0,
            }),
            Err(e) => Err(e),
        },
    };
    match r {
        Ok(v) => (Default::default(), v),
        Err(e) => (
            weir_replication::data::MarkerResult {
                error: e.code().as_u16(),
                message: Some(e.to_string()),
            },
            None,
        ),
    }
}
