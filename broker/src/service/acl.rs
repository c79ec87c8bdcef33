//! Authorization: may this connection's principal do this? Kafka's model
//! (`weir_replication::security::authorize`) over the ACLs of the cluster
//! metadata, each core checking its own copy. Both listeners ask the same
//! [`check`], so both protocols give the same answer. Off unless
//! `--authorizer acl`; `--super-users` may do everything.
//!
//! And the ACLs themselves: created and deleted through the metadata
//! quorum (Kafka's CreateAcls / DeleteAcls, `weir acl`), listed with
//! filters (DescribeAcls).

use std::rc::Rc;

use weir_replication::meta::AclBinding;
use weir_replication::security::{authorize, code, AclFilter};
use weir_replication::Command;

use crate::error::{BrokerError, Denied};
use crate::service::auth::Session;
use crate::shard::Core;

/// What a request touches.
#[derive(Debug, Clone, Copy)]
pub enum Resource<'a> {
    /// A topic.
    Topic(&'a str),
    /// A consumer group.
    Group(&'a str),
    /// The cluster.
    Cluster,
}

/// An operation (Kafka's, by its code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Read.
    Read,
    /// Write.
    Write,
    /// Create.
    Create,
    /// Delete.
    Delete,
    /// Alter.
    Alter,
    /// Describe.
    Describe,
    /// DescribeConfigs.
    DescribeConfigs,
    /// AlterConfigs.
    AlterConfigs,
    /// IdempotentWrite.
    IdempotentWrite,
}

impl Op {
    fn code(self) -> i8 {
        match self {
            Op::Read => code::READ,
            Op::Write => code::WRITE,
            Op::Create => code::CREATE,
            Op::Delete => code::DELETE,
            Op::Alter => code::ALTER,
            Op::Describe => code::DESCRIBE,
            Op::DescribeConfigs => code::DESCRIBE_CONFIGS,
            Op::AlterConfigs => code::ALTER_CONFIGS,
            Op::IdempotentWrite => code::IDEMPOTENT_WRITE,
        }
    }

    /// Kafka's name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "Read",
            Op::Write => "Write",
            Op::Create => "Create",
            Op::Delete => "Delete",
            Op::Alter => "Alter",
            Op::Describe => "Describe",
            Op::DescribeConfigs => "DescribeConfigs",
            Op::AlterConfigs => "AlterConfigs",
            Op::IdempotentWrite => "IdempotentWrite",
        }
    }
}

/// The host part of a peer address (`*`-free: what host ACLs name).
fn host_of(peer: &str) -> &str {
    peer.rsplit_once(':')
        .map_or(peer, |(h, _)| h.trim_matches(['[', ']']))
}

/// Whether the session may do `op` on `resource`.
pub fn allowed(core: &Core, session: &Session, op: Op, resource: Resource<'_>) -> bool {
    let auth = &core.shared.config.authorization;
    if !auth.enabled {
        return true;
    }
    let Some(principal) = session.principal() else {
        return false;
    };
    if auth.super_users.contains(&principal) {
        return true;
    }
    let (rt, name) = match resource {
        Resource::Topic(t) => (code::TOPIC, t),
        Resource::Group(g) => (code::GROUP, g),
        Resource::Cluster => (code::CLUSTER, code::CLUSTER_NAME),
    };
    let acls = core.acls.current(&core.shared.acls);
    authorize(
        &acls,
        &principal,
        host_of(&session.peer),
        op.code(),
        rt,
        name,
        auth.allow_if_no_acl,
    )
}

/// Whether the session may have an idempotent producer id: IdempotentWrite
/// on the cluster, or Write on some topic (Kafka 2.8+, KIP-679).
pub fn may_write_idempotently(core: &Core, session: &Session) -> bool {
    if allowed(core, session, Op::IdempotentWrite, Resource::Cluster) {
        return true;
    }
    if !core.shared.config.authorization.enabled {
        return true;
    }
    let Some(principal) = session.principal() else {
        return false;
    };
    let host = host_of(&session.peer);
    let acls = core.acls.current(&core.shared.acls);
    // A topic some allow covers, that no deny takes back.
    acls.iter()
        .filter(|a| {
            a.resource_type == code::TOPIC
                && a.permission == code::ALLOW
                && [code::WRITE, code::ALL].contains(&a.operation)
        })
        .any(|a| {
            let name = a.resource_name.as_str();
            authorize(
                &acls,
                &principal,
                host,
                code::WRITE,
                code::TOPIC,
                name,
                false,
            )
        })
}

