//! Frames of the native protocol: a fixed 16-byte header, an rkyv body and a
//! raw payload.
//!
//! All integers are big endian.
//!
//! ```text
//! request frame
//!  offset size field
//!       0    4 frame_len       (u32; bytes after this field: the frame is frame_len + 4)
//!       4    2 api_key         (u16; see `ApiKey`)
//!       6    2 api_version     (u16)
//!       8    4 correlation_id  (u32; echoed in the response)
//!      12    4 body_len        (u32; length of the rkyv body)
//!      16    … body            (rkyv archive of the request type)
//!  16+body_len … payload       (raw bytes up to the end of the frame)
//!
//! response frame
//!  offset size field
//!       0    4 frame_len       (u32)
//!       4    4 correlation_id  (u32; the request's)
//!       8    2 error_code      (u16; frame-level error, 0 = none)
//!      10    2 flags           (u16; reserved, always 0)
//!      12    4 body_len        (u32)
//!      16    … body            (rkyv archive of the response type, or of
//!                               `ErrorBody` when error_code != 0)
//!  16+body_len … payload       (raw bytes up to the end of the frame)
//! ```
//!
//! The body starts 16 bytes into the frame, so it is 16-byte aligned
//! whenever the frame buffer is; [`decode_body`] copies it into an aligned
//! buffer only when it is not. The payload carries record batches (produce
//! requests, fetch responses) that the body references by `(offset, len)`
//! relative to the payload's start; see [`payload_slice`].
//!
//! Encoding writes the header and the body and leaves room in `frame_len`
//! for a payload the caller sends right after (e.g. batches held as
//! [`bytes::Bytes`], with a vectored write, without copying them).
//!
//! Decoding is total: malformed input yields a [`FrameError`], never a panic,
//! and never an allocation sized by a field read from the input before that
//! field has been checked against the bytes actually present. Bodies are
//! validated (rkyv's `bytecheck`) before they are deserialized.

use bytes::{BufMut, BytesMut};
use rkyv::api::high::{HighDeserializer, HighSerializer, HighValidator};
use rkyv::bytecheck::CheckBytes;
use rkyv::rancor;
use rkyv::ser::allocator::ArenaHandle;
use rkyv::ser::{Positional, Writer};
use rkyv::util::AlignedVec;
use rkyv::{Archive, Deserialize, Serialize};
use thiserror::Error;

use crate::api::ApiKey;
use crate::error_code::ErrorCode;
use crate::messages::{ErrorBody, Request};

/// Size of the fixed header of request and response frames, length field
/// included. The body starts at this offset.
pub const FRAME_HEADER_BYTES: usize = 16;
/// Size of the `frame_len` field that starts every frame.
pub const FRAME_LEN_BYTES: usize = 4;
/// Smallest valid `frame_len`: the rest of the fixed header.
pub const FRAME_LEN_MIN: usize = FRAME_HEADER_BYTES - FRAME_LEN_BYTES;
/// The maximum `frame_len` a broker accepts unless configured otherwise
/// (100 MiB).
pub const FRAME_BYTES_MAX_DEFAULT: usize = 100 * 1024 * 1024;
/// Alignment [`decode_body`] guarantees to the archive it validates.
pub const BODY_ALIGN: usize = 16;

const OFF_BODY_LEN: usize = 12;

