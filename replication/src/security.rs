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
}
