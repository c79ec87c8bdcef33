//! The security part of the cluster metadata: users' SCRAM credentials,
//! ACLs and client quotas — Kafka's model, with Kafka's numeric codes, so
//! that the Kafka admin APIs map onto it one to one.
//!
//! Changes arrive as [`crate::meta::Command`]s whose decisions the
//! proposer made (which bindings a DeleteAcls filter matched, the salted
//! credential), so applying them is deterministic and never refused.

use rkyv::{Archive, Deserialize, Serialize};
use std::collections::BTreeMap;

/// A SCRAM credential as stored: salt, iterations, `StoredKey`,
/// `ServerKey` (RFC 5802) — nothing a reader can log in with.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct StoredScram {
    /// Salt.
    pub salt: Vec<u8>,
    /// PBKDF2 iterations.
    pub iterations: u32,
    /// `H(ClientKey)`.
    pub stored_key: Vec<u8>,
    /// `HMAC(SaltedPassword, "Server Key")`.
    pub server_key: Vec<u8>,
}

/// One user's credentials.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct UserCredentials {
    /// By Kafka's `ScramMechanism` number (1: SCRAM-SHA-256, 2: SCRAM-SHA-512).
    pub scram: BTreeMap<i8, StoredScram>,
}

/// A credential to set (Kafka's AlterUserScramCredentials upsertion, the
/// salted password already turned into keys).
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ScramUpsertion {
    /// User.
    pub user: String,
    /// Kafka's `ScramMechanism` number.
    pub mechanism: i8,
    /// The credential.
    pub credential: StoredScram,
}

/// A credential to remove.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ScramDeletion {
    /// User.
    pub user: String,
    /// Kafka's `ScramMechanism` number.
    pub mechanism: i8,
}

/// One ACL (Kafka's `AclBinding`), with Kafka's codes: resource type
/// (2 topic, 3 group, 4 cluster, 5 transactional id), pattern type
/// (3 literal, 4 prefixed), operation (2 All … 12 IdempotentWrite) and
/// permission (2 deny, 3 allow). `principal` is `User:name`; `host` is
/// an address or `*`.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AclBinding {
    /// Resource type.
    pub resource_type: i8,
    /// Resource name (`*`: every resource of the type when literal;
    /// `kafka-cluster` for the cluster).
    pub resource_name: String,
    /// Pattern type.
    pub pattern_type: i8,
    /// Principal, `User:name` (`User:*`: everyone).
    pub principal: String,
    /// Host, or `*`.
    pub host: String,
    /// Operation.
    pub operation: i8,
    /// Permission.
    pub permission: i8,
}

/// One component of a quota entity: its type (`user`, `client-id`) and
/// name (`None`: the default for that type).
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QuotaEntityPart {
    /// `user` or `client-id`.
    pub entity_type: String,
    /// The name, or `None` for the type's default.
    pub name: Option<String>,
}

/// Quota values of one entity (its parts sorted by type).
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct QuotaEntry {
    /// The entity, parts sorted by type.
    pub entity: Vec<QuotaEntityPart>,
    /// Values by Kafka key (`producer_byte_rate`, `consumer_byte_rate`,
    /// `request_percentage`), each an `f64`'s bits.
    pub values: BTreeMap<String, u64>,
}

/// A change to one entity's quotas.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct QuotaAlteration {
    /// The entity, parts sorted by type.
    pub entity: Vec<QuotaEntityPart>,
    /// Values to set (`f64` bits).
    pub set: Vec<(String, u64)>,
    /// Keys to remove.
    pub remove: Vec<String>,
}

/// Users, ACLs and quotas.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct SecurityState {
    /// Users by name.
    pub users: BTreeMap<String, UserCredentials>,
    /// ACLs, sorted, without duplicates.
    pub acls: Vec<AclBinding>,
    /// Quotas, sorted by entity; an entity without values is removed.
    pub quotas: Vec<QuotaEntry>,
}