/// Why a frame or a body could not be encoded or decoded.
///
/// [`FrameError::error_code`] tells which [`ErrorCode`] a server answers
/// with.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum FrameError {
    /// `frame_len` is over the maximum (reported from the first four bytes,
    /// before the rest of the frame is read), or an encoded frame would not
    /// fit the `u32` length field.
    #[error("frame of {len} bytes exceeds the maximum of {max}")]
    TooLarge {
        /// The frame's `frame_len` (bytes after the length field).
        len: usize,
        /// The limit it exceeds.
        max: usize,
    },
    /// `frame_len` is smaller than the rest of the fixed header.
    #[error("frame_len {len} is below the minimum of {FRAME_LEN_MIN}")]
    TooShort {
        /// The frame's `frame_len`.
        len: usize,
    },
    /// Fewer bytes than the frame needs. While reading from a socket this
    /// means "read more".
    #[error("truncated frame: {needed} bytes needed, {available} available")]
    Truncated {
        /// Bytes the frame needs in all (or 4, if even the length is missing).
        needed: usize,
        /// Bytes given.
        available: usize,
    },
    /// More bytes than one frame: the decoders take exactly one frame.
    #[error("{available} bytes given for a frame of {frame_bytes}")]
    TrailingBytes {
        /// Bytes of the frame (`frame_len + 4`).
        frame_bytes: usize,
        /// Bytes given.
        available: usize,
    },
    /// `body_len` is larger than the frame's bytes after the header.
    #[error("body_len {body_len} exceeds the {max} bytes after the header")]
    BadBodyLen {
        /// The frame's `body_len`.
        body_len: usize,
        /// `frame_len - 12`.
        max: usize,
    },
    /// A response's reserved `flags` field is not zero.
    #[error("unknown response flags {flags:#06x}")]
    UnknownFlags {
        /// The field's value.
        flags: u16,
    },
    /// The body failed validation or deserialization (or, when encoding,
    /// serialization). Carries rkyv's message, with memory addresses
    /// redacted so it is safe to send back to a client.
    #[error("bad body: {0}")]
    Body(String),
    /// The request names an API this build does not know.
    #[error("unsupported api key {api_key}")]
    UnsupportedApi {
        /// The request's `api_key`.
        api_key: u16,
    },
    /// The request names a version of a known API this build does not speak.
    #[error("unsupported version {version} of api {api_key}")]
    UnsupportedVersion {
        /// The request's `api_key`.
        api_key: u16,
        /// The request's `api_version`.
        version: u16,
    },
    /// A payload range named by a body lies outside the frame's payload.
    #[error("payload range {offset}+{len} outside a payload of {payload_len} bytes")]
    BadPayloadRange {
        /// Start of the range, relative to the payload.
        offset: u32,
        /// Length of the range.
        len: u32,
        /// Bytes of payload in the frame.
        payload_len: usize,
    },
}

impl FrameError {
    /// The error code a server answers this error with.
    pub fn error_code(&self) -> ErrorCode {
        match self {
            FrameError::TooLarge { .. } => ErrorCode::FrameTooLarge,
            FrameError::UnsupportedApi { .. } => ErrorCode::UnsupportedApi,
            FrameError::UnsupportedVersion { .. } => ErrorCode::UnsupportedVersion,
            FrameError::TooShort { .. }
            | FrameError::Truncated { .. }
            | FrameError::TrailingBytes { .. }
            | FrameError::BadBodyLen { .. }
            | FrameError::UnknownFlags { .. }
            | FrameError::Body(_)
            | FrameError::BadPayloadRange { .. } => ErrorCode::InvalidRequest,
        }
    }

    /// Whether the frame boundary is lost, so the connection cannot go on
    /// and must be closed after answering (everything but body, version and
    /// payload-range errors, which leave the next frame's position known).
    pub fn is_fatal(&self) -> bool {
        !matches!(
            self,
            FrameError::Body(_)
                | FrameError::UnsupportedApi { .. }
                | FrameError::UnsupportedVersion { .. }
                | FrameError::BadPayloadRange { .. }
        )
    }
}

/// The fixed header of a request frame (without the two lengths).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestHeader {
    /// Which API (see [`ApiKey`]); raw, since an unknown key must still be
    /// answered.
    pub api_key: u16,
    /// Version of the API's body.
    pub api_version: u16,
    /// Chosen by the client, echoed in the response.
    pub correlation_id: u32,
}

impl RequestHeader {
    /// A header for `api_key` at `api_version`.
    pub fn new(api_key: ApiKey, api_version: u16, correlation_id: u32) -> RequestHeader {
        RequestHeader {
            api_key: api_key.as_u16(),
            api_version,
            correlation_id,
        }
    }

