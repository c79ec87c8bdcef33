//! Kafka's classic group protocol on the coordinator's core: runs the
//! [`ClassicGroup`] state machine under the group's lock, stores its state
//! before any answer it released goes out, and holds JoinGroup and
//! SyncGroup requests (by token) until the state machine answers them.
//!
//! **Which core:** the coordinator's ([`super::coordinator`]); requests
//! arrive through [`super::coordinator::handle`].

use std::rc::Rc;

use futures_channel::oneshot;
use weir_proto::error_code::ErrorCode;

use crate::groups::api::{GroupResponse, Refusal};
use crate::groups::classic::{
    ClassicError, ClassicGroup, JoinRequest, JoinResponse, Output, SyncRequest, SyncResponse, Token,
};
use crate::groups::clock::mono_ms;
use crate::groups::store::{config, persist};
use crate::shard::Core;

/// Hands released answers to the requests waiting for them.
pub fn dispatch(core: &Core, outputs: Vec<Output>) {
    let mut held = core.groups.held.borrow_mut();
    for o in outputs {
        if let Some(tx) = held.remove(&o.token()) {
            let _ = tx.send(o);
        }
    }
}

/// The answers of a step whose state could not be stored: each becomes
/// COORDINATOR_NOT_AVAILABLE (the client finds the coordinator again and
/// retries), never a success the disk does not hold.
fn failed(outputs: Vec<Output>) -> Vec<Output> {
    outputs
        .into_iter()
        .map(|o| match o {
            Output::Join(t, r) => Output::Join(
                t,
                JoinResponse {
                    error: Some(ClassicError::CoordinatorNotAvailable),
                    generation_id: -1,
                    protocol_type: None,
                    protocol_name: None,
                    leader: String::new(),
                    members: Vec::new(),
                    ..r
                },
            ),
            Output::Sync(t, _) => Output::Sync(
                t,
                SyncResponse {
                    error: Some(ClassicError::CoordinatorNotAvailable),
                    protocol_type: None,
                    protocol_name: None,
                    assignment: bytes::Bytes::new(),
                },
            ),
        })
        .collect()
}

/// Runs `f` on the group's classic state under its lock (`create`: a
/// JoinGroup may create the group), stores what changed, then releases
/// the answers.
async fn classic_step<R>(
    core: &Rc<Core>,
    name: &str,
    create: bool,
    f: impl FnOnce(&mut ClassicGroup, u64) -> (R, Vec<Output>),
) -> Result<R, Refusal> {
    let _lock = core.groups.lock(name).await;
    let (r, outputs) = {
        let mut groups = core.groups.groups.borrow_mut();
        if !create && groups.get(name).is_none_or(|g| g.classic.is_none()) {
            return Err(Refusal(
                ErrorCode::UnknownMemberId.as_u16(),
                format!("group `{name}` has no classic members: rejoin"),
            ));
        }
        let g = groups.entry(name.to_string()).or_default();
        if !g.consumer.members.is_empty() {
            return Err(Refusal(
                ErrorCode::InconsistentAssignor.as_u16(),
                format!(
                    "group `{name}` is a consumer group with {} members (native or KIP-848): \
                     a classic JoinGroup member cannot join it",
                    g.consumer.members.len()
                ),
            ));
        }
        let c = g
            .classic
            .get_or_insert_with(|| ClassicGroup::new(config(core)));
        f(c, mono_ms())
    };
    let outputs = match persist(core, name).await {
        Ok(()) => outputs,
        Err(e) => {
            tracing::warn!(group = %name, error = %e.1, "storing a classic group failed");
            failed(outputs)
        }
    };
    dispatch(core, outputs);
    Ok(r)
}

/// A held request: forgets its token (and tells the state machine) if the
/// caller goes away before the answer.
struct Held<'a> {
    core: &'a Rc<Core>,
    group: &'a str,
    token: Token,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if self
            .core
            .groups
            .held
            .borrow_mut()
            .remove(&self.token)
            .is_some()
        {
            if let Some(c) = self
                .core
                .groups
                .groups
                .borrow_mut()
                .get_mut(self.group)
                .and_then(|g| g.classic.as_mut())
            {
                c.cancel(self.token);
            }
        }
    }
}