impl SecurityState {
    /// Removes `deletions` (a missing one is nothing to do), then sets
    /// `upsertions`.
    pub fn alter_scram(&mut self, deletions: &[ScramDeletion], upsertions: &[ScramUpsertion]) {
        for d in deletions {
            if let Some(u) = self.users.get_mut(&d.user) {
                u.scram.remove(&d.mechanism);
                if u.scram.is_empty() {
                    self.users.remove(&d.user);
                }
            }
        }
        for u in upsertions {
            self.users
                .entry(u.user.clone())
                .or_default()
                .scram
                .insert(u.mechanism, u.credential.clone());
        }
    }

    /// Adds `acls` (one already there is nothing to do).
    pub fn create_acls(&mut self, acls: &[AclBinding]) {
        for a in acls {
            if let Err(i) = self.acls.binary_search(a) {
                self.acls.insert(i, a.clone());
            }
        }
    }

    /// Removes `acls` (one not there is nothing to do).
    pub fn delete_acls(&mut self, acls: &[AclBinding]) {
        for a in acls {
            if let Ok(i) = self.acls.binary_search(a) {
                self.acls.remove(i);
            }
        }
    }

    /// Applies quota changes, in order.
    pub fn alter_quotas(&mut self, changes: &[QuotaAlteration]) {
        for c in changes {
            let i = match self.quotas.binary_search_by(|e| e.entity.cmp(&c.entity)) {
                Ok(i) => i,
                Err(i) => {
                    self.quotas.insert(
                        i,
                        QuotaEntry {
                            entity: c.entity.clone(),
                            values: BTreeMap::new(),
                        },
                    );
                    i
                }
            };
            let values = &mut self.quotas[i].values;
            for k in &c.remove {
                values.remove(k);
            }
            for (k, v) in &c.set {
                values.insert(k.clone(), *v);
            }
            if values.is_empty() {
                self.quotas.remove(i);
            }
        }
    }
}

/// Kafka's numeric codes of ACL fields.
pub mod code {
    /// Resource type: any (filters only).
    pub const RESOURCE_ANY: i8 = 1;
    /// Resource type: topic.
    pub const TOPIC: i8 = 2;
    /// Resource type: consumer group.
    pub const GROUP: i8 = 3;
    /// Resource type: the cluster (its name is `kafka-cluster`).
    pub const CLUSTER: i8 = 4;
    /// Resource type: transactional id.
    pub const TRANSACTIONAL_ID: i8 = 5;
    /// Pattern type: any (filters only).
    pub const PATTERN_ANY: i8 = 1;
    /// Pattern type: whatever applies to a name (filters only).
    pub const MATCH: i8 = 2;
    /// Pattern type: the name itself (`*`: every name).
    pub const LITERAL: i8 = 3;
    /// Pattern type: every name that starts with it.
    pub const PREFIXED: i8 = 4;
    /// Operation: any (filters only).
    pub const OP_ANY: i8 = 1;
    /// Operation: all of them.
    pub const ALL: i8 = 2;
    /// Read.
    pub const READ: i8 = 3;
    /// Write.
    pub const WRITE: i8 = 4;
    /// Create.
    pub const CREATE: i8 = 5;
    /// Delete.
    pub const DELETE: i8 = 6;
    /// Alter.
    pub const ALTER: i8 = 7;
    /// Describe.
    pub const DESCRIBE: i8 = 8;
    /// ClusterAction.
    pub const CLUSTER_ACTION: i8 = 9;
    /// DescribeConfigs.
    pub const DESCRIBE_CONFIGS: i8 = 10;
    /// AlterConfigs.
    pub const ALTER_CONFIGS: i8 = 11;
    /// IdempotentWrite.
    pub const IDEMPOTENT_WRITE: i8 = 12;
    /// Permission: any (filters only).
    pub const PERMISSION_ANY: i8 = 1;
    /// Deny.
    pub const DENY: i8 = 2;
    /// Allow.
    pub const ALLOW: i8 = 3;
    /// The cluster resource's name.
    pub const CLUSTER_NAME: &str = "kafka-cluster";
}

