//! ACLs (`--authorizer acl`): a producer allowed a prefix writes every
//! matching topic and nothing else (TOPIC_AUTHORIZATION_FAILED, nothing
//! appended), Metadata shows a principal only the topics it may describe,
//! a reader reads in its group only where allowed; the native protocol
//! gives the same answers; ACLs made with `weir acl` survive a restart.

use std::path::Path;
use std::process::Output;

use weir_testkit::Node;

use crate::common;
use crate::sasl::{add_user, start_with, PASSWORD};

/// A broker with the ACL authorizer, SASL on the Kafka listener, and the
/// loopback native listener's anonymous principal a super user (the
/// operator's `weir` commands).
fn start(dir: &Path) -> Node {
    start_with(
        dir,
        "SASL_PLAINTEXT://127.0.0.1:0",
        None,
        10_000,
        "authorizer = \"acl\"\nsuper_users = \"User:ANONYMOUS\"\n",
    )
}

fn kcat(node: &Node, user: &str, args: &[&str], stdin: &[u8]) -> Output {
    let settings = [
        "security.protocol=SASL_PLAINTEXT".to_string(),
        "sasl.mechanism=SCRAM-SHA-512".into(),
        format!("sasl.username={user}"),
        format!("sasl.password={PASSWORD}"),
    ];
    let mut all: Vec<&str> = settings.iter().flat_map(|s| ["-X", s.as_str()]).collect();
    all.extend_from_slice(args);
    common::kcat(node.kafka, &all, stdin)
}