    /// A header for request type `T` at the newest version this build
    /// speaks.
    pub fn of<T: Request>(correlation_id: u32) -> RequestHeader {
        RequestHeader::new(T::API_KEY, T::API_KEY.max_version(), correlation_id)
    }

    /// The API, if this build knows the key.
    pub fn api(&self) -> Option<ApiKey> {
        ApiKey::from_u16(self.api_key)
    }

    /// The API if this build knows it at the header's version, otherwise the
    /// error to answer with.
    pub fn check_supported(&self) -> Result<ApiKey, FrameError> {
        let api = self.api().ok_or(FrameError::UnsupportedApi {
            api_key: self.api_key,
        })?;
        if !api.supports(self.api_version) {
            return Err(FrameError::UnsupportedVersion {
                api_key: self.api_key,
                version: self.api_version,
            });
        }
        Ok(api)
    }
}

/// The fixed header of a response frame (without the two lengths and the
/// reserved flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ResponseHeader {
    /// The request's correlation id.
    pub correlation_id: u32,
    /// Frame-level error; when not [`ErrorCode::None`] the body is an
    /// [`ErrorBody`].
    pub error: ErrorCode,
}

impl ResponseHeader {
    /// A successful response header.
    pub fn ok(correlation_id: u32) -> ResponseHeader {
        ResponseHeader {
            correlation_id,
            error: ErrorCode::None,
        }
    }
}

/// A type that travels as a frame body: an rkyv archive, validated when
/// decoded.
///
/// Implemented for every request and response type of
/// [`crate::messages`], and for [`ErrorBody`].
pub trait Message: Sized {
    /// Appends the body's archive to `out`. The archive's positions are
    /// relative to where it starts, so `out` may already hold the header.
    fn encode_body(&self, out: &mut BytesMut) -> Result<(), FrameError>;

    /// Validates and deserializes a body. `body` may have any alignment (it
    /// is copied into an aligned buffer when it is not aligned to
    /// [`BODY_ALIGN`]).
    fn decode_body(body: &[u8]) -> Result<Self, FrameError>;
}

/// Appends to a `BytesMut`, with positions relative to where the body
/// starts.
pub(crate) struct BodyWriter<'b> {
    buf: &'b mut BytesMut,
    start: usize,
}

impl Positional for BodyWriter<'_> {
    fn pos(&self) -> usize {
        self.buf.len() - self.start
    }
}

impl<E> Writer<E> for BodyWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> Result<(), E> {
        self.buf.extend_from_slice(bytes);
        Ok(())
    }
}

/// Serializes `value` at the end of `out`: the generic behind
/// [`Message::encode_body`].
pub(crate) fn rkyv_encode<T>(value: &T, out: &mut BytesMut) -> Result<(), FrameError>
where
    T: for<'a, 'b> Serialize<HighSerializer<BodyWriter<'b>, ArenaHandle<'a>, rancor::Error>>,
{
    let start = out.len();
    let writer = BodyWriter { buf: out, start };
    match rkyv::api::high::to_bytes_in::<_, rancor::Error>(value, writer) {
        Ok(_) => Ok(()),
        Err(e) => {
            out.truncate(start);
            Err(FrameError::Body(e.to_string()))
        }
    }
}

/// Validates and deserializes `body`: the generic behind
/// [`Message::decode_body`].
pub(crate) fn rkyv_decode<T>(body: &[u8]) -> Result<T, FrameError>
where
    T: Archive,
    T::Archived: for<'a> CheckBytes<HighValidator<'a, rancor::Error>>
        + Deserialize<T, HighDeserializer<rancor::Error>>,
{
    let result = if (body.as_ptr() as usize) % BODY_ALIGN == 0 {
        rkyv::from_bytes::<T, rancor::Error>(body)
    } else {
        let mut aligned = AlignedVec::<BODY_ALIGN>::with_capacity(body.len());
        aligned.extend_from_slice(body);
        rkyv::from_bytes::<T, rancor::Error>(&aligned)
    };
    result.map_err(|e| FrameError::Body(redact_addresses(&e.to_string())))
}