impl AclBinding {
    /// Whether this binding's resource pattern covers `name` of `resource_type`.
    pub fn covers(&self, resource_type: i8, name: &str) -> bool {
        self.resource_type == resource_type
            && match self.pattern_type {
                code::LITERAL => self.resource_name == name || self.resource_name == "*",
                code::PREFIXED => name.starts_with(self.resource_name.as_str()),
                _ => false,
            }
    }

    /// Whether the binding is one Kafka would store: concrete codes, a
    /// principal `Type:name`, a non-empty name. `Err` says what is wrong.
    pub fn check(&self) -> Result<(), String> {
        if !(code::TOPIC..=code::TRANSACTIONAL_ID).contains(&self.resource_type) {
            return Err(format!(
                "resource type {} cannot be stored",
                self.resource_type
            ));
        }
        if ![code::LITERAL, code::PREFIXED].contains(&self.pattern_type) {
            return Err(format!(
                "pattern type {} cannot be stored (literal or prefixed)",
                self.pattern_type
            ));
        }
        if !(code::ALL..=code::IDEMPOTENT_WRITE).contains(&self.operation) {
            return Err(format!("operation {} cannot be stored", self.operation));
        }
        if ![code::DENY, code::ALLOW].contains(&self.permission) {
            return Err(format!(
                "permission {} cannot be stored (deny or allow)",
                self.permission
            ));
        }
        if self.resource_name.is_empty() {
            return Err("an empty resource name".into());
        }
        if self.resource_type == code::CLUSTER && self.resource_name != code::CLUSTER_NAME {
            return Err(format!(
                "the cluster resource is named `{}`",
                code::CLUSTER_NAME
            ));
        }
        if !self
            .principal
            .split_once(':')
            .is_some_and(|(t, n)| !t.is_empty() && !n.is_empty())
        {
            return Err(format!("principal `{}` is not `User:name`", self.principal));
        }
        if self.host.is_empty() {
            return Err("an empty host (`*` for any)".into());
        }
        Ok(())
    }
}

/// Kafka's `AclBindingFilter`: which bindings DescribeAcls lists and
/// DeleteAcls removes. `None` and the `*_ANY` codes match anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclFilter {
    /// Resource type or `RESOURCE_ANY`.
    pub resource_type: i8,
    /// Resource name, or any.
    pub resource_name: Option<String>,
    /// `LITERAL`, `PREFIXED`, `MATCH` (every binding that applies to the
    /// name) or `PATTERN_ANY`.
    pub pattern_type: i8,
    /// Principal, or any.
    pub principal: Option<String>,
    /// Host, or any.
    pub host: Option<String>,
    /// Operation or `OP_ANY`.
    pub operation: i8,
    /// Permission or `PERMISSION_ANY`.
    pub permission: i8,
}

impl AclFilter {
    /// Whether `b` passes the filter.
    pub fn matches(&self, b: &AclBinding) -> bool {
        let rt = self.resource_type == code::RESOURCE_ANY || self.resource_type == b.resource_type;
        let name = match (&self.resource_name, self.pattern_type) {
            (None, code::PATTERN_ANY | code::MATCH) => true,
            (None, p) => p == b.pattern_type,
            (Some(n), code::PATTERN_ANY) => &b.resource_name == n,
            (Some(n), code::MATCH) => b.covers(b.resource_type, n),
            (Some(n), p) => p == b.pattern_type && &b.resource_name == n,
        };
        let principal = self.principal.as_ref().is_none_or(|p| p == &b.principal);
        let host = self.host.as_ref().is_none_or(|h| h == &b.host);
        let op = self.operation == code::OP_ANY || self.operation == b.operation;
        let perm = self.permission == code::PERMISSION_ANY || self.permission == b.permission;
        rt && name && principal && host && op && perm
    }
}