fn weir_ok(node: &Node, args: &[&str]) -> String {
    let out = common::weir_at(node.listen, args, b"");
    assert!(
        out.status.success(),
        "weir {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A topic's records, read by the (super user) native CLI.
fn records(node: &Node, topic: &str) -> Vec<String> {
    let out = weir_ok(node, &["consume", topic, "--timeout-ms", "500"]);
    out.lines().map(String::from).collect()
}

#[test]
fn a_prefixed_acl_lets_a_producer_write_matching_topics_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path());
    add_user(&node, dir.path(), "agent");
    add_user(&node, dir.path(), "reader");
    for t in ["telemetry.cpu", "telemetry.mem", "metrics"] {
        weir_ok(&node, &["topic", "create", t, "--partitions", "1"]);
    }
    weir_ok(
        &node,
        &[
            "acl",
            "add",
            "--principal",
            "User:agent",
            "--operation",
            "Write",
            "--topic",
            "telemetry.",
            "--prefixed",
        ],
    );
    weir_ok(
        &node,
        &[
            "acl",
            "add",
            "--principal",
            "User:reader",
            "--operation",
            "Read",
            "--topic",
            "telemetry.cpu",
        ],
    );
    weir_ok(
        &node,
        &[
            "acl",
            "add",
            "--principal",
            "User:reader",
            "--operation",
            "Read",
            "--group",
            "dashboards",
        ],
    );
    let listed = weir_ok(&node, &["acl", "list"]);
    assert_eq!(listed.lines().count(), 4, "{listed}");

    // Every matching topic takes the producer's records.
    for t in ["telemetry.cpu", "telemetry.mem"] {
        let out = kcat(&node, "agent", &["-P", "-t", t], b"ok\n");
        assert!(
            out.status.success(),
            "{t}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Another topic refuses them, with Kafka's error, and holds nothing.
    let out = kcat(&node, "agent", &["-P", "-t", "metrics"], b"refused\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Topic authorization failed"), "{err}");
    assert!(
        records(&node, "metrics").is_empty(),
        "a refused record was appended"
    );
    assert_eq!(records(&node, "telemetry.cpu"), ["ok"]);

    // Metadata: each principal sees the topics it may describe.
    let seen = |user: &str| {
        let out = kcat(&node, user, &["-L", "-J"], b"");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let mut names: Vec<String> = [
            "telemetry.cpu",
            "telemetry.mem",
            "metrics",
            "__consumer_offsets",
        ]
        .iter()
        .filter(|t| text.contains(&format!("\"topic\":\"{t}\"")))
        .map(|t| t.to_string())
        .collect();
        names.sort();
        names
    };
    assert_eq!(seen("agent"), ["telemetry.cpu", "telemetry.mem"]);
    assert_eq!(seen("reader"), ["telemetry.cpu"]);

    // The reader reads in its group where allowed, and nowhere else.
    let out = kcat(
        &node,
        "reader",
        &[
            "-G",
            "dashboards",
            "-o",
            "beginning",
            "-e",
            "-q",
            "telemetry.cpu",
        ],
        b"",
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "ok",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = kcat(
        &node,
        "reader",
        &["-C", "-t", "telemetry.mem", "-o", "beginning", "-e"],
        b"",
    );
    assert!(!out.status.success(), "read without Read");
    let out = kcat(
        &node,
        "reader",
        &[
            "-G",
            "other-group",
            "-o",
            "beginning",
            "-e",
            "-q",
            "telemetry.cpu",
        ],
        b"",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    // librdkafka shows the broker's message (GROUP_AUTHORIZATION_FAILED's).
    assert!(
        err.contains("Group authorization failed") || err.contains("may not Describe group"),
        "{err}"
    );

    // ACLs survive a restart; removed, the producer is refused.
    node.stop();
    let node = start(dir.path());
    assert_eq!(weir_ok(&node, &["acl", "list"]).lines().count(), 4);
    weir_ok(
        &node,
        &[
            "acl",
            "remove",
            "--principal",
            "User:agent",
            "--operation",
            "Write",
            "--topic",
            "telemetry.",
            "--prefixed",
        ],
    );
    let out = kcat(&node, "agent", &["-P", "-t", "telemetry.cpu"], b"late\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("Topic authorization failed"));
    assert_eq!(records(&node, "telemetry.cpu"), ["ok"]);
}

#[test]
fn the_native_protocol_is_held_to_the_same_acls() {
    let dir = tempfile::tempdir().unwrap();
    // No super user: the native listener's anonymous principal may do
    // only what ACLs allow — here nothing, then Write on one topic.
    let node = start_with(
        dir.path(),
        "SASL_PLAINTEXT://127.0.0.1:0",
        None,
        10_000,
        "authorizer = \"acl\"\nsuper_users = \"User:admin\"\n",
    );
    let out = common::weir_at(
        node.listen,
        &["topic", "create", "t", "--partitions", "1"],
        b"",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("TopicAuthorizationFailed"),
        "{err}"
    );
    let out = common::weir_at(
        node.listen,
        &[
            "acl",
            "add",
            "--principal",
            "User:ANONYMOUS",
            "--operation",
            "All",
            "--cluster",
        ],
        b"",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("ClusterAuthorizationFailed"),
        "{err}"
    );
    let listed = common::weir_at(node.listen, &["topic", "list"], b"");
    assert!(
        String::from_utf8_lossy(&listed.stdout).trim().is_empty(),
        "topics listed to an unauthorized principal"
    );
    // Listing groups is not refused: it shows the groups the principal
    // may describe (none).
    let groups = common::weir_at(node.listen, &["group", "list"], b"");
    assert!(
        groups.status.success(),
        "{}",
        String::from_utf8_lossy(&groups.stderr)
    );
}

/// OffsetFetch of several groups (v8+): a group the principal may not
/// describe is answered GROUP_AUTHORIZATION_FAILED, the others are
/// served, and the connection stays open.
#[test]
fn offset_fetch_of_several_groups_refuses_only_the_ones_not_allowed() {
    use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestGroup;
    use kafka_protocol::messages::{GroupId, OffsetFetchRequest, OffsetFetchResponse};
    use kafka_protocol::protocol::{Decodable, StrBytes};
    use std::io::Write;

    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path());
    add_user(&node, dir.path(), "agent");
    weir_ok(
        &node,
        &[
            "acl",
            "add",
            "--principal",
            "User:agent",
            "--operation",
            "Describe",
            "--group",
            "mine",
        ],
    );
    let (mut s, _, _) = crate::sasl::scram_login(node.kafka);
    let mut r = OffsetFetchRequest::default();
    r.groups = ["mine", "theirs"]
        .iter()
        .map(|g| {
            let mut x = OffsetFetchRequestGroup::default();
            x.group_id = GroupId(StrBytes::from_static_str(g));
            x.topics = None;
            x
        })
        .collect();
    // v8 is flexible: request header v2 (a tagged-fields byte after the
    // client id), response header v1 (one after the correlation id).
    let mut f = Vec::new();
    f.extend_from_slice(&9i16.to_be_bytes());
    f.extend_from_slice(&8i16.to_be_bytes());
    f.extend_from_slice(&11i32.to_be_bytes());
    f.extend_from_slice(&4i16.to_be_bytes());
    f.extend_from_slice(b"test");
    f.push(0);
    f.extend_from_slice(&crate::sasl::body(&r, 8));
    let mut frame = (f.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&f);
    s.write_all(&frame).unwrap();
    let mut b = crate::sasl::answer(&mut s).expect("answered, not closed");
    let _tags = bytes::Buf::get_u8(&mut b);
    let resp = OffsetFetchResponse::decode(&mut b, 8).unwrap();
    let code = |g: &str| {
        resp.groups
            .iter()
            .find(|x| x.group_id.as_str() == g)
            .unwrap_or_else(|| panic!("no answer for {g}"))
            .error_code
    };
    assert_eq!(code("theirs"), 30, "GROUP_AUTHORIZATION_FAILED");
    assert_ne!(code("mine"), 30);
    assert!(
        crate::sasl::metadata_answered(&mut s),
        "the connection stays open"
    );
}

#[test]
fn a_client_certificate_names_the_principal_acls_hold_to() {
    let dir = tempfile::tempdir().unwrap();
    let pki = crate::tls::Pki::new(dir.path(), "ca");
    let (cert, key) = pki.sign("server", "weir", true);
    // The client's certificate from `weir cluster certs --client`, its CA
    // the clients' CA of the listener.
    let clients = dir.path().join("clients");
    for args in [vec!["--nodes", "1"], vec!["--client", "Agent-7"]] {
        let mut all = vec!["cluster", "certs", "--out", clients.to_str().unwrap()];
        all.extend(args);
        let out = common::weir_at(([127, 0, 0, 1], 9).into(), &all, b"");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (agent_cert, agent_key) = (
        clients.join("client-Agent-7.pem"),
        clients.join("client-Agent-7.key"),
    );
    let clients_ca = clients.join("ca.pem");
    let ca = pki.ca("ca");
    let node = start_with(
        dir.path(),
        "SSL://127.0.0.1:0",
        Some((&cert, &key)),
        10_000,
        &format!(
            "authorizer = \"acl\"\nsuper_users = \"User:ANONYMOUS\"\nssl_ca_file = {clients_ca:?}\n\
             ssl_client_auth = \"required\"\n\
             ssl_principal_mapping_rules = \"RULE:^CN=(.*?)$/$1/L, DEFAULT\"\n"
        ),
    );
    for t in ["granted", "other"] {
        weir_ok(&node, &["topic", "create", t, "--partitions", "1"]);
    }
    weir_ok(
        &node,
        &[
            "acl",
            "add",
            "--principal",
            "User:agent-7",
            "--operation",
            "Write",
            "--topic",
            "granted",
        ],
    );
    let kcat = |topic: &str| {
        let settings = [
            "security.protocol=SSL".to_string(),
            format!("ssl.ca.location={}", ca.display()),
            format!("ssl.certificate.location={}", agent_cert.display()),
            format!("ssl.key.location={}", agent_key.display()),
        ];
        let mut all: Vec<&str> = settings.iter().flat_map(|s| ["-X", s.as_str()]).collect();
        all.extend_from_slice(&["-P", "-t", topic]);
        common::kcat(node.kafka, &all, b"from-agent\n")
    };
    let out = kcat("granted");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = kcat("other");
    assert!(String::from_utf8_lossy(&out.stderr).contains("Topic authorization failed"));
    assert_eq!(records(&node, "granted"), ["from-agent"]);
    assert!(records(&node, "other").is_empty());
}