/// Whether the session may see group `g` in listings (ListGroups,
/// OffsetFetch of several groups): Describe on the group or on the
/// cluster (Kafka's).
pub fn may_describe_group(core: &Core, session: &Session, g: &str) -> bool {
    allowed(core, session, Op::Describe, Resource::Group(g))
        || allowed(core, session, Op::Describe, Resource::Cluster)
}

/// [`allowed`], or the error to answer with.
pub fn check(
    core: &Core,
    session: &Session,
    op: Op,
    resource: Resource<'_>,
) -> Result<(), BrokerError> {
    if allowed(core, session, op, resource) {
        return Ok(());
    }
    let (kind, what) = match resource {
        Resource::Topic(t) => (Denied::Topic, format!("topic `{t}`")),
        Resource::Group(g) => (Denied::Group, format!("group `{g}`")),
        Resource::Cluster => (Denied::Cluster, "the cluster".to_string()),
    };
    Err(BrokerError::Unauthorized {
        kind,
        principal: session
            .principal()
            .unwrap_or_else(|| "a client not logged in".into()),
        operation: op.name(),
        resource: what,
    })
}

/// Why an ACL change failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AclError {
    /// The broker runs without an authorizer.
    #[error("ACLs cannot be changed: the broker runs without --authorizer acl")]
    SecurityDisabled,
    /// A binding or filter Kafka would refuse.
    #[error("{0}")]
    Invalid(String),
    /// The metadata could not be changed.
    #[error("the cluster metadata was not changed: {0}")]
    Metadata(String),
}

impl AclError {
    /// The code both protocols answer with.
    pub fn code(&self) -> weir_proto::error_code::ErrorCode {
        use weir_proto::error_code::ErrorCode;
        match self {
            AclError::SecurityDisabled => ErrorCode::SecurityDisabled,
            AclError::Invalid(_) => ErrorCode::InvalidRequest,
            AclError::Metadata(_) => ErrorCode::Unknown,
        }
    }
}

async fn propose(core: &Rc<Core>, command: Command) -> Result<(), AclError> {
    core.shared
        .controller
        .propose(command)
        .await
        .map_err(|e| AclError::Metadata(e.to_string()))?;
    // Served on this node from the answer on, not only once the metadata
    // follower gets to it.
    core.shared
        .publish_security(&core.shared.controller.state().security);
    Ok(())
}

/// Creates `bindings`; one result each, in order.
pub async fn create(core: &Rc<Core>, bindings: Vec<AclBinding>) -> Vec<Result<(), AclError>> {
    if !core.shared.config.authorization.enabled {
        return bindings
            .iter()
            .map(|_| Err(AclError::SecurityDisabled))
            .collect();
    }
    let results: Vec<Result<(), AclError>> = bindings
        .iter()
        .map(|b| b.check().map_err(AclError::Invalid))
        .collect();
    let good: Vec<AclBinding> = bindings
        .into_iter()
        .zip(&results)
        .filter(|(_, r)| r.is_ok())
        .map(|(b, _)| b)
        .collect();
    if good.is_empty() {
        return results;
    }
    match propose(core, Command::CreateAcls { acls: good }).await {
        Ok(()) => results,
        Err(e) => results.into_iter().map(|r| r.and(Err(e.clone()))).collect(),
    }
}

/// The bindings `filter` matches.
pub fn describe(core: &Core, filter: &AclFilter) -> Vec<AclBinding> {
    core.shared
        .controller
        .state()
        .security
        .acls
        .iter()
        .filter(|b| filter.matches(b))
        .cloned()
        .collect()
}

/// Deletes what each filter matches; per filter, the bindings deleted.
pub async fn delete(
    core: &Rc<Core>,
    filters: Vec<AclFilter>,
) -> Vec<Result<Vec<AclBinding>, AclError>> {
    if !core.shared.config.authorization.enabled {
        return filters
            .iter()
            .map(|_| Err(AclError::SecurityDisabled))
            .collect();
    }
    let matched: Vec<Vec<AclBinding>> = filters.iter().map(|f| describe(core, f)).collect();
    let mut all: Vec<AclBinding> = matched.iter().flatten().cloned().collect();
    all.sort();
    all.dedup();
    if all.is_empty() {
        return matched.into_iter().map(Ok).collect();
    }
    match propose(core, Command::DeleteAcls { acls: all }).await {
        Ok(()) => matched.into_iter().map(Ok).collect(),
        Err(e) => matched.iter().map(|_| Err(e.clone())).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::host_of;

    #[test]
    fn hosts_of_peers() {
        assert_eq!(host_of("10.1.2.3:9092"), "10.1.2.3");
        assert_eq!(host_of("[::1]:9092"), "::1");
        assert_eq!(host_of("internal"), "internal");
    }
}