/// Whether an ACL for `granted` allows `wanted` (Kafka's implications:
/// Read, Write, Delete and Alter imply Describe; AlterConfigs implies
/// DescribeConfigs; All implies everything).
fn implies(granted: i8, wanted: i8) -> bool {
    granted == wanted
        || granted == code::ALL
        || (wanted == code::DESCRIBE
            && [code::READ, code::WRITE, code::DELETE, code::ALTER].contains(&granted))
        || (wanted == code::DESCRIBE_CONFIGS && granted == code::ALTER_CONFIGS)
}

/// Kafka's authorizer (`StandardAuthorizer`) over `acls`: may `principal`
/// at `host` do `operation` on `name` of `resource_type`? A deny for the
/// operation (or All) wins; then an allow that implies it; a resource no
/// ACL covers at all is allowed only if `allow_if_no_acl`.
pub fn authorize(
    acls: &[AclBinding],
    principal: &str,
    host: &str,
    operation: i8,
    resource_type: i8,
    name: &str,
    allow_if_no_acl: bool,
) -> bool {
    let mut covered = false;
    let mut allowed = false;
    for a in acls.iter().filter(|a| a.covers(resource_type, name)) {
        covered = true;
        let who = a.principal == principal || a.principal == "User:*";
        let whence = a.host == "*" || a.host == host;
        if !(who && whence) {
            continue;
        }
        if a.permission == code::DENY && (a.operation == operation || a.operation == code::ALL) {
            return false;
        }
        if a.permission == code::ALLOW && implies(a.operation, operation) {
            allowed = true;
        }
    }
    allowed || (!covered && allow_if_no_acl)
}

/// Kafka's client-quota names: entity types and quota keys.
pub mod quota {
    /// Entity type: the principal's name (`alice` of `User:alice`).
    pub const USER: &str = "user";
    /// Entity type: the client id a Kafka client sends in each request.
    pub const CLIENT_ID: &str = "client-id";
    /// Bytes per second of produce requests.
    pub const PRODUCER_BYTE_RATE: &str = "producer_byte_rate";
    /// Bytes per second of fetch answers.
    pub const CONSUMER_BYTE_RATE: &str = "consumer_byte_rate";
    /// Percent of one core's time spent on the client's requests.
    pub const REQUEST_PERCENTAGE: &str = "request_percentage";
    /// The keys Weir enforces.
    pub const KEYS: [&str; 3] = [PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE];
}

/// The quota that applies to a client, and whose budget it spends: every
/// client with the same `user` and `client_id` tags shares one (`None`:
/// the entity that matched does not name that part, e.g. a quota on user
/// `alice` is shared by all her client ids).
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaMatch {
    /// The limit (bytes per second, or percent of a core).
    pub value: f64,
    /// The user the budget belongs to.
    pub user: Option<String>,
    /// The client id the budget belongs to.
    pub client_id: Option<String>,
}

/// Kafka's precedence (`DefaultQuotaCallback`): the first of
/// (user, client-id), (user, default client-id), (user), (default user,
/// client-id), (default user, default client-id), (default user),
/// (client-id), (default client-id) that sets `key` applies.
pub fn quota_for(
    quotas: &[QuotaEntry],
    user: &str,
    client_id: &str,
    key: &str,
) -> Option<QuotaMatch> {
    // `None`: the part is absent; `Some(None)`: the type's default.
    type Part<'a> = Option<Option<&'a str>>;
    let order: [(Part, Part); 8] = [
        (Some(Some(user)), Some(Some(client_id))),
        (Some(Some(user)), Some(None)),
        (Some(Some(user)), None),
        (Some(None), Some(Some(client_id))),
        (Some(None), Some(None)),
        (Some(None), None),
        (None, Some(Some(client_id))),
        (None, Some(None)),
    ];
    for (u, c) in order {
        // Parts sorted by type: `client-id` before `user`.
        let mut entity = Vec::with_capacity(2);
        if let Some(c) = c {
            entity.push(QuotaEntityPart {
                entity_type: quota::CLIENT_ID.into(),
                name: c.map(str::to_string),
            });
        }
        if let Some(u) = u {
            entity.push(QuotaEntityPart {
                entity_type: quota::USER.into(),
                name: u.map(str::to_string),
            });
        }
        let Ok(i) = quotas.binary_search_by(|e| e.entity.cmp(&entity)) else {
            continue;
        };
        if let Some(bits) = quotas[i].values.get(key) {
            return Some(QuotaMatch {
                value: f64::from_bits(*bits),
                user: u.map(|_| user.to_string()),
                client_id: c.map(|_| client_id.to_string()),
            });
        }
    }
    None
}