fn hold(core: &Core) -> (Token, oneshot::Receiver<Output>) {
    let token = core.groups.next_token.get();
    core.groups.next_token.set(token + 1);
    let (tx, rx) = oneshot::channel();
    core.groups.held.borrow_mut().insert(token, tx);
    (token, rx)
}

/// A member id's unique part.
fn fresh(core: &Core) -> String {
    let n = core.groups.next_token.get();
    core.groups.next_token.set(n + 1);
    format!("{:x}-{}-{n}", core.storage.now_ms(), core.id)
}

/// JoinGroup: answered when the join phase ends (or at once with an
/// error, or `MEMBER_ID_REQUIRED`).
pub async fn join(core: &Rc<Core>, group: &str, request: JoinRequest) -> GroupResponse {
    let (token, rx) = hold(core);
    let _held = Held { core, group, token };
    let fresh_id = fresh(core);
    if let Err(e) = classic_step(core, group, true, |c, now| {
        ((), c.join(now, token, request, || fresh_id))
    })
    .await
    {
        return GroupResponse::Refused(e.0, e.1);
    }
    match rx.await {
        Ok(Output::Join(_, r)) => GroupResponse::ClassicJoin(r),
        _ => GroupResponse::Refused(
            ErrorCode::StorageError.as_u16(),
            "the join was dropped by the coordinator".into(),
        ),
    }
}

/// SyncGroup: the leader's stores the assignments; a follower's waits
/// for it.
pub async fn sync(core: &Rc<Core>, group: &str, request: SyncRequest) -> GroupResponse {
    let (token, rx) = hold(core);
    let _held = Held { core, group, token };
    if let Err(e) = classic_step(core, group, false, |c, now| {
        ((), c.sync(now, token, request))
    })
    .await
    {
        return GroupResponse::Refused(e.0, e.1);
    }
    match rx.await {
        Ok(Output::Sync(_, r)) => GroupResponse::ClassicSync(r),
        _ => GroupResponse::Refused(
            ErrorCode::StorageError.as_u16(),
            "the sync was dropped by the coordinator".into(),
        ),
    }
}

/// Heartbeat: answered at once.
pub async fn heartbeat(
    core: &Rc<Core>,
    group: &str,
    member_id: &str,
    instance_id: Option<&str>,
    generation: i32,
) -> GroupResponse {
    match classic_step(core, group, false, |c, now| {
        (
            c.heartbeat(now, member_id, instance_id, generation),
            Vec::new(),
        )
    })
    .await
    {
        Ok(r) => GroupResponse::ClassicHeartbeat(r),
        Err(e) => GroupResponse::Refused(e.0, e.1),
    }
}

/// LeaveGroup: one result per member.
pub async fn leave(
    core: &Rc<Core>,
    group: &str,
    members: &[(String, Option<String>)],
) -> GroupResponse {
    match classic_step(core, group, false, |c, now| c.leave(now, members)).await {
        Ok(r) => GroupResponse::ClassicLeave(r),
        Err(e) => GroupResponse::Refused(e.0, e.1),
    }
}

/// A classic error as a Weir error (commits through the native path).
pub(crate) fn refusal(e: &ClassicError) -> Refusal {
    let code = match e {
        ClassicError::UnknownMemberId => ErrorCode::UnknownMemberId,
        ClassicError::IllegalGeneration { .. } => ErrorCode::IllegalGeneration,
        ClassicError::RebalanceInProgress => ErrorCode::RebalanceInProgress,
        ClassicError::FencedInstanceId => ErrorCode::FencedInstanceId,
        ClassicError::CoordinatorNotAvailable | ClassicError::NotCoordinator => {
            ErrorCode::Recovering
        }
        _ => ErrorCode::InvalidRequest,
    };
    Refusal(code.as_u16(), e.message())
}
