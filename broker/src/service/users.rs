//! Users' SCRAM credentials: listed and changed through the cluster
//! metadata (Kafka's DescribeUserScramCredentials and
//! AlterUserScramCredentials; `weir user`). A change is answered once the
//! controller quorum committed it and this node applied it; every node
//! then checks logins against it.

use std::collections::BTreeSet;
use std::rc::Rc;

use weir_proto::error_code::ErrorCode;
use weir_proto::sasl::{Mechanism, ScramCredential};
use weir_replication::meta::{ScramDeletion, ScramUpsertion, StoredScram};
use weir_replication::Command;

use crate::shard::Core;

/// Why one user's change or description failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UserError {
    /// No such user, or no credential of that mechanism.
    #[error("{0}")]
    NotFound(String),
    /// The user (and mechanism) appears twice in one request.
    #[error("{0}")]
    Duplicate(String),
    /// A credential the broker does not accept (iterations, empty salt or name).
    #[error("{0}")]
    Unacceptable(String),
    /// A mechanism number that is not a SCRAM mechanism.
    #[error("unknown SCRAM mechanism {0} (1: SCRAM-SHA-256, 2: SCRAM-SHA-512)")]
    UnsupportedMechanism(i8),
    /// The metadata could not be changed (no controller quorum, …).
    #[error("the cluster metadata was not changed: {0}")]
    Metadata(String),
}

impl UserError {
    /// The code both protocols answer with.
    pub fn code(&self) -> ErrorCode {
        match self {
            UserError::NotFound(_) => ErrorCode::ResourceNotFound,
            UserError::Duplicate(_) => ErrorCode::DuplicateResource,
            UserError::Unacceptable(_) => ErrorCode::UnacceptableCredential,
            UserError::UnsupportedMechanism(_) => ErrorCode::UnsupportedSaslMechanism,
            UserError::Metadata(_) => ErrorCode::Unknown,
        }
    }
}

/// A credential to set: the client salted the password (Kafka's
/// upsertion), or the broker salts it (`weir user add`).
#[derive(Debug, Clone)]
pub struct Upsertion {
    /// User.
    pub user: String,
    /// Kafka's mechanism number.
    pub mechanism: i8,
    /// Iterations.
    pub iterations: i32,
    /// Salt.
    pub salt: Vec<u8>,
    /// `Hi(password, salt, iterations)`.
    pub salted_password: Vec<u8>,
}

/// One user's credentials as described: `(mechanism number, iterations)`.
pub type Described = Vec<(i8, i32)>;

/// Removes `deletions` (user, mechanism) and sets `upsertions`; one
/// result per user named, in the order first named. A request whose
/// changes all fail proposes nothing.
pub async fn alter_scram(
    core: &Rc<Core>,
    deletions: Vec<(String, i8)>,
    upsertions: Vec<Upsertion>,
) -> Vec<(String, Result<(), UserError>)> {
    let state = core.shared.controller.state();
    let mut order: Vec<String> = Vec::new();
    let mut errors: std::collections::HashMap<String, UserError> = Default::default();
    let mut seen: BTreeSet<(String, i8)> = BTreeSet::new();
    let mut dups: BTreeSet<(String, i8)> = BTreeSet::new();
    for (u, m) in deletions
        .iter()
        .map(|(u, m)| (u, m))
        .chain(upsertions.iter().map(|x| (&x.user, &x.mechanism)))
    {
        if !order.contains(u) {
            order.push(u.clone());
        }
        if !seen.insert((u.clone(), *m)) {
            dups.insert((u.clone(), *m));
        }
    }
    let mut fail = |user: &str, e: UserError| {
        errors.entry(user.to_string()).or_insert(e);
    };
    for (u, m) in &dups {
        fail(
            u,
            UserError::Duplicate(format!(
                "a credential of `{u}` (mechanism {m}) is named twice in one request"
            )),
        );
    }
    let mut dels = Vec::new();
    for (user, m) in deletions {
        if Mechanism::from_scram_type(m).is_none() {
            fail(&user, UserError::UnsupportedMechanism(m));
            continue;
        }
        let exists = state
            .security
            .users
            .get(&user)
            .is_some_and(|c| c.scram.contains_key(&m));
        if !exists {
            fail(
                &user,
                UserError::NotFound(format!(
                    "`{user}` has no credential of mechanism {m} to delete"
                )),
            );
            continue;
        }
        dels.push(ScramDeletion { user, mechanism: m });
    }
    let mut ups = Vec::new();
    for x in upsertions {
        let Some(mech) = Mechanism::from_scram_type(x.mechanism) else {
            fail(&x.user, UserError::UnsupportedMechanism(x.mechanism));
            continue;
        };
        if x.user.is_empty() || x.user.len() > weir_proto::sasl::USER_BYTES_MAX {
            fail(
                &x.user,
                UserError::Unacceptable("a user name must be 1 to 256 bytes".into()),
            );
            continue;
        }
        let iterations = u32::try_from(x.iterations).unwrap_or(0);
        match ScramCredential::from_salted(mech, x.salt, iterations, &x.salted_password) {
            Ok(c) => ups.push(ScramUpsertion {
                user: x.user,
                mechanism: x.mechanism,
                credential: StoredScram {
                    salt: c.salt,
                    iterations: c.iterations,
                    stored_key: c.stored_key,
                    server_key: c.server_key,
                },
            }),
            Err(e) => fail(&x.user, UserError::Unacceptable(e.to_string())),
        }
    }
    // A user with any failed change gets none of its changes applied.
    dels.retain(|d| !errors.contains_key(&d.user));
    ups.retain(|u| !errors.contains_key(&u.user));
    if !dels.is_empty() || !ups.is_empty() {
        let command = Command::AlterScramCredentials {
            deletions: dels,
            upsertions: ups,
        };
        if let Err(e) = core.shared.controller.propose(command).await {
            let e = UserError::Metadata(e.to_string());
            for u in &order {
                errors.entry(u.clone()).or_insert_with(|| e.clone());
            }
        }
    }
    order
        .into_iter()
        .map(|u| {
            let r = errors.remove(&u).map_or(Ok(()), Err);
            (u, r)
        })
        .collect()
}

/// The credentials of `users` (`None`: every user), as this node's copy
/// of the metadata has them: mechanisms and iterations, never keys.
pub fn describe_scram(
    core: &Core,
    users: Option<Vec<String>>,
) -> Vec<(String, Result<Described, UserError>)> {
    let state = core.shared.controller.state();
    let describe = |c: &weir_replication::meta::UserCredentials| -> Described {
        c.scram
            .iter()
            .map(|(m, s)| (*m, s.iterations as i32))
            .collect()
    };
    match users {
        None => state
            .security
            .users
            .iter()
            .map(|(u, c)| (u.clone(), Ok(describe(c))))
            .collect(),
        Some(names) => {
            let mut seen = BTreeSet::new();
            let dups: BTreeSet<String> = names
                .iter()
                .filter(|n| !seen.insert(n.to_string()))
                .cloned()
                .collect();
            let mut out = Vec::new();
            let mut done = BTreeSet::new();
            for n in names {
                if !done.insert(n.clone()) {
                    continue;
                }
                let r = if dups.contains(&n) {
                    Err(UserError::Duplicate(format!(
                        "`{n}` is named twice in one request"
                    )))
                } else {
                    state.security.users.get(&n).map(describe).ok_or_else(|| {
                        UserError::NotFound(format!(
                            "Attempt to describe a user credential that does not exist: `{n}`"
                        ))
                    })
                };
                out.push((n, r));
            }
            out
        }
    }
}
