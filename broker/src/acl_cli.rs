//! `weir acl …`: the ACLs in the cluster metadata (checked with
//! `--authorizer acl`), in Kafka's model and words.

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use weir_proto::error_code::ErrorCode;
use weir_proto::messages::{AclEntry, AclFilterEntry, AclResult};
use weir_replication::security::code;

use crate::cli::{connect, runtime, table, Conn};

/// `weir acl …`.
#[derive(Args, Debug)]
pub struct AclArgs {
    #[command(subcommand)]
    command: AclCommand,
}

/// Which resource, and whose.
#[derive(Args, Debug)]
struct Selector {
    /// A topic (with --prefixed: every topic whose name starts so).
    #[arg(long, conflicts_with_all = ["group", "cluster"])]
    topic: Option<String>,
    /// A consumer group (with --prefixed: every group whose id starts so).
    #[arg(long, conflicts_with = "cluster")]
    group: Option<String>,
    /// The cluster (topic creation, administration).
    #[arg(long)]
    cluster: bool,
    /// The name is a prefix (Kafka's PREFIXED pattern type).
    #[arg(long)]
    prefixed: bool,
    /// The principal, `User:name` (`User:*`: everyone).
    #[arg(long)]
    principal: Option<String>,
    /// Operations, comma-separated: Read, Write, Create, Delete, Alter,
    /// Describe, DescribeConfigs, AlterConfigs, IdempotentWrite, All.
    #[arg(long)]
    operation: Option<String>,
    /// A deny, not an allow (a deny wins over any allow).
    #[arg(long)]
    deny: bool,
    /// The client address it applies to [default: * (any)].
    #[arg(long)]
    host: Option<String>,
}

#[derive(Subcommand, Debug)]
enum AclCommand {
    /// Allow (or with --deny, deny) a principal operations on a resource.
    Add {
        #[command(flatten)]
        sel: Selector,
        #[command(flatten)]
        conn: Conn,
    },
    /// Remove the ACLs that match (every selector given must match).
    Remove {
        #[command(flatten)]
        sel: Selector,
        #[command(flatten)]
        conn: Conn,
    },
    /// List the ACLs that match (all without selectors).
    List {
        #[command(flatten)]
        sel: Selector,
        #[command(flatten)]
        conn: Conn,
    },
}

const OPS: [(&str, i8); 10] = [
    ("All", code::ALL),
    ("Read", code::READ),
    ("Write", code::WRITE),
    ("Create", code::CREATE),
    ("Delete", code::DELETE),
    ("Alter", code::ALTER),
    ("Describe", code::DESCRIBE),
    ("DescribeConfigs", code::DESCRIBE_CONFIGS),
    ("AlterConfigs", code::ALTER_CONFIGS),
    ("IdempotentWrite", code::IDEMPOTENT_WRITE),
];

fn operations(v: &str) -> Result<Vec<i8>> {
    v.split(',')
        .map(str::trim)
        .filter(|o| !o.is_empty())
        .map(|o| {
            OPS.iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(o))
                .map(|(_, c)| *c)
                .ok_or_else(|| {
                    let names: Vec<&str> = OPS.iter().map(|(n, _)| *n).collect();
                    anyhow::anyhow!("--operation `{o}`: one of {}", names.join(", "))
                })
        })
        .collect()
}

fn op_name(c: i8) -> String {
    OPS.iter()
        .find(|(_, x)| *x == c)
        .map_or_else(|| format!("operation {c}"), |(n, _)| n.to_string())
}

impl Selector {
    fn resource(&self) -> Option<(i8, String)> {
        match (&self.topic, &self.group, self.cluster) {
            (Some(t), _, _) => Some((code::TOPIC, t.clone())),
            (_, Some(g), _) => Some((code::GROUP, g.clone())),
            (_, _, true) => Some((code::CLUSTER, code::CLUSTER_NAME.into())),
            _ => None,
        }
    }

    fn pattern(&self) -> i8 {
        if self.prefixed {
            code::PREFIXED
        } else {
            code::LITERAL
        }
    }

    fn permission(&self) -> i8 {
        if self.deny {
            code::DENY
        } else {
            code::ALLOW
        }
    }

