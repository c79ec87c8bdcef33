//! SASL exchanges (`weir_proto::sasl`): a server fed any client tokens
//! (SCRAM, PLAIN, OAUTHBEARER's client message)
//! and a client fed any server tokens must answer or refuse, never panic;
//! a server exchange never logs anyone in without the right proof.
//!
//! The input is split at NUL bytes into up to three tokens; the first
//! byte chooses the mechanism and which side is fuzzed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weir_proto::sasl::{
    oauthbearer_message, parse_oauthbearer, parse_plain, Mechanism, ScramClient, ScramCredential,
    ScramServer,
};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let mechanism = if selector & 1 == 0 {
        Mechanism::ScramSha256
    } else {
        Mechanism::ScramSha512
    };
    let mut tokens = rest.splitn(3, |&b| b == 0);
    let first = tokens.next().unwrap_or_default();
    let second = tokens.next().unwrap_or_default();
    let third = tokens.next().unwrap_or_default();
    let _ = parse_plain(rest);
    // OAUTHBEARER: any message parses or is refused; a token it carries
    // comes back out of the message built from it.
    if let Ok(token) = parse_oauthbearer(rest) {
        if !token.contains('\x01') {
            assert_eq!(parse_oauthbearer(&oauthbearer_message(&token)).ok(), Some(token));
        }
    }
    if selector & 2 == 0 {
        // The server side, with a credential nobody in the input knows.
        let stored = ScramCredential::from_salted(mechanism, vec![7; 16], 4096, &vec![9; match mechanism {
            Mechanism::ScramSha256 => 32,
            _ => 64,
        }])
        .expect("a valid credential");
        let mut server = ScramServer::new(mechanism);
        if server.client_first(first, |_| Some(stored.clone())).is_ok() {
            // The fuzzer cannot know the salted password: a proof it made
            // up must not pass.
            assert!(server.client_final(second).is_err(), "logged in without the proof");
        }
        let _ = server.client_final(third);
    } else {
        // The client side against any server messages.
        let (mut client, _) = ScramClient::start(mechanism, "user", "password");
        if client.server_first(first).is_ok() {
            let _ = client.server_final(second);
        }
    }
});
