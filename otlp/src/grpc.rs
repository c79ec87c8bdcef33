//! Unary gRPC as OTLP/gRPC uses it, without a gRPC library: the
//! length-prefixed message of a request and a response, the status codes
//! OTLP's retry rules read, `grpc-message`'s percent-encoding and the
//! `grpc-status-details-bin` trailer (a `google.rpc.Status` carrying a
//! `google.rpc.RetryInfo`).

use std::time::Duration;

use base64::Engine as _;

use crate::wire::{put_len, put_nested, put_varint_field};
use crate::Error;

/// gRPC status codes used here.
pub mod code {
    /// Success.
    pub const OK: i32 = 0;
    /// Bad data: not retried.
    pub const INVALID_ARGUMENT: i32 = 3;
    /// The request timed out: retried.
    pub const DEADLINE_EXCEEDED: i32 = 4;
    /// Not authorised: not retried.
    pub const PERMISSION_DENIED: i32 = 7;
    /// Over a limit: retried only with a `RetryInfo`.
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    /// Not served (an unknown method or message encoding).
    pub const UNIMPLEMENTED: i32 = 12;
    /// The server failed.
    pub const INTERNAL: i32 = 13;
    /// Try again later: retried.
    pub const UNAVAILABLE: i32 = 14;
    /// No or bad credentials.
    pub const UNAUTHENTICATED: i32 = 16;
}

/// The one message of a unary request body: whether it is compressed
/// (with the request's `grpc-encoding`), and its bytes.
pub fn unframe(body: &[u8]) -> Result<(bool, &[u8]), Error> {
    if body.len() < 5 {
        return Err(Error::malformed(format!(
            "a gRPC message needs a 5-byte prefix; the body has {} bytes",
            body.len()
        )));
    }
    let compressed = match body[0] {
        0 => false,
        1 => true,
        f => return Err(Error::malformed(format!("gRPC compressed flag {f}"))),
    };
    let len = u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize;
    if body.len() - 5 != len {
        return Err(Error::malformed(format!(
            "the gRPC prefix says {len} bytes, the body has {} after it (one message per unary call)",
            body.len() - 5
        )));
    }
    Ok((compressed, &body[5..]))
}

/// A request's `grpc-timeout` header (gRPC over HTTP/2: at most 8 digits
/// and a unit, `H`, `M`, `S`, `m`, `u` or `n`) as a duration; `None` if
/// it is not one.
pub fn parse_timeout(value: &str) -> Option<Duration> {
    let (&unit, digits) = value.as_bytes().split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// A response message with its (uncompressed) prefix.
pub fn frame(msg: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(msg.len() + 5);
    out.push(0);
    out.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    out.extend_from_slice(msg);
    out
}

/// `grpc-message`'s percent-encoding (everything outside printable ASCII,
/// and `%`).
pub fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for &b in message.as_bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `grpc-status-details-bin`: a `google.rpc.Status` with `code`,
/// `message` and, if `retry_after` is given, a `google.rpc.RetryInfo`
/// (base64 without padding).
pub fn status_details(code: i32, message: &str, retry_after: Option<Duration>) -> String {
    let mut status = Vec::new();
    put_varint_field(&mut status, 1, code as i64 as u64);
    if !message.is_empty() {
        put_len(&mut status, 2, message.as_bytes());
    }
    if let Some(d) = retry_after {
        put_nested(&mut status, 3, |any| {
            put_len(any, 1, b"type.googleapis.com/google.rpc.RetryInfo");
            put_nested(any, 2, |retry| {
                put_nested(retry, 1, |duration| {
                    if d.as_secs() > 0 {
                        put_varint_field(duration, 1, d.as_secs());
                    }
                    if d.subsec_nanos() > 0 {
                        put_varint_field(duration, 2, u64::from(d.subsec_nanos()));
                    }
                })
            })
        });
    }
    base64::engine::general_purpose::STANDARD_NO_PAD.encode(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_round_trips_through_its_frame() {
        let f = frame(b"hello");
        assert_eq!(unframe(&f).unwrap(), (false, &b"hello"[..]));
        let mut compressed = f.clone();
        compressed[0] = 1;
        assert!(unframe(&compressed).unwrap().0);
    }

    #[test]
    fn bad_frames_are_refused_with_a_reason() {
        assert!(unframe(b"\0\0\0").is_err());
        let mut f = frame(b"hello");
        f.push(0);
        let e = unframe(&f).unwrap_err().to_string();
        assert!(e.contains("one message per unary call"), "{e}");
        f.pop();
        f[0] = 7;
        assert!(unframe(&f).is_err());
    }

    #[test]
    fn grpc_message_is_percent_encoded() {
        assert_eq!(percent_encode("a 50% cut\né"), "a 50%25 cut%0A%C3%A9");
    }

    #[test]
    fn status_details_carry_retry_info() {
        let b64 = status_details(code::UNAVAILABLE, "busy", Some(Duration::from_millis(1500)));
        let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(b64)
            .unwrap();
        // code 14, message "busy", details { type_url, value { retry_delay { 1 s, 5e8 ns } } }
        let mut r = crate::wire::Reader::new(&bytes);
        let f = r.next_field().unwrap().unwrap();
        assert_eq!(f.value, crate::wire::Value::Varint(14));
        let f = r.next_field().unwrap().unwrap();
        assert_eq!(f.value, crate::wire::Value::Len(b"busy"));
        let crate::wire::Value::Len(any) = r.next_field().unwrap().unwrap().value else {
            panic!("details")
        };
        let mut a = crate::wire::Reader::new(any);
        let url = a.next_field().unwrap().unwrap().value;
        assert_eq!(
            url,
            crate::wire::Value::Len(b"type.googleapis.com/google.rpc.RetryInfo")
        );
        let crate::wire::Value::Len(retry) = a.next_field().unwrap().unwrap().value else {
            panic!("value")
        };
        let crate::wire::Value::Len(d) = crate::wire::Reader::new(retry)
            .next_field()
            .unwrap()
            .unwrap()
            .value
        else {
            panic!("duration")
        };
        let mut dr = crate::wire::Reader::new(d);
        assert_eq!(
            dr.next_field().unwrap().unwrap().value,
            crate::wire::Value::Varint(1)
        );
        assert_eq!(
            dr.next_field().unwrap().unwrap().value,
            crate::wire::Value::Varint(500_000_000)
        );
    }
}
