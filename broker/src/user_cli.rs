//! `weir user …`: users' SCRAM credentials in the cluster metadata (what
//! SASL_PLAINTEXT:// and SASL_SSL:// listeners check logins against).

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use weir_proto::error_code::ErrorCode;
use weir_proto::messages::UserResult;
use weir_proto::sasl::Mechanism;

use crate::cli::{connect, runtime, table, Conn};

/// `weir user …`.
#[derive(Args, Debug)]
pub struct UserArgs {
    #[command(subcommand)]
    command: UserCommand,
}

#[derive(Subcommand, Debug)]
enum UserCommand {
    /// Create a user, or set its password (salted here; the broker keeps
    /// only SCRAM keys). The password comes from --password-file or
    /// WEIR_USER_PASSWORD, never the command line.
    Add {
        /// User name.
        name: String,
        /// A file whose first line is the password.
        #[arg(long, value_name = "FILE")]
        password_file: Option<std::path::PathBuf>,
        /// SCRAM mechanisms to store a credential for, comma-separated
        /// (PLAIN logins are checked against either).
        #[arg(long, default_value = "SCRAM-SHA-512,SCRAM-SHA-256")]
        mechanism: String,
        /// PBKDF2 iterations (4096 to 16384).
        #[arg(long, default_value_t = 8192)]
        iterations: u32,
        #[command(flatten)]
        conn: Conn,
    },
    /// Remove a user's credentials (all mechanisms unless --mechanism).
    Remove {
        /// User name.
        name: String,
        /// Only this mechanism's credential.
        #[arg(long)]
        mechanism: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Users and the mechanisms they can log in with.
    List {
        #[command(flatten)]
        conn: Conn,
    },
}

fn mechanisms(v: &str) -> Result<Vec<Mechanism>> {
    let mut out = Vec::new();
    for name in v.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match Mechanism::from_name(&name.to_ascii_uppercase()) {
            Some(m) if m.scram_type().is_some() => out.push(m),
            _ => bail!("--mechanism `{name}`: SCRAM-SHA-512 or SCRAM-SHA-256"),
        }
    }
    if out.is_empty() {
        bail!("--mechanism names no mechanism");
    }
    Ok(out)
}

fn check(r: &UserResult) -> Result<()> {
    if r.error != 0 {
        let code = ErrorCode::from_u16(r.error);
        bail!(
            "user `{}`: {} [{}]",
            r.user,
            r.message
                .clone()
                .unwrap_or_else(|| code.description().into()),
            code.name()
        );
    }
    Ok(())
}

fn password(file: Option<&std::path::Path>) -> Result<String> {
    let p = match file {
        Some(f) => std::fs::read_to_string(f)
            .with_context(|| format!("reading --password-file {}", f.display()))?
            .lines()
            .next()
            .unwrap_or("")
            .to_string(),
        None => std::env::var("WEIR_USER_PASSWORD")
            .context("no password: give --password-file FILE or set WEIR_USER_PASSWORD")?,
    };
    if p.is_empty() {
        bail!("the password is empty");
    }
    Ok(p)
}

/// Runs `weir user …`.
pub fn user(args: UserArgs) -> Result<()> {
    let rt = runtime()?;
    match args.command {
        UserCommand::Add {
            name,
            password_file,
            mechanism,
            iterations,
            conn,
        } => {
            let password = password(password_file.as_deref())?;
            let mechs = mechanisms(&mechanism)?;
            rt.block_on(async {
                let client = connect(&conn).await?;
                for m in &mechs {
                    let r = client
                        .set_user_password(&name, *m, &password, iterations)
                        .await?;
                    check(&r)?;
                }
                anyhow::Ok(())
            })?;
            let names: Vec<&str> = mechs.iter().map(|m| m.name()).collect();
            println!("user `{name}` can log in with {}", names.join(", "));
            Ok(())
        }
        UserCommand::Remove {
            name,
            mechanism,
            conn,
        } => {
            rt.block_on(async {
                let client = connect(&conn).await?;
                let held: Vec<Mechanism> = match mechanism {
                    Some(m) => mechanisms(&m)?,
                    None => {
                        let d = client.describe_users(Some(vec![name.clone()])).await?;
                        let r = d.first().context("the broker answered no result")?;
                        check(r)?;
                        r.credentials
                            .iter()
                            .filter_map(|c| Mechanism::from_scram_type(c.mechanism))
                            .collect()
                    }
                };
                for m in held {
                    check(&client.remove_user_credential(&name, m).await?)?;
                }
                anyhow::Ok(())
            })?;
            println!("user `{name}` removed");
            Ok(())
        }
        UserCommand::List { conn } => {
            let users = rt.block_on(async {
                let client = connect(&conn).await?;
                anyhow::Ok(client.describe_users(None).await?)
            })?;
            let mut rows = vec![vec!["USER".to_string(), "MECHANISMS".to_string()]];
            for u in users {
                let m: Vec<String> = u
                    .credentials
                    .iter()
                    .map(|c| {
                        let name = Mechanism::from_scram_type(c.mechanism).map_or_else(
                            || format!("mechanism {}", c.mechanism),
                            |m| m.name().into(),
                        );
                        format!("{name} ({} iterations)", c.iterations)
                    })
                    .collect();
                rows.push(vec![u.user, m.join(", ")]);
            }
            print!("{}", table(&rows));
            Ok(())
        }
    }
}
