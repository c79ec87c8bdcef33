//! The principal of a client certificate: its subject's distinguished
//! name (RFC 2253, as Java's `X500Principal.getName()` writes it, which is
//! what Kafka's rules are written against), mapped by Kafka's
//! `ssl.principal.mapping.rules`.
//!
//! The subject is read with a small bounded DER reader (only the path to
//! the subject of an X.509 certificate rustls already verified).

use anyhow::{bail, Context};

/// One DER element: tag, and the content's bytes.
fn element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        first as usize
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |a, &b| (a << 8) | b as usize);
        rest = &rest[n..];
        len
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

fn oid_name(oid: &[u8]) -> Option<&'static str> {
    Some(match oid {
        [0x55, 0x04, 0x03] => "CN",
        [0x55, 0x04, 0x06] => "C",
        [0x55, 0x04, 0x07] => "L",
        [0x55, 0x04, 0x08] => "ST",
        [0x55, 0x04, 0x09] => "STREET",
        [0x55, 0x04, 0x0a] => "O",
        [0x55, 0x04, 0x0b] => "OU",
        [0x09, 0x92, 0x26, 0x89, 0x93, 0xf2, 0x2c, 0x64, 0x01, 0x19] => "DC",
        [0x09, 0x92, 0x26, 0x89, 0x93, 0xf2, 0x2c, 0x64, 0x01, 0x01] => "UID",
        _ => return None,
    })
}

/// The dotted form of an OID's DER content.
fn dotted(oid: &[u8]) -> String {
    let mut values: Vec<u64> = Vec::new();
    let mut acc = 0u64;
    for &b in oid {
        acc = (acc << 7) | (b & 0x7f) as u64;
        if b & 0x80 == 0 {
            values.push(acc);
            acc = 0;
        }
    }
    let mut parts: Vec<String> = Vec::new();
    if let Some((&first, rest)) = values.split_first() {
        let a = (first / 40).min(2);
        parts.push(a.to_string());
        parts.push((first - 40 * a).to_string());
        parts.extend(rest.iter().map(u64::to_string));
    }
    parts.join(".")
}

/// RFC 2253 escaping of a value.
fn escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    let last = v.chars().count().saturating_sub(1);
    for (i, c) in v.chars().enumerate() {
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';')
            || (i == 0 && matches!(c, ' ' | '#'))
            || (i == last && c == ' ');
        if special {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The subject DN of a DER certificate, RFC 2253 (most specific first,
/// e.g. `CN=agent,OU=ops,O=acme`).
pub fn subject_dn(cert: &[u8]) -> Option<String> {
    let (_, certificate, _) = element(cert)?;
    let (_, tbs, _) = element(certificate)?;
    let mut rest = tbs;
    // [0] version (optional), serial, signature algorithm, issuer,
    // validity, then the subject.
    let (tag, _, r) = element(rest)?;
    if tag == 0xa0 {
        rest = r;
        let (_, _, r) = element(rest)?; // serial
        rest = r;
    } else {
        rest = r; // that was the serial
    }
    for _ in 0..3 {
        let (_, _, r) = element(rest)?;
        rest = r;
    }
    let (tag, mut subject, _) = element(rest)?;
    if tag != 0x30 {
        return None;
    }
    let mut rdns = Vec::new();
    while !subject.is_empty() {
        let (tag, mut set, r) = element(subject)?;
        subject = r;
        if tag != 0x31 {
            return None;
        }
        let mut avas = Vec::new();
        while !set.is_empty() {
            let (_, ava, r) = element(set)?;
            set = r;
            let (tag, oid, r) = element(ava)?;
            if tag != 0x06 {
                return None;
            }
            let (vtag, value, _) = element(r)?;
            let value = match vtag {
                // UTF8String, PrintableString, IA5String, TeletexString.
                0x0c | 0x13 | 0x16 | 0x14 => escape(std::str::from_utf8(value).ok()?),
                _ => {
                    let hex: String = r.iter().map(|b| format!("{b:02x}")).collect();
                    format!("#{hex}")
                }
            };
            let name = oid_name(oid).map_or_else(|| dotted(oid), String::from);
            avas.push(format!("{name}={value}"));
        }
        rdns.push(avas.join("+"));
    }
    rdns.reverse();
    Some(rdns.join(","))
}

/// One of Kafka's `ssl.principal.mapping.rules`.
#[derive(Debug, Clone)]
enum Rule {
    /// The whole DN.
    Default,
    /// `RULE:pattern/replacement/[LU]`.
    Map {
        matcher: regex::Regex,
        pattern: regex::Regex,
        replacement: String,
        case: Option<char>,
    },
}

/// Kafka's `ssl.principal.mapping.rules`: the first rule whose pattern
/// matches the whole DN gives the principal's name.
#[derive(Debug, Clone)]
pub struct PrincipalRules(Vec<Rule>);

impl Default for PrincipalRules {
    fn default() -> Self {
        PrincipalRules(vec![Rule::Default])
    }
}

/// Reads up to an unescaped `/`; the text (`\/` unescaped) and the rest.
fn until_slash(s: &str) -> Option<(String, &str)> {
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' if s[i + 1..].starts_with('/') => {
                out.push('/');
                chars.next();
            }
            '/' => return Some((out, &s[i + 1..])),
            c => out.push(c),
        }
    }
    None
}

