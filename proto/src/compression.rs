//! Compression of a batch's records section.
//!
//! * LZ4: the LZ4 *frame* format (magic `04 22 4D 18`), independent 64 KiB
//!   blocks, which is what Kafka's clients write (magic 2 batches do not have
//!   the broken header checksum of the old v0/v1 Kafka LZ4 framing).
//! * Zstandard: one standard zstd frame.
//! * gzip: one or more gzip members (RFC 1952), as Kafka's clients write.
//! * snappy: Kafka's (xerial `snappy-java`) framing — an 8-byte magic
//!   `82 'SNAPPY' 00`, version and compatible-version `i32`s, then blocks
//!   of `[length i32][raw snappy block]` — which Java clients and
//!   librdkafka write; a bare raw snappy block is read too.
//!
//! Decompression never produces more than a caller-given limit (by default
//! [`DECOMPRESSED_BYTES_MAX`]): past it, it fails with
//! [`BatchError::DecompressedTooLarge`] instead of allocating further.

use std::io::{Read, Write};

use crate::batch::{BatchError, Compression};

/// Default cap on the decompressed size of one batch's records section.
pub const DECOMPRESSED_BYTES_MAX: usize = 64 << 20;

/// Default zstd level (Kafka's default too).
pub const ZSTD_LEVEL_DEFAULT: i32 = 3;

/// Largest zstd window (log2 bytes) accepted when decompressing: zstd's own
/// default limit, 128 MiB, which bounds the decoder's working memory.
const ZSTD_WINDOW_LOG_MAX: u32 = 27;

/// Bytes decompressed per read step.
const CHUNK_BYTES: usize = 64 << 10;

/// Appends `input` compressed with `codec` to `out`. `zstd_level` is used
/// only for zstd.
pub fn compress(
    codec: Compression,
    input: &[u8],
    zstd_level: i32,
    out: &mut Vec<u8>,
) -> Result<(), BatchError> {
    let failed = |e: std::io::Error| BatchError::Compress {
        codec,
        reason: e.to_string(),
    };
    match codec {
        Compression::None => out.extend_from_slice(input),
        Compression::Lz4 => {
            let info = lz4_flex::frame::FrameInfo::new()
                .block_size(lz4_flex::frame::BlockSize::Max64KB)
                .block_mode(lz4_flex::frame::BlockMode::Independent);
            let mut enc = lz4_flex::frame::FrameEncoder::with_frame_info(info, out);
            enc.write_all(input).map_err(failed)?;
            enc.finish().map_err(|e| failed(e.into()))?;
        }
        Compression::Zstd => {
            let mut enc = zstd::stream::write::Encoder::new(out, zstd_level).map_err(failed)?;
            enc.include_contentsize(true).map_err(failed)?;
            enc.set_pledged_src_size(Some(input.len() as u64))
                .map_err(failed)?;
            enc.write_all(input).map_err(failed)?;
            enc.finish().map_err(failed)?;
        }
        Compression::Gzip => {
            let mut enc = flate2::write::GzEncoder::new(out, flate2::Compression::default());
            enc.write_all(input).map_err(failed)?;
            enc.finish().map_err(failed)?;
        }
        Compression::Snappy => {
            out.extend_from_slice(&XERIAL_MAGIC);
            out.extend_from_slice(&1i32.to_be_bytes());
            out.extend_from_slice(&1i32.to_be_bytes());
            let mut enc = snap::raw::Encoder::new();
            for block in input.chunks(XERIAL_BLOCK_BYTES) {
                let c = enc
                    .compress_vec(block)
                    .map_err(|e| failed(std::io::Error::other(e)))?;
                out.extend_from_slice(&(c.len() as i32).to_be_bytes());
                out.extend_from_slice(&c);
            }
        }
    }
    Ok(())
}

/// The magic that starts Kafka's (xerial) snappy framing.
const XERIAL_MAGIC: [u8; 8] = [0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0];
/// Uncompressed bytes per snappy block written (snappy-java's default).
const XERIAL_BLOCK_BYTES: usize = 32 << 10;

/// Decompresses Kafka's snappy: xerial-framed blocks, or one raw block.
/// Each block's declared size is checked against what is left of `limit`
/// before anything is allocated for it.
fn snappy_bounded(input: &[u8], limit: usize) -> Result<Vec<u8>, BatchError> {
    let codec = Compression::Snappy;
    let bad = |reason: String| BatchError::Decompress { codec, reason };
    let too_large = BatchError::DecompressedTooLarge { codec, limit };
    let mut out: Vec<u8> = Vec::new();
    let raw = |block: &[u8], out: &mut Vec<u8>| -> Result<(), BatchError> {
        let n = snap::raw::decompress_len(block).map_err(|e| bad(e.to_string()))?;
        if n > limit - out.len() {
            return Err(too_large.clone());
        }
        let at = out.len();
        out.try_reserve(n).map_err(|_| too_large.clone())?;
        out.resize(at + n, 0);
        let got = snap::raw::Decoder::new()
            .decompress(block, &mut out[at..])
            .map_err(|e| bad(e.to_string()))?;
        out.truncate(at + got);
        Ok(())
    };
    let Some(mut rest) = input.strip_prefix(&XERIAL_MAGIC[..]) else {
        raw(input, &mut out)?;
        return Ok(out);
    };
    if rest.len() < 8 {
        return Err(bad("snappy framing header cut short".into()));
    }
    rest = &rest[8..];
    while !rest.is_empty() {
        let Some((len, tail)) = rest.split_first_chunk::<4>() else {
            return Err(bad("snappy block length cut short".into()));
        };
        let len = i32::from_be_bytes(*len);
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| l <= tail.len())
            .ok_or_else(|| {
                bad(format!(
                    "snappy block of {len} bytes in {} left",
                    tail.len()
                ))
            })?;
        raw(&tail[..len], &mut out)?;
        rest = &tail[len..];
    }
    Ok(out)
}