/// rkyv's validation errors print raw pointers (`0x00007f…`); a server may
/// send a [`FrameError`]'s text back to the client, which must not learn
/// heap addresses. Replaces every `0x` + hex digits with `0x_`.
fn redact_addresses(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(i) = rest.find("0x") {
        out.push_str(&rest[..i + 2]);
        rest = &rest[i + 2..];
        let digits = rest
            .find(|c: char| !c.is_ascii_hexdigit())
            .unwrap_or(rest.len());
        if digits > 0 {
            out.push('_');
        }
        rest = &rest[digits..];
    }
    out.push_str(rest);
    out
}

/// Validates and deserializes a frame body as `T`.
pub fn decode_body<T: Message>(body: &[u8]) -> Result<T, FrameError> {
    T::decode_body(body)
}

/// Reads the length of the frame at the start of `buf`.
///
/// Returns `Ok(None)` while fewer than 4 bytes are available, otherwise the
/// number of bytes of the whole frame (`frame_len + 4`), which may be more
/// than `buf` holds: the caller reads until it has them. A `frame_len` over
/// `max_frame_bytes` (or below the 12-byte minimum) is an error, known from
/// the first 4 bytes, so the frame need not be buffered to be rejected.
pub fn peek_frame_len(buf: &[u8], max_frame_bytes: usize) -> Result<Option<usize>, FrameError> {
    let Some(len) = buf.first_chunk::<FRAME_LEN_BYTES>() else {
        return Ok(None);
    };
    let frame_len = u32::from_be_bytes(*len) as usize;
    if frame_len > max_frame_bytes {
        return Err(FrameError::TooLarge {
            len: frame_len,
            max: max_frame_bytes,
        });
    }
    if frame_len < FRAME_LEN_MIN {
        return Err(FrameError::TooShort { len: frame_len });
    }
    Ok(Some(frame_len + FRAME_LEN_BYTES))
}

/// A frame's fixed fields (bytes 4..12), body and payload.
type Parts<'a> = ([u8; 8], &'a [u8], &'a [u8]);

/// Splits one complete frame into its fixed fields, body and payload.
fn split_frame(frame: &[u8]) -> Result<Parts<'_>, FrameError> {
    let Some(len) = frame.first_chunk::<FRAME_LEN_BYTES>() else {
        return Err(FrameError::Truncated {
            needed: FRAME_LEN_BYTES,
            available: frame.len(),
        });
    };
    let frame_len = u32::from_be_bytes(*len) as usize;
    if frame_len < FRAME_LEN_MIN {
        return Err(FrameError::TooShort { len: frame_len });
    }
    let frame_bytes = frame_len.saturating_add(FRAME_LEN_BYTES);
    if frame.len() < frame_bytes {
        return Err(FrameError::Truncated {
            needed: frame_bytes,
            available: frame.len(),
        });
    }
    if frame.len() > frame_bytes {
        return Err(FrameError::TrailingBytes {
            frame_bytes,
            available: frame.len(),
        });
    }
    let mut fixed = [0u8; 8];
    fixed.copy_from_slice(&frame[FRAME_LEN_BYTES..OFF_BODY_LEN]);
    let mut body_len = [0u8; 4];
    body_len.copy_from_slice(&frame[OFF_BODY_LEN..FRAME_HEADER_BYTES]);
    let body_len = u32::from_be_bytes(body_len) as usize;
    let max = frame_len - FRAME_LEN_MIN;
    if body_len > max {
        return Err(FrameError::BadBodyLen { body_len, max });
    }
    let (body, payload) = frame[FRAME_HEADER_BYTES..].split_at(body_len);
    Ok((fixed, body, payload))
}