impl PrincipalRules {
    /// Parses Kafka's syntax: `RULE:pattern/replacement/[LU]` and
    /// `DEFAULT`, separated by commas.
    pub fn parse(text: &str) -> anyhow::Result<PrincipalRules> {
        let mut rules = Vec::new();
        let mut rest = text.trim();
        let java_group = regex::Regex::new(r"\$(\d+)").expect("a fixed pattern");
        while !rest.is_empty() {
            if let Some(r) = rest.strip_prefix("DEFAULT") {
                rules.push(Rule::Default);
                rest = r;
            } else if let Some(r) = rest.strip_prefix("RULE:") {
                let (pattern, r) = until_slash(r).with_context(|| {
                    format!("ssl.principal.mapping.rules: `{rest}` has no /replacement/")
                })?;
                let (replacement, r) = until_slash(r).with_context(|| {
                    format!(
                        "ssl.principal.mapping.rules: `{rest}` does not end its replacement with /"
                    )
                })?;
                let (case, r) = match r.chars().next() {
                    Some(c @ ('L' | 'U')) => (Some(c), &r[1..]),
                    _ => (None, r),
                };
                let matcher =
                    regex::Regex::new(&format!("^(?:{pattern})$")).with_context(|| {
                        format!("ssl.principal.mapping.rules: bad pattern `{pattern}`")
                    })?;
                let pattern = regex::Regex::new(&pattern).with_context(|| {
                    format!("ssl.principal.mapping.rules: bad pattern `{pattern}`")
                })?;
                // Java's `$1` → the regex crate's `${1}`.
                let replacement = java_group.replace_all(&replacement, "$${$1}").into_owned();
                rules.push(Rule::Map {
                    matcher,
                    pattern,
                    replacement,
                    case,
                });
                rest = r;
            } else {
                bail!("ssl.principal.mapping.rules: `{rest}` is neither RULE:… nor DEFAULT");
            }
            rest = rest.trim_start().trim_start_matches(',').trim_start();
        }
        if rules.is_empty() {
            bail!("ssl.principal.mapping.rules names no rule");
        }
        Ok(PrincipalRules(rules))
    }

    /// The principal name of `dn`, or `None` if no rule applies (Kafka
    /// then refuses the connection).
    pub fn apply(&self, dn: &str) -> Option<String> {
        for rule in &self.0 {
            match rule {
                Rule::Default => return Some(dn.to_string()),
                Rule::Map {
                    matcher,
                    pattern,
                    replacement,
                    case,
                } if matcher.is_match(dn) => {
                    let name = pattern.replace_all(dn, replacement.as_str()).into_owned();
                    return Some(match case {
                        Some('L') => name.to_lowercase(),
                        Some('U') => name.to_uppercase(),
                        _ => name,
                    });
                }
                Rule::Map { .. } => {}
            }
        }
        None
    }
}

