//! One TCP connection: writes request frames (head + payload pieces, with
//! vectored writes) and reads whole response frames.

use std::io::{self, IoSlice};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use weir_proto::frame::{self, FRAME_LEN_BYTES};

use crate::error::{ClientError, Result};

/// Most slices handed to one `writev` (Linux's `IOV_MAX`).
const IOV_MAX: usize = 1024;

/// Writes `head` then every `payload` piece, without copying them.
pub(crate) async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    head: &[u8],
    payload: &[Bytes],
) -> io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = std::iter::once(head)
        .chain(payload.iter().map(|b| &b[..]))
        .filter(|s| !s.is_empty())
        .map(IoSlice::new)
        .collect();
    let mut bufs = &mut slices[..];
    while !bufs.is_empty() {
        let k = bufs.len().min(IOV_MAX);
        let n = w.write_vectored(&bufs[..k]).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "connection accepted no more bytes",
            ));
        }
        IoSlice::advance_slices(&mut bufs, n);
    }
    w.flush().await
}

fn eof_to_disconnected(e: io::Error) -> ClientError {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        ClientError::Disconnected
    } else {
        ClientError::Io(e)
    }
}

/// Reads one whole frame (length field included). A `frame_len` over
/// `max_frame_bytes` is an error before anything else is read.
pub(crate) async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    max_frame_bytes: usize,
) -> Result<Bytes> {
    let mut len = [0u8; FRAME_LEN_BYTES];
    r.read_exact(&mut len).await.map_err(eof_to_disconnected)?;
    let total = frame::peek_frame_len(&len, max_frame_bytes)?
        .expect("four bytes are enough to read the length");
    let mut buf = BytesMut::zeroed(total);
    buf[..FRAME_LEN_BYTES].copy_from_slice(&len);
    r.read_exact(&mut buf[FRAME_LEN_BYTES..])
        .await
        .map_err(eof_to_disconnected)?;
    Ok(buf.freeze())
}

/// The correlation id of a response frame (bytes 4..8).
pub(crate) fn response_correlation_id(frame: &[u8]) -> Option<u32> {
    frame
        .get(4..8)
        .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")))
}

/// Whether correlation id `got` was sent before `expected` (ids increase,
/// wrapping; "before" means less than 2^31 steps behind).
pub(crate) fn is_earlier(got: u32, expected: u32) -> bool {
    let behind = expected.wrapping_sub(got);
    behind != 0 && behind < (1 << 31)
}

/// Reads frames until the answer to `corr`. Answers to earlier requests
/// (sent with acks=0, which a server may or may not answer) are skipped; an
/// answer to a later one is a protocol violation.
pub(crate) async fn read_response<R: AsyncRead + Unpin>(
    r: &mut R,
    corr: u32,
    max_frame_bytes: usize,
) -> Result<Bytes> {
    loop {
        let frame = read_frame(r, max_frame_bytes).await?;
        match response_correlation_id(&frame) {
            Some(got) if got == corr => return Ok(frame),
            Some(got) if is_earlier(got, corr) => continue,
            got => {
                return Err(ClientError::InvalidResponse(format!(
                    "correlation id {got:?} while waiting for {corr}"
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_proto::frame::{encode_response_with_payload, ResponseHeader};
    use weir_proto::messages::ErrorBody;

    fn response(corr: u32, payload: &[u8]) -> Vec<u8> {
        let body = ErrorBody {
            message: String::new(),
        };
        encode_response_with_payload(&ResponseHeader::ok(corr), &body, &[payload])
            .unwrap()
            .to_vec()
    }

    #[test]
    fn earlier_wraps() {
        assert!(is_earlier(1, 2));
        assert!(!is_earlier(2, 2));
        assert!(!is_earlier(3, 2));
        assert!(is_earlier(u32::MAX, 0));
        assert!(!is_earlier(0, u32::MAX));
    }

    #[tokio::test]
    async fn writes_head_and_pieces_in_order() {
        let (mut a, mut b) = tokio::io::duplex(7);
        let pieces: Vec<Bytes> = (0..2000u32)
            .map(|i| Bytes::from(i.to_be_bytes().to_vec()))
            .collect();
        let writer = tokio::spawn(async move {
            write_frame(&mut a, b"head", &pieces).await.unwrap();
        });
        let mut got = Vec::new();
        b.read_to_end(&mut got).await.unwrap();
        writer.await.unwrap();
        assert_eq!(&got[..4], b"head");
        let want: Vec<u8> = (0..2000u32).flat_map(|i| i.to_be_bytes()).collect();
        assert_eq!(&got[4..], &want[..]);
    }

    #[tokio::test]
    async fn skips_stale_answers_and_rejects_future_ones() {
        let mut input = response(5, b"old");
        input.extend(response(7, b"new"));
        let mut r = &input[..];
        let f = read_response(&mut r, 7, 1 << 20).await.unwrap();
        let (h, _, payload) = frame::decode_response(&f).unwrap();
        assert_eq!((h.correlation_id, payload), (7, &b"new"[..]));

        let input = response(9, b"");
        let mut r = &input[..];
        assert!(matches!(
            read_response(&mut r, 7, 1 << 20).await,
            Err(ClientError::InvalidResponse(_))
        ));
    }

    #[tokio::test]
    async fn limits_and_eof() {
        let input = response(1, &[0u8; 100]);
        let mut r = &input[..];
        assert!(matches!(
            read_frame(&mut r, 50).await,
            Err(ClientError::Protocol(frame::FrameError::TooLarge { .. }))
        ));
        let mut r = &input[..input.len() - 1];
        assert!(matches!(
            read_frame(&mut r, 1 << 20).await,
            Err(ClientError::Disconnected)
        ));
    }
}