/// Decodes one complete request frame (exactly `frame_len + 4` bytes) into
/// its header, body and payload. The body is not validated here: pass it to
/// [`decode_body`] (or [`crate::messages::AnyRequest::decode`]).
pub fn decode_request(frame: &[u8]) -> Result<(RequestHeader, &[u8], &[u8]), FrameError> {
    let (f, body, payload) = split_frame(frame)?;
    let header = RequestHeader {
        api_key: u16::from_be_bytes([f[0], f[1]]),
        api_version: u16::from_be_bytes([f[2], f[3]]),
        correlation_id: u32::from_be_bytes([f[4], f[5], f[6], f[7]]),
    };
    Ok((header, body, payload))
}

/// Decodes one complete response frame (exactly `frame_len + 4` bytes) into
/// its header, body and payload. An unknown error number decodes as
/// [`ErrorCode::Unknown`]; non-zero reserved flags are an error.
pub fn decode_response(frame: &[u8]) -> Result<(ResponseHeader, &[u8], &[u8]), FrameError> {
    let (f, body, payload) = split_frame(frame)?;
    let flags = u16::from_be_bytes([f[6], f[7]]);
    if flags != 0 {
        return Err(FrameError::UnknownFlags { flags });
    }
    let header = ResponseHeader {
        correlation_id: u32::from_be_bytes([f[0], f[1], f[2], f[3]]),
        error: ErrorCode::from_u16(u16::from_be_bytes([f[4], f[5]])),
    };
    Ok((header, body, payload))
}

/// Writes a frame: the 16-byte header (bytes 4..12 being `fixed`) and the
/// body, with `frame_len` counting `payload_len` more bytes.
fn encode_frame<T: Message>(
    fixed: [u8; 8],
    body: &T,
    payload_len: usize,
    capacity: usize,
) -> Result<BytesMut, FrameError> {
    let mut buf = BytesMut::with_capacity(capacity);
    buf.put_bytes(0, FRAME_LEN_BYTES);
    buf.put_slice(&fixed);
    buf.put_bytes(0, 4);
    body.encode_body(&mut buf)?;
    let body_len = buf.len() - FRAME_HEADER_BYTES;
    let frame_len = (buf.len() - FRAME_LEN_BYTES)
        .checked_add(payload_len)
        .filter(|&n| n <= u32::MAX as usize)
        .ok_or(FrameError::TooLarge {
            len: (buf.len() - FRAME_LEN_BYTES).saturating_add(payload_len),
            max: u32::MAX as usize,
        })?;
    buf[..FRAME_LEN_BYTES].copy_from_slice(&(frame_len as u32).to_be_bytes());
    buf[OFF_BODY_LEN..FRAME_HEADER_BYTES].copy_from_slice(&(body_len as u32).to_be_bytes());
    Ok(buf)
}

fn request_fixed(h: &RequestHeader) -> [u8; 8] {
    let mut f = [0u8; 8];
    f[0..2].copy_from_slice(&h.api_key.to_be_bytes());
    f[2..4].copy_from_slice(&h.api_version.to_be_bytes());
    f[4..8].copy_from_slice(&h.correlation_id.to_be_bytes());
    f
}

fn response_fixed(h: &ResponseHeader) -> [u8; 8] {
    let mut f = [0u8; 8];
    f[0..4].copy_from_slice(&h.correlation_id.to_be_bytes());
    f[4..6].copy_from_slice(&h.error.as_u16().to_be_bytes());
    // f[6..8]: flags, reserved, 0.
    f
}

fn payload_total(payload: &[&[u8]]) -> usize {
    payload
        .iter()
        .fold(0usize, |n, p| n.saturating_add(p.len()))
}

/// Encodes a frame and copies `payload` (the concatenation of the slices)
/// after its body.
fn encode_frame_with_payload<T: Message>(
    fixed: [u8; 8],
    body: &T,
    payload: &[&[u8]],
) -> Result<BytesMut, FrameError> {
    let payload_len = payload_total(payload);
    let mut buf = encode_frame(
        fixed,
        body,
        payload_len,
        256usize.saturating_add(payload_len),
    )?;
    for p in payload {
        buf.put_slice(p);
    }
    Ok(buf)
}