/// A client certificate whose subject no `--ssl-principal-mapping-rules`
/// rule maps (or that cannot be read): its connection is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unmapped;

/// The principal a TLS client's certificate chain names: `Ok(None)`
/// without a certificate, `Ok(Some("User:<mapped subject>"))`, or `Err`
/// when its subject cannot be read or no rule applies (the connection is
/// to be closed). `certs` are DER, leaf first.
pub fn of_certificate<C: AsRef<[u8]>>(
    rules: &PrincipalRules,
    certs: Option<&[C]>,
) -> Result<Option<String>, Unmapped> {
    let Some(leaf) = certs.and_then(|c| c.first()) else {
        return Ok(None);
    };
    subject_dn(leaf.as_ref())
        .and_then(|dn| rules.apply(&dn))
        .map(|name| Some(format!("User:{name}")))
        .ok_or(Unmapped)
}

/// [`of_certificate`] for a connection being accepted: its principal
/// (`Some(None)`: no certificate), or `None` — counted in `failures` and
/// logged with `peer` — when no rule maps the certificate's subject (the
/// `listener`'s connection is to be closed).
pub fn admit<C: AsRef<[u8]>>(
    rules: &PrincipalRules,
    certs: Option<&[C]>,
    failures: &std::cell::Cell<u64>,
    peer: &str,
    listener: &str,
) -> Option<Option<String>> {
    match of_certificate(rules, certs) {
        Ok(c) => Some(c),
        Err(Unmapped) => {
            failures.set(failures.get() + 1);
            tracing::warn!(
                %peer,
                "closing {listener} connection: no --ssl-principal-mapping-rules rule applies to its certificate's subject"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafkas_rule_syntax() {
        let r = PrincipalRules::parse(
            r"RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/, RULE:^CN=(.*?),OU=(.*?),O=(.*?)$/$1@$2/L, DEFAULT",
        )
        .unwrap();
        assert_eq!(
            r.apply("CN=svc-a,OU=ServiceUsers,O=acme").as_deref(),
            Some("svc-a")
        );
        assert_eq!(
            r.apply("CN=Agent,OU=OPS,O=acme").as_deref(),
            Some("agent@ops")
        );
        assert_eq!(r.apply("CN=x").as_deref(), Some("CN=x"));
        let only = PrincipalRules::parse(r"RULE:^CN=(.*?),.*$/$1/").unwrap();
        assert_eq!(only.apply("CN=agent,O=acme").as_deref(), Some("agent"));
        assert_eq!(only.apply("O=acme"), None, "no rule: refused");
        assert_eq!(
            PrincipalRules::parse(r"RULE:^CN=a\/b$/x/")
                .unwrap()
                .apply("CN=a/b")
                .as_deref(),
            Some("x")
        );
        assert!(PrincipalRules::parse("RULE:^CN=(.*$/x/").is_err());
        assert!(PrincipalRules::parse("NOPE").is_err());
        assert_eq!(
            PrincipalRules::default().apply("CN=a").as_deref(),
            Some("CN=a")
        );
    }

    #[test]
    fn the_subject_of_a_certificate() {
        let mut p = rcgen::CertificateParams::default();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name
            .push(rcgen::DnType::OrganizationName, "acme, inc");
        p.distinguished_name
            .push(rcgen::DnType::OrganizationalUnitName, "ops");
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "agent-7");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = p.self_signed(&key).unwrap();
        assert_eq!(
            subject_dn(cert.der()).as_deref(),
            Some(r"CN=agent-7,OU=ops,O=acme\, inc")
        );
        assert_eq!(subject_dn(b"\x30\x03\x02\x01"), None);
        assert_eq!(
            dotted(&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d]),
            "1.2.840.113549"
        );
        assert_eq!(subject_dn(b""), None);
    }
}
