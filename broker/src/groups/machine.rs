//! The consumer groups as a machine of the coordinator runtime
//! ([`crate::coordinator`]): their state lives in `__consumer_offsets`;
//! the runtime replays its partitions into the core's [`Groups`] through
//! `store::apply`, and the machine's own work (member expiry) starts once
//! the core's replay is done.

use std::rc::Rc;

use bytes::Bytes;

use crate::coordinator::{Hosting, Machine, TopicPlan};
use crate::groups::clock::mono_ms;
use crate::groups::records::{self, OFFSETS_TOPIC};
use crate::groups::registry::Groups;
use crate::groups::store::{apply, offsets_topic_configs, rewrite_legacy};
use crate::shard::Core;

impl Machine for Groups {
    fn topic(&self) -> &'static str {
        OFFSETS_TOPIC
    }

    fn hosting(&self) -> &Hosting {
        &self.hosting
    }

    fn topic_plan(&self, core: &Core) -> TopicPlan {
        let c = &core.shared.config;
        TopicPlan {
            partitions: c.offsets_partitions,
            configs: offsets_topic_configs(c.offsets_segment_bytes),
            replication_factor: c.offsets_replication_factor,
        }
    }

    fn forget(&self, p: u32, n: u32) {
        self.forget_partition(p, n);
        self.legacy.borrow_mut().remove(&p);
    }

    fn replay(&self, core: &Core, p: u32, key: Option<&[u8]>, value: Option<&[u8]>) {
        if apply(core, key, value, p) {
            if let Some(k) = key {
                let live = value.is_some();
                let mut legacy = self.legacy.borrow_mut();
                legacy
                    .entry(p)
                    .or_default()
                    .insert(Bytes::copy_from_slice(k), live);
            }
        }
    }

    fn replay_transactional(
        &self,
        _core: &Core,
        p: u32,
        producer_id: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
    ) {
        // Only offsets are written in a transaction.
        let Some(Ok(r)) = key.map(|k| records::decode_record(k, value)) else {
            tracing::warn!(partition = p, "unreadable transactional record skipped");
            return;
        };
        if let (
            records::RecordKey::Offset {
                group,
                topic,
                partition,
            },
            Some(records::Value::Offset(v)),
        ) = (r.key, r.value)
        {
            self.replay_pending(group, producer_id, (topic, partition), v);
        }
    }

    fn replay_marker(&self, core: &Core, p: u32, producer_id: i64, commit: bool) {
        crate::groups::coordinator::end_txn(core, p, producer_id, commit);
    }

    fn replayed(&self, core: &Rc<Core>, p: Option<(u32, u32)>) {
        // Members replayed get a fresh session from now.
        let now = mono_ms();
        match p {
            Some((p, n)) => self.fresh_sessions(now, |name| records::partition_for(name, n) == p),
            None => self.fresh_sessions(now, |_| true),
        }
        let legacy = match p {
            Some((p, _)) => self
                .legacy
                .borrow_mut()
                .remove(&p)
                .into_iter()
                .map(|l| (p, l))
                .collect(),
            None => std::mem::take(&mut *self.legacy.borrow_mut()),
        };
        for (p, keys) in legacy {
            let keys: Vec<Bytes> = keys
                .into_iter()
                .filter_map(|(k, live)| live.then_some(k))
                .collect();
            if !keys.is_empty() {
                let core = core.clone();
                glommio::spawn_local(async move { rewrite_legacy(&core, p, keys).await }).detach();
            }
        }
    }

    fn started(&self, core: &Rc<Core>) {
        glommio::spawn_local(crate::groups::coordinator::expiry_loop(core.clone())).detach();
    }
}