    fn bindings(&self) -> Result<Vec<AclEntry>> {
        let Some((resource_type, resource_name)) = self.resource() else {
            bail!("name a resource: --topic NAME, --group NAME or --cluster");
        };
        let Some(principal) = self.principal.clone() else {
            bail!("--principal User:name is needed");
        };
        let Some(ops) = self.operation.as_deref() else {
            bail!("--operation is needed (e.g. Write, or Read,Describe)");
        };
        Ok(operations(ops)?
            .into_iter()
            .map(|operation| AclEntry {
                resource_type,
                resource_name: resource_name.clone(),
                pattern_type: self.pattern(),
                principal: principal.clone(),
                host: self.host.clone().unwrap_or_else(|| "*".into()),
                operation,
                permission: self.permission(),
            })
            .collect())
    }

    /// Filters: one per operation named (or one for any).
    fn filters(&self, exact: bool) -> Result<Vec<AclFilterEntry>> {
        let (resource_type, resource_name) = match self.resource() {
            Some((t, n)) => (t, Some(n)),
            None => (code::RESOURCE_ANY, None),
        };
        let pattern_type = match (&resource_name, exact) {
            (Some(_), true) => self.pattern(),
            (Some(_), false) if !self.prefixed => code::MATCH,
            (Some(_), false) => code::PREFIXED,
            (None, _) => code::PATTERN_ANY,
        };
        let ops = match self.operation.as_deref() {
            Some(o) => operations(o)?,
            None => vec![code::OP_ANY],
        };
        let permission = match (self.deny, exact) {
            (true, _) => code::DENY,
            (false, true) if self.operation.is_some() => code::ALLOW,
            _ => code::PERMISSION_ANY,
        };
        Ok(ops
            .into_iter()
            .map(|operation| AclFilterEntry {
                resource_type,
                resource_name: resource_name.clone(),
                pattern_type,
                principal: self.principal.clone(),
                host: self.host.clone(),
                operation,
                permission,
            })
            .collect())
    }
}

fn check(r: &AclResult) -> Result<()> {
    if r.error != 0 {
        let code = ErrorCode::from_u16(r.error);
        bail!(
            "{} [{}]",
            r.message
                .clone()
                .unwrap_or_else(|| code.description().into()),
            code.name()
        );
    }
    Ok(())
}

fn rows(acls: &[AclEntry]) -> String {
    let mut rows = vec![[
        "PRINCIPAL",
        "PERMISSION",
        "OPERATION",
        "RESOURCE",
        "NAME",
        "PATTERN",
        "HOST",
    ]
    .map(String::from)
    .to_vec()];
    for a in acls {
        rows.push(vec![
            a.principal.clone(),
            if a.permission == code::DENY {
                "DENY"
            } else {
                "ALLOW"
            }
            .into(),
            op_name(a.operation),
            match a.resource_type {
                code::TOPIC => "topic",
                code::GROUP => "group",
                code::CLUSTER => "cluster",
                code::TRANSACTIONAL_ID => "transactional-id",
                _ => "?",
            }
            .into(),
            a.resource_name.clone(),
            if a.pattern_type == code::PREFIXED {
                "prefixed"
            } else {
                "literal"
            }
            .into(),
            a.host.clone(),
        ]);
    }
    table(&rows)
}

/// Runs `weir acl …`.
pub fn acl(args: AclArgs) -> Result<()> {
    let rt = runtime()?;
    match args.command {
        AclCommand::Add { sel, conn } => {
            let bindings = sel.bindings()?;
            let n = bindings.len();
            rt.block_on(async {
                let client = connect(&conn).await?;
                for r in client.create_acls(bindings).await? {
                    check(&r)?;
                }
                anyhow::Ok(())
            })?;
            println!("{n} ACL(s) added");
            Ok(())
        }
        AclCommand::Remove { sel, conn } => {
            let filters = sel.filters(true)?;
            let removed = rt.block_on(async {
                let client = connect(&conn).await?;
                let mut removed = Vec::new();
                for r in client.delete_acls(filters).await? {
                    check(&r)?;
                    removed.extend(r.acls);
                }
                anyhow::Ok(removed)
            })?;
            print!("{}", rows(&removed));
            println!("{} ACL(s) removed", removed.len());
            Ok(())
        }
        AclCommand::List { sel, conn } => {
            let filters = sel.filters(false)?;
            let found = rt.block_on(async {
                let client = connect(&conn).await?;
                let mut found: Vec<AclEntry> = Vec::new();
                for f in filters {
                    let r = client.describe_acls(f).await?;
                    check(&r)?;
                    found.extend(r.acls);
                }
                anyhow::Ok(found)
            })?;
            print!("{}", rows(&found));
            Ok(())
        }
    }
}
