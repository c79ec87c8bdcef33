//! `weir quota …`: client quotas in the cluster metadata (Kafka's
//! `kafka-configs --entity-type users|clients`), enforced per node.

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use weir_proto::error_code::ErrorCode;
use weir_proto::messages::{QuotaChange, QuotaComponentEntry, QuotaEntityEntry, QuotaValue};
use weir_replication::security::quota;

use crate::cli::{connect, runtime, table, Conn};

/// `weir quota …`.
#[derive(Args, Debug)]
pub struct QuotaArgs {
    #[command(subcommand)]
    command: QuotaCommand,
}

/// Whose quota: a user, a client id, or both (a user's quota for one of
/// its client ids).
#[derive(Args, Debug)]
struct Entity {
    /// The user (the principal's name: `alice` of `User:alice`).
    #[arg(long, conflicts_with = "default_user")]
    user: Option<String>,
    /// Every user without a quota of its own (each has its own budget).
    #[arg(long)]
    default_user: bool,
    /// The client id Kafka clients send (`client.id`).
    #[arg(long, conflicts_with = "default_client_id")]
    client_id: Option<String>,
    /// Every client id without a quota of its own.
    #[arg(long)]
    default_client_id: bool,
}

impl Entity {
    fn parts(&self) -> Vec<QuotaEntityEntry> {
        let mut parts = Vec::new();
        if self.client_id.is_some() || self.default_client_id {
            parts.push(QuotaEntityEntry {
                entity_type: quota::CLIENT_ID.into(),
                name: self.client_id.clone(),
            });
        }
        if self.user.is_some() || self.default_user {
            parts.push(QuotaEntityEntry {
                entity_type: quota::USER.into(),
                name: self.user.clone(),
            });
        }
        parts
    }

    fn required(&self) -> Result<Vec<QuotaEntityEntry>> {
        let parts = self.parts();
        if parts.is_empty() {
            bail!(
                "name whose quota: --user, --default-user, --client-id and/or --default-client-id"
            );
        }
        Ok(parts)
    }
}

#[derive(Subcommand, Debug)]
enum QuotaCommand {
    /// Set quotas: `producer_byte_rate=10485760`, `consumer_byte_rate=…`
    /// (bytes per second, per node), `request_percentage=…` (percent of
    /// one core's time, per node).
    Set {
        #[command(flatten)]
        entity: Entity,
        /// `key=value` pairs.
        #[arg(required = true)]
        values: Vec<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Remove quotas by key (all of the entity's without keys).
    Remove {
        #[command(flatten)]
        entity: Entity,
        /// Keys to remove.
        keys: Vec<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// List quotas (of entities with every part given; all without).
    List {
        #[command(flatten)]
        entity: Entity,
        #[command(flatten)]
        conn: Conn,
    },
}

fn parse_values(values: &[String]) -> Result<Vec<QuotaValue>> {
    values
        .iter()
        .map(|kv| {
            let Some((k, v)) = kv.split_once('=') else {
                bail!("`{kv}`: write key=value, e.g. producer_byte_rate=10485760");
            };
            let v: f64 = v
                .trim()
                .parse()
                .map_err(|_| anyhow::anyhow!("`{kv}`: the value is not a number"))?;
            Ok(QuotaValue::new(k.trim(), v))
        })
        .collect()
}

fn components(parts: &[QuotaEntityEntry]) -> Vec<QuotaComponentEntry> {
    parts
        .iter()
        .map(|p| QuotaComponentEntry {
            entity_type: p.entity_type.clone(),
            match_type: if p.name.is_some() { 0 } else { 1 },
            name: p.name.clone(),
        })
        .collect()
}

fn failed(error: u16, message: Option<String>) -> Result<()> {
    if error == 0 {
        return Ok(());
    }
    let code = ErrorCode::from_u16(error);
    bail!(
        "{} ({})",
        message.unwrap_or_else(|| code.description().into()),
        code.name()
    )
}

fn entity_name(parts: &[QuotaEntityEntry], ty: &str) -> String {
    match parts.iter().find(|p| p.entity_type == ty) {
        None => String::new(),
        Some(p) => p.name.clone().unwrap_or_else(|| "<default>".into()),
    }
}

/// Runs `weir quota …`.
pub fn quota(args: QuotaArgs) -> Result<()> {
    let rt = runtime()?;
    match args.command {
        QuotaCommand::Set {
            entity,
            values,
            conn,
        } => {
            let change = QuotaChange {
                entity: entity.required()?,
                set: parse_values(&values)?,
                remove: Vec::new(),
            };
            alter(&rt, &conn, change)?;
            println!("quota set");
            Ok(())
        }
        QuotaCommand::Remove { entity, keys, conn } => {
            let parts = entity.required()?;
            let keys = if keys.is_empty() {
                quota::KEYS.iter().map(|k| k.to_string()).collect()
            } else {
                keys
            };
            let change = QuotaChange {
                entity: parts,
                set: Vec::new(),
                remove: keys,
            };
            alter(&rt, &conn, change)?;
            println!("quota removed");
            Ok(())
        }
        QuotaCommand::List { entity, conn } => {
            let comps = components(&entity.parts());
            let strict = !comps.is_empty();
            let r = rt.block_on(async {
                let client = connect(&conn).await?;
                anyhow::Ok(client.describe_client_quotas(comps, strict).await?)
            })?;
            failed(r.error, r.message)?;
            let mut rows = vec![["USER", "CLIENT-ID", "QUOTA", "VALUE"]
                .map(String::from)
                .to_vec()];
            for e in r.entries {
                for v in &e.values {
                    rows.push(vec![
                        entity_name(&e.entity, quota::USER),
                        entity_name(&e.entity, quota::CLIENT_ID),
                        v.key.clone(),
                        v.value().to_string(),
                    ]);
                }
            }
            print!("{}", table(&rows));
            Ok(())
        }
    }
}

fn alter(rt: &tokio::runtime::Runtime, conn: &Conn, change: QuotaChange) -> Result<()> {
    rt.block_on(async {
        let client = connect(conn).await?;
        for r in client.alter_client_quotas(vec![change]).await? {
            failed(r.error, r.message)?;
        }
        anyhow::Ok(())
    })
}
