//! The transactions as a machine of the coordinator runtime
//! ([`crate::coordinator`]): their state lives in `__transaction_state`;
//! the runtime replays its partitions into the core's [`Txns`], the
//! markers of transactions left prepared are written again, and the
//! timeouts start once the core's replay is done.

use std::rc::Rc;

use weir_txn::{records, Transactions};

use super::registry::{txn_config, Txns};
use super::{coordinator, TXN_TOPIC, TXN_TOPIC_PARTITIONS};
use crate::coordinator::{Hosting, Machine, TopicPlan};
use crate::shard::Core;

impl Machine for Txns {
    fn topic(&self) -> &'static str {
        TXN_TOPIC
    }

    fn hosting(&self) -> &Hosting {
        &self.hosting
    }

    fn topic_plan(&self, core: &Core) -> TopicPlan {
        TopicPlan::compacted(core, TXN_TOPIC_PARTITIONS)
    }

    fn forget(&self, p: u32, _n: u32) {
        self.parts.borrow_mut().remove(&p);
        // Its markers tasks stop: a replay starts its own.
        *self.generations.borrow_mut().entry(p).or_default() += 1;
    }

    fn replay(&self, _core: &Core, p: u32, key: Option<&[u8]>, value: Option<&[u8]>) {
        let Some(key) = key else {
            return;
        };
        match records::decode(key, value) {
            Ok(r) => self
                .parts
                .borrow_mut()
                .entry(p)
                .or_insert_with(|| Transactions::new(txn_config()))
                .replay(r),
            Err(why) => {
                tracing::warn!(partition = p, why, "unreadable {TXN_TOPIC} record skipped")
            }
        }
    }

    fn replayed(&self, core: &Rc<Core>, p: Option<(u32, u32)>) {
        // The markers of transactions a previous coordinator prepared.
        let pending: Vec<(u32, weir_txn::Markers)> = self
            .parts
            .borrow()
            .iter()
            .filter(|(q, _)| p.is_none_or(|(p, _)| p == **q))
            .flat_map(|(q, t)| t.pending_markers().into_iter().map(|m| (*q, m)))
            .collect();
        for (q, markers) in pending {
            let core = core.clone();
            let generation = self.generation(q);
            glommio::spawn_local(async move {
                coordinator::write_markers(&core, q, generation, markers).await
            })
            .detach();
        }
    }

    fn started(&self, core: &Rc<Core>) {
        glommio::spawn_local(coordinator::expiry_loop(core.clone())).detach();
    }
}