/// One component of Kafka's DescribeClientQuotas filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuotaComponent {
    /// The entity names exactly this (type, name).
    Exact(String, String),
    /// The entity has the type's default.
    Default(String),
    /// The entity has the type, any name or the default.
    Any(String),
}

/// Kafka's DescribeClientQuotas filter: every component must match a
/// part of the entity; `strict`: and the entity has no other part.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QuotaFilter {
    /// The components.
    pub components: Vec<QuotaComponent>,
    /// Whether the entity may have parts no component names.
    pub strict: bool,
}

impl QuotaComponent {
    /// A component as Kafka's DescribeClientQuotas sends it: match type 0
    /// (exact, with a name), 1 (the default) or 2 (any); `Err` says what
    /// is wrong.
    pub fn from_kafka(
        entity_type: String,
        match_type: i8,
        name: Option<String>,
    ) -> Result<QuotaComponent, String> {
        match (match_type, name) {
            (0, Some(name)) => Ok(QuotaComponent::Exact(entity_type, name)),
            (1, _) => Ok(QuotaComponent::Default(entity_type)),
            (2, _) => Ok(QuotaComponent::Any(entity_type)),
            (m, _) => Err(format!(
                "match type {m} for entity type `{entity_type}` (0 exact with a name, 1 default, 2 any)"
            )),
        }
    }
}

impl QuotaFilter {
    /// Whether `entry` passes.
    pub fn matches(&self, entry: &QuotaEntry) -> bool {
        let all = self.components.iter().all(|c| {
            entry.entity.iter().any(|p| match c {
                QuotaComponent::Exact(t, n) => &p.entity_type == t && p.name.as_ref() == Some(n),
                QuotaComponent::Default(t) => &p.entity_type == t && p.name.is_none(),
                QuotaComponent::Any(t) => &p.entity_type == t,
            })
        });
        all && (!self.strict || entry.entity.len() == self.components.len())
    }
}

impl QuotaAlteration {
    /// A change to `entity` (its parts put in the stored order: sorted by
    /// type).
    pub fn new(
        mut entity: Vec<QuotaEntityPart>,
        set: Vec<(String, u64)>,
        remove: Vec<String>,
    ) -> QuotaAlteration {
        entity.sort();
        QuotaAlteration {
            entity,
            set,
            remove,
        }
    }