/// Decompresses `input` with `codec`, producing at most
/// [`DECOMPRESSED_BYTES_MAX`] bytes.
pub fn decompress(codec: Compression, input: &[u8]) -> Result<Vec<u8>, BatchError> {
    decompress_bounded(codec, input, DECOMPRESSED_BYTES_MAX)
}

/// Decompresses `input` with `codec`, failing with
/// [`BatchError::DecompressedTooLarge`] rather than producing more than
/// `limit` bytes.
pub fn decompress_bounded(
    codec: Compression,
    input: &[u8],
    limit: usize,
) -> Result<Vec<u8>, BatchError> {
    let failed = |e: std::io::Error| BatchError::Decompress {
        codec,
        reason: e.to_string(),
    };
    match codec {
        Compression::None => read_bounded(codec, input, limit),
        Compression::Lz4 => read_bounded(codec, lz4_flex::frame::FrameDecoder::new(input), limit),
        Compression::Zstd => {
            let mut dec = zstd::stream::read::Decoder::with_buffer(input).map_err(failed)?;
            dec.window_log_max(ZSTD_WINDOW_LOG_MAX).map_err(failed)?;
            read_bounded(codec, dec, limit)
        }
        Compression::Gzip => read_bounded(codec, flate2::read::MultiGzDecoder::new(input), limit),
        Compression::Snappy => snappy_bounded(input, limit),
    }
}

/// Reads `r` to its end into a new buffer that never exceeds `limit` bytes.
fn read_bounded<R: Read>(
    codec: Compression,
    mut r: R,
    limit: usize,
) -> Result<Vec<u8>, BatchError> {
    let too_large = BatchError::DecompressedTooLarge { codec, limit };
    let mut out = Vec::new();
    let mut chunk = vec![0u8; CHUNK_BYTES];
    loop {
        let n = match r.read(&mut chunk) {
            Ok(0) => return Ok(out),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(BatchError::Decompress {
                    codec,
                    reason: e.to_string(),
                })
            }
        };
        if n > limit - out.len() {
            return Err(too_large);
        }
        out.try_reserve(n).map_err(|_| too_large.clone())?;
        out.extend_from_slice(&chunk[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        (0..300_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect()
    }

    #[test]
    fn round_trips() {
        let data = sample();
        for codec in ALL {
            let mut out = b"prefix".to_vec();
            compress(codec, &data, ZSTD_LEVEL_DEFAULT, &mut out).unwrap();
            assert_eq!(&out[..6], b"prefix");
            assert_eq!(decompress(codec, &out[6..]).unwrap(), data, "{codec:?}");
        }
    }

    #[test]
    fn empty_round_trips() {
        for codec in ALL {
            let mut out = Vec::new();
            compress(codec, &[], ZSTD_LEVEL_DEFAULT, &mut out).unwrap();
            assert_eq!(decompress(codec, &out).unwrap(), b"", "{codec:?}");
        }
    }

    #[test]
    fn output_is_bounded() {
        let zeros = vec![0u8; 1 << 20];
        for codec in ALL {
            let mut out = Vec::new();
            compress(codec, &zeros, ZSTD_LEVEL_DEFAULT, &mut out).unwrap();
            assert_eq!(
                decompress_bounded(codec, &out, 1000),
                Err(BatchError::DecompressedTooLarge { codec, limit: 1000 })
            );
            assert_eq!(
                decompress_bounded(codec, &out, 1 << 20).unwrap().len(),
                1 << 20
            );
        }
    }

    #[test]
    fn lz4_frame_is_standard() {
        let mut out = Vec::new();
        compress(Compression::Lz4, b"hello", 0, &mut out).unwrap();
        assert_eq!(&out[..4], &[0x04, 0x22, 0x4d, 0x18]);
    }

    #[test]
    fn garbage_fails() {
        for codec in [
            Compression::Lz4,
            Compression::Zstd,
            Compression::Gzip,
            Compression::Snappy,
        ] {
            assert!(matches!(
                decompress(codec, b"not compressed at all"),
                Err(BatchError::Decompress { .. })
            ));
        }
        // A snappy block claiming more than the limit is refused before
        // anything is allocated for it.
        let mut out = Vec::new();
        compress(Compression::Snappy, &vec![7u8; 100_000], 0, &mut out).unwrap();
        assert_eq!(
            decompress_bounded(Compression::Snappy, &out, 10),
            Err(BatchError::DecompressedTooLarge {
                codec: Compression::Snappy,
                limit: 10
            })
        );
        // Every truncation of a framed snappy input is an error, never a
        // panic.
        for n in 9..out.len() {
            let _ = decompress(Compression::Snappy, &out[..n]);
        }
    }

    #[test]
    fn a_raw_snappy_block_is_read_too() {
        let raw = snap::raw::Encoder::new()
            .compress_vec(b"hello snappy")
            .unwrap();
        assert_eq!(
            decompress(Compression::Snappy, &raw).unwrap(),
            b"hello snappy"
        );
    }

    const ALL: [Compression; 5] = [
        Compression::None,
        Compression::Lz4,
        Compression::Zstd,
        Compression::Gzip,
        Compression::Snappy,
    ];
}