/// Encodes a request's header and body; `frame_len` also counts the
/// `payload_len` bytes of payload the caller sends right after the returned
/// bytes (e.g. with a vectored write of the batches).
pub fn encode_request<T: Message>(
    header: &RequestHeader,
    body: &T,
    payload_len: usize,
) -> Result<BytesMut, FrameError> {
    encode_frame(request_fixed(header), body, payload_len, 256)
}

/// Encodes a complete request frame, copying `payload` (the concatenation
/// of the slices) after the body.
pub fn encode_request_with_payload<T: Message>(
    header: &RequestHeader,
    body: &T,
    payload: &[&[u8]],
) -> Result<BytesMut, FrameError> {
    encode_frame_with_payload(request_fixed(header), body, payload)
}

/// Encodes a response's header and body; `frame_len` also counts the
/// `payload_len` bytes of payload the caller sends right after the returned
/// bytes.
pub fn encode_response<T: Message>(
    header: &ResponseHeader,
    body: &T,
    payload_len: usize,
) -> Result<BytesMut, FrameError> {
    encode_frame(response_fixed(header), body, payload_len, 256)
}

/// Encodes a complete response frame, copying `payload` (the concatenation
/// of the slices) after the body.
pub fn encode_response_with_payload<T: Message>(
    header: &ResponseHeader,
    body: &T,
    payload: &[&[u8]],
) -> Result<BytesMut, FrameError> {
    encode_frame_with_payload(response_fixed(header), body, payload)
}

/// Encodes a frame-level error response: header `error`, body
/// [`ErrorBody`] `{ message }`, no payload.
pub fn encode_error_response(
    correlation_id: u32,
    error: ErrorCode,
    message: &str,
) -> Result<BytesMut, FrameError> {
    let header = ResponseHeader {
        correlation_id,
        error,
    };
    encode_response(
        &header,
        &ErrorBody {
            message: message.to_owned(),
        },
        0,
    )
}

/// The bytes `payload[offset..offset + len]`, or
/// [`FrameError::BadPayloadRange`] if the range does not lie inside the
/// payload.
pub fn payload_slice(payload: &[u8], offset: u32, len: u32) -> Result<&[u8], FrameError> {
    let start = offset as usize;
    start
        .checked_add(len as usize)
        .and_then(|end| payload.get(start..end))
        .ok_or(FrameError::BadPayloadRange {
            offset,
            len,
            payload_len: payload.len(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peek_needs_four_bytes() {
        assert_eq!(peek_frame_len(&[], 100), Ok(None));
        assert_eq!(peek_frame_len(&[0, 0, 0], 100), Ok(None));
        assert_eq!(peek_frame_len(&[0, 0, 0, 12], 100), Ok(Some(16)));
        assert_eq!(
            peek_frame_len(&[0, 0, 0, 101], 100),
            Err(FrameError::TooLarge { len: 101, max: 100 })
        );
        assert_eq!(
            peek_frame_len(&[0, 0, 0, 11], 100),
            Err(FrameError::TooShort { len: 11 })
        );
    }

    #[test]
    fn addresses_are_redacted() {
        assert_eq!(
            redact_addresses("ptr 0x00007ff0bd000c40 size 16 in range 0x7f..0xAb"),
            "ptr 0x_ size 16 in range 0x_..0x_"
        );
        assert_eq!(redact_addresses("no pointer 0x"), "no pointer 0x");
        assert_eq!(redact_addresses("invalid UTF-8"), "invalid UTF-8");
    }

    #[test]
    fn payload_slice_bounds() {
        let p = [1u8, 2, 3, 4];
        assert_eq!(payload_slice(&p, 1, 2), Ok(&p[1..3]));
        assert_eq!(payload_slice(&p, 4, 0), Ok(&p[4..4]));
        assert!(payload_slice(&p, 3, 2).is_err());
        assert!(payload_slice(&p, u32::MAX, u32::MAX).is_err());
    }
}