    /// Whether Kafka would accept the change: parts of type `user` or
    /// `client-id`, each at most once, sorted; known keys; positive
    /// finite values, whole numbers for byte rates. `Err` says what is
    /// wrong.
    pub fn check(&self) -> Result<(), String> {
        if self.entity.is_empty() {
            return Err("a quota entity names a user, a client id or both".into());
        }
        for p in &self.entity {
            if p.entity_type != quota::USER && p.entity_type != quota::CLIENT_ID {
                return Err(format!(
                    "entity type `{}` is not supported (user, client-id)",
                    p.entity_type
                ));
            }
            if p.name.as_deref() == Some("") {
                return Err(format!("an empty {} name", p.entity_type));
            }
        }
        if !self.entity.is_sorted()
            || self
                .entity
                .windows(2)
                .any(|w| w[0].entity_type == w[1].entity_type)
        {
            return Err("each entity type may appear once".into());
        }
        for k in self.set.iter().map(|(k, _)| k).chain(&self.remove) {
            if !quota::KEYS.contains(&k.as_str()) {
                return Err(format!(
                    "quota `{k}` is not supported ({})",
                    quota::KEYS.join(", ")
                ));
            }
        }
        for (k, bits) in &self.set {
            let v = f64::from_bits(*bits);
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("{k} must be a positive number, not {v}"));
            }
            if k != quota::REQUEST_PERCENTAGE && v.fract() != 0.0 {
                return Err(format!(
                    "{k} must be a whole number of bytes per second, not {v}"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(name: &str, op: i8) -> AclBinding {
        AclBinding {
            resource_type: 2,
            resource_name: name.into(),
            pattern_type: 3,
            principal: "User:a".into(),
            host: "*".into(),
            operation: op,
            permission: 3,
        }
    }

    fn binding(rt: i8, name: &str, pattern: i8, who: &str, op: i8, perm: i8) -> AclBinding {
        AclBinding {
            resource_type: rt,
            resource_name: name.into(),
            pattern_type: pattern,
            principal: who.into(),
            host: "*".into(),
            operation: op,
            permission: perm,
        }
    }

    #[test]
    fn the_authorizer_follows_kafkas_rules() {
        use code::*;
        let acls = vec![
            binding(TOPIC, "telemetry.", PREFIXED, "User:agent", WRITE, ALLOW),
            binding(TOPIC, "telemetry.secret", LITERAL, "User:agent", ALL, DENY),
            binding(TOPIC, "logs", LITERAL, "User:*", READ, ALLOW),
            binding(GROUP, "*", LITERAL, "User:reader", READ, ALLOW),
        ];
        let can = |who: &str, op: i8, rt: i8, name: &str, open: bool| {
            authorize(&acls, who, "10.0.0.1", op, rt, name, open)
        };
        // A prefixed allow covers every matching topic and nothing else.
        assert!(can("User:agent", WRITE, TOPIC, "telemetry.cpu", false));
        assert!(
            can("User:agent", DESCRIBE, TOPIC, "telemetry.cpu", false),
            "Write implies Describe"
        );
        assert!(!can("User:agent", READ, TOPIC, "telemetry.cpu", false));
        assert!(!can("User:agent", WRITE, TOPIC, "metrics", false));
        // Deny wins.
        assert!(!can("User:agent", WRITE, TOPIC, "telemetry.secret", false));
        // A wildcard principal; a wildcard resource name.
        assert!(can("User:anyone", READ, TOPIC, "logs", false));
        assert!(can("User:reader", READ, GROUP, "g1", false));
        assert!(!can("User:agent", READ, GROUP, "g1", false));
        // No ACL covers `free`: allowed only if allow_if_no_acl.
        assert!(!can("User:x", WRITE, TOPIC, "free", false));
        assert!(can("User:x", WRITE, TOPIC, "free", true));
        // A covered resource is not open to others, whatever the setting.
        assert!(!can("User:x", WRITE, TOPIC, "telemetry.cpu", true));
        // Host-specific bindings.
        let mut by_host = binding(TOPIC, "h", LITERAL, "User:a", READ, ALLOW);
        by_host.host = "10.0.0.2".into();
        assert!(!authorize(
            &[by_host.clone()],
            "User:a",
            "10.0.0.1",
            READ,
            TOPIC,
            "h",
            false
        ));
        assert!(authorize(
            &[by_host],
            "User:a",
            "10.0.0.2",
            READ,
            TOPIC,
            "h",
            false
        ));
    }

    #[test]
    fn filters_match_as_kafkas() {
        use code::*;
        let b = binding(TOPIC, "telemetry.", PREFIXED, "User:agent", WRITE, ALLOW);
        let any = AclFilter {
            resource_type: RESOURCE_ANY,
            resource_name: None,
            pattern_type: PATTERN_ANY,
            principal: None,
            host: None,
            operation: OP_ANY,
            permission: PERMISSION_ANY,
        };
        assert!(any.matches(&b));
        let by_match = AclFilter {
            resource_name: Some("telemetry.cpu".into()),
            pattern_type: MATCH,
            ..any.clone()
        };
        assert!(by_match.matches(&b));
        let literal = AclFilter {
            resource_name: Some("telemetry.".into()),
            pattern_type: LITERAL,
            ..any.clone()
        };
        assert!(!literal.matches(&b));
        let other = AclFilter {
            principal: Some("User:other".into()),
            ..any
        };
        assert!(!other.matches(&b));
        assert!(b.check().is_ok());
        let mut bad = b.clone();
        bad.principal = "agent".into();
        assert!(bad.check().is_err());
    }

    #[test]
    fn changes_apply_idempotently() {
        let mut s = SecurityState::default();
        let cred = StoredScram {
            salt: vec![1],
            iterations: 4096,
            stored_key: vec![2],
            server_key: vec![3],
        };
        let up = |m| ScramUpsertion {
            user: "alice".into(),
            mechanism: m,
            credential: cred.clone(),
        };
        s.alter_scram(&[], &[up(1), up(2)]);
        assert_eq!(s.users["alice"].scram.len(), 2);
        let del = |m| ScramDeletion {
            user: "alice".into(),
            mechanism: m,
        };
        s.alter_scram(&[del(1), del(1)], &[]);
        assert_eq!(s.users["alice"].scram.len(), 1);
        s.alter_scram(&[del(2)], &[]);
        assert!(s.users.is_empty());

        s.create_acls(&[acl("b", 4), acl("a", 3), acl("b", 4)]);
        assert_eq!(s.acls, vec![acl("a", 3), acl("b", 4)]);
        s.delete_acls(&[acl("a", 3), acl("zz", 3)]);
        assert_eq!(s.acls, vec![acl("b", 4)]);

        let entity = vec![QuotaEntityPart {
            entity_type: "user".into(),
            name: Some("alice".into()),
        }];
        s.alter_quotas(&[QuotaAlteration {
            entity: entity.clone(),
            set: vec![("producer_byte_rate".into(), 1e7f64.to_bits())],
            remove: vec![],
        }]);
        assert_eq!(s.quotas.len(), 1);
        s.alter_quotas(&[QuotaAlteration {
            entity,
            set: vec![],
            remove: vec!["producer_byte_rate".into()],
        }]);
        assert!(s.quotas.is_empty());
    }

    fn entity(user: Option<Option<&str>>, client: Option<Option<&str>>) -> Vec<QuotaEntityPart> {
        let mut e = Vec::new();
        if let Some(c) = client {
            e.push(QuotaEntityPart {
                entity_type: quota::CLIENT_ID.into(),
                name: c.map(Into::into),
            });
        }
        if let Some(u) = user {
            e.push(QuotaEntityPart {
                entity_type: quota::USER.into(),
                name: u.map(Into::into),
            });
        }
        e
    }

    #[test]
    fn the_most_specific_quota_applies_and_says_whose_budget() {
        let mut s = SecurityState::default();
        let set = |s: &mut SecurityState, e, v: f64| {
            s.alter_quotas(&[QuotaAlteration {
                entity: e,
                set: vec![(quota::PRODUCER_BYTE_RATE.into(), v.to_bits())],
                remove: vec![],
            }])
        };
        let q = |s: &SecurityState, u: &str, c: &str| {
            quota_for(&s.quotas, u, c, quota::PRODUCER_BYTE_RATE)
                .map(|m| (m.value, m.user, m.client_id))
        };
        assert_eq!(q(&s, "alice", "agent"), None);
        set(&mut s, entity(None, Some(None)), 8.0);
        assert_eq!(
            q(&s, "alice", "agent"),
            Some((8.0, None, Some("agent".into())))
        );
        set(&mut s, entity(None, Some(Some("agent"))), 7.0);
        assert_eq!(
            q(&s, "alice", "agent"),
            Some((7.0, None, Some("agent".into())))
        );
        set(&mut s, entity(Some(None), None), 6.0);
        assert_eq!(
            q(&s, "alice", "agent"),
            Some((6.0, Some("alice".into()), None))
        );
        set(&mut s, entity(Some(None), Some(None)), 5.0);
        set(&mut s, entity(Some(None), Some(Some("agent"))), 4.0);
        assert_eq!(
            q(&s, "alice", "agent"),
            Some((4.0, Some("alice".into()), Some("agent".into())))
        );
        set(&mut s, entity(Some(Some("alice")), None), 3.0);
        assert_eq!(
            q(&s, "alice", "agent"),
            Some((3.0, Some("alice".into()), None))
        );
        set(&mut s, entity(Some(Some("alice")), Some(None)), 2.0);
        set(
            &mut s,
            entity(Some(Some("alice")), Some(Some("agent"))),
            1.0,
        );
        assert_eq!(
            q(&s, "alice", "agent"),
            Some((1.0, Some("alice".into()), Some("agent".into())))
        );
        // Another user falls back to the default user's.
        assert_eq!(
            q(&s, "bob", "agent"),
            Some((4.0, Some("bob".into()), Some("agent".into())))
        );
        assert_eq!(
            q(&s, "bob", "other"),
            Some((5.0, Some("bob".into()), Some("other".into())))
        );
        // A key the entity does not set falls through to the next.
        assert_eq!(
            quota_for(&s.quotas, "alice", "agent", quota::CONSUMER_BYTE_RATE),
            None
        );
    }

    #[test]
    fn quota_changes_kafka_would_refuse_are_refused() {
        let ok = QuotaAlteration {
            entity: entity(Some(Some("alice")), Some(None)),
            set: vec![(quota::REQUEST_PERCENTAGE.into(), 12.5f64.to_bits())],
            remove: vec![quota::PRODUCER_BYTE_RATE.into()],
        };
        assert_eq!(ok.check(), Ok(()));
        let bad = |f: &dyn Fn(&mut QuotaAlteration)| {
            let mut a = ok.clone();
            f(&mut a);
            a.check().unwrap_err()
        };
        assert!(bad(&|a| a.entity.clear()).contains("names a user"));
        assert!(bad(&|a| a.entity[0].entity_type = "ip".into()).contains("`ip` is not supported"));
        assert!(bad(&|a| a.entity.reverse()).contains("once"));
        assert!(
            bad(&|a| a.remove.push("controller_mutation_rate".into())).contains("not supported")
        );
        assert!(bad(&|a| a.set[0].1 = (-1f64).to_bits()).contains("positive"));
        assert!(
            bad(&|a| a.set = vec![(quota::PRODUCER_BYTE_RATE.into(), 1.5f64.to_bits())])
                .contains("whole number")
        );
        assert!(bad(&|a| a.entity[1].name = Some(String::new())).contains("empty"));
    }

    #[test]
    fn quota_filters_match_as_kafkas() {
        let entry = |e| QuotaEntry {
            entity: e,
            values: BTreeMap::from([(quota::PRODUCER_BYTE_RATE.to_string(), 1f64.to_bits())]),
        };
        let alice = entry(entity(Some(Some("alice")), None));
        let alice_agent = entry(entity(Some(Some("alice")), Some(Some("agent"))));
        let default_user = entry(entity(Some(None), None));
        let f = |components, strict| QuotaFilter { components, strict };
        let exact = QuotaComponent::Exact("user".into(), "alice".into());
        assert!(f(vec![exact.clone()], false).matches(&alice));
        assert!(f(vec![exact.clone()], false).matches(&alice_agent));
        assert!(!f(vec![exact.clone()], true).matches(&alice_agent));
        assert!(!f(vec![exact], false).matches(&default_user));
        assert!(f(vec![QuotaComponent::Default("user".into())], true).matches(&default_user));
        assert!(f(vec![QuotaComponent::Any("user".into())], false).matches(&default_user));
        assert!(!f(vec![QuotaComponent::Any("client-id".into())], false).matches(&alice));
        assert!(f(vec![], false).matches(&alice_agent));
    }
}
