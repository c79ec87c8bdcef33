//! Zigzag varints and varlongs, as Kafka encodes record fields.
//!
//! A value is zigzag-mapped to an unsigned integer (`0, -1, 1, -2, …` →
//! `0, 1, 2, 3, …`) and written 7 bits at a time, least significant group
//! first, with the high bit of each byte set when more bytes follow. A varint
//! (i32) takes at most [`VARINT_BYTES_MAX`] bytes, a varlong (i64) at most
//! [`VARLONG_BYTES_MAX`].
//!
//! Decoding accepts non-minimal encodings (zero-padded groups, as Kafka's
//! Java client does) but rejects any encoding longer than the maximum or
//! whose last byte carries bits past the type's width.

use bytes::BufMut;

use crate::batch::BatchError;

/// Longest encoding of a varint (i32).
pub const VARINT_BYTES_MAX: usize = 5;
/// Longest encoding of a varlong (i64).
pub const VARLONG_BYTES_MAX: usize = 10;

/// Decodes the zigzag varint at the start of `buf`, returning the value and
/// the number of bytes it took.
pub fn decode_varint(buf: &[u8]) -> Result<(i32, usize), BatchError> {
    let (u, n) = decode_unsigned(buf, VARINT_BYTES_MAX, 32)?;
    let u = u as u32;
    Ok((((u >> 1) as i32) ^ -((u & 1) as i32), n))
}

/// Decodes the zigzag varlong at the start of `buf`, returning the value and
/// the number of bytes it took.
pub fn decode_varlong(buf: &[u8]) -> Result<(i64, usize), BatchError> {
    let (u, n) = decode_unsigned(buf, VARLONG_BYTES_MAX, 64)?;
    Ok((((u >> 1) as i64) ^ -((u & 1) as i64), n))
}

/// Appends the zigzag varint encoding of `value` to `out`.
pub fn put_varint<B: BufMut>(out: &mut B, value: i32) {
    put_unsigned(out, u64::from(zigzag32(value)));
}

/// Appends the zigzag varlong encoding of `value` to `out`.
pub fn put_varlong<B: BufMut>(out: &mut B, value: i64) {
    put_unsigned(out, zigzag64(value));
}

/// Bytes [`put_varint`] writes for `value`.
pub fn varint_len(value: i32) -> usize {
    unsigned_len(u64::from(zigzag32(value)))
}

/// Bytes [`put_varlong`] writes for `value`.
pub fn varlong_len(value: i64) -> usize {
    unsigned_len(zigzag64(value))
}

fn zigzag32(v: i32) -> u32 {
    ((v << 1) ^ (v >> 31)) as u32
}

fn zigzag64(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn put_unsigned<B: BufMut>(out: &mut B, mut u: u64) {
    while u >= 0x80 {
        out.put_u8((u as u8) | 0x80);
        u >>= 7;
    }
    out.put_u8(u as u8);
}

fn unsigned_len(u: u64) -> usize {
    let bits = 64 - u.leading_zeros() as usize;
    bits.div_ceil(7).max(1)
}

/// Reads up to `max_bytes` 7-bit groups of a `bits`-wide unsigned value.
fn decode_unsigned(buf: &[u8], max_bytes: usize, bits: u32) -> Result<(u64, usize), BatchError> {
    let mut value = 0u64;
    for i in 0..max_bytes {
        let b = *buf.get(i).ok_or(BatchError::VarintTruncated)?;
        let shift = 7 * i as u32;
        let group = u64::from(b & 0x7f);
        // The last permitted byte may not continue nor carry bits past `bits`.
        if i + 1 == max_bytes && (b & 0x80 != 0 || group >> (bits - shift) != 0) {
            return Err(BatchError::VarintOverlong);
        }
        value |= group << shift;
        if b & 0x80 == 0 {
            return Ok((value, i + 1));
        }
    }
    Err(BatchError::VarintOverlong)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip32(v: i32) -> Vec<u8> {
        let mut out = Vec::new();
        put_varint(&mut out, v);
        assert_eq!(out.len(), varint_len(v), "len of {v}");
        assert_eq!(decode_varint(&out), Ok((v, out.len())), "value {v}");
        out
    }

    fn round_trip64(v: i64) -> Vec<u8> {
        let mut out = Vec::new();
        put_varlong(&mut out, v);
        assert_eq!(out.len(), varlong_len(v), "len of {v}");
        assert_eq!(decode_varlong(&out), Ok((v, out.len())), "value {v}");
        out
    }

    #[test]
    fn known_encodings() {
        assert_eq!(round_trip32(0), [0x00]);
        assert_eq!(round_trip32(-1), [0x01]);
        assert_eq!(round_trip32(1), [0x02]);
        assert_eq!(round_trip32(63), [0x7e]);
        assert_eq!(round_trip32(-64), [0x7f]);
        assert_eq!(round_trip32(64), [0x80, 0x01]);
        assert_eq!(round_trip32(300), [0xd8, 0x04]);
        assert_eq!(round_trip32(i32::MAX), [0xfe, 0xff, 0xff, 0xff, 0x0f]);
        assert_eq!(round_trip32(i32::MIN), [0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert_eq!(round_trip64(0), [0x00]);
        assert_eq!(round_trip64(-1), [0x01]);
        let mut max = vec![0xfe; 1];
        max.extend([0xff; 8]);
        max.push(0x01);
        assert_eq!(round_trip64(i64::MAX), max);
        max[0] = 0xff;
        assert_eq!(round_trip64(i64::MIN), max);
    }

    #[test]
    fn extremes_round_trip() {
        for v in [0, 1, -1, i32::MAX, i32::MIN, i32::MAX - 1, i32::MIN + 1] {
            round_trip32(v);
            round_trip64(i64::from(v));
        }
        for v in [i64::MAX, i64::MIN, i64::MAX - 1, i64::MIN + 1, 1 << 62] {
            round_trip64(v);
        }
        for shift in 0..64 {
            round_trip64(1i64 << shift);
            round_trip64((1i64 << shift).wrapping_neg());
        }
    }

    #[test]
    fn trailing_bytes_are_not_consumed() {
        assert_eq!(decode_varint(&[0x02, 0xff, 0xff]), Ok((1, 1)));
        assert_eq!(decode_varlong(&[0x80, 0x01, 0x00]), Ok((64, 2)));
    }

    #[test]
    fn truncated() {
        assert_eq!(decode_varint(&[]), Err(BatchError::VarintTruncated));
        assert_eq!(decode_varlong(&[]), Err(BatchError::VarintTruncated));
        assert_eq!(decode_varint(&[0x80]), Err(BatchError::VarintTruncated));
        assert_eq!(
            decode_varint(&[0xff, 0xff, 0xff, 0xff]),
            Err(BatchError::VarintTruncated)
        );
        assert_eq!(decode_varlong(&[0xff; 9]), Err(BatchError::VarintTruncated));
    }

    #[test]
    fn overlong() {
        // A continuation bit on the last permitted byte.
        assert_eq!(decode_varint(&[0xff; 6]), Err(BatchError::VarintOverlong));
        assert_eq!(decode_varint(&[0x80; 5]), Err(BatchError::VarintOverlong));
        assert_eq!(decode_varlong(&[0xff; 11]), Err(BatchError::VarintOverlong));
        assert_eq!(decode_varlong(&[0x80; 10]), Err(BatchError::VarintOverlong));
        // Bits past the type's width in the last byte.
        assert_eq!(
            decode_varint(&[0xff, 0xff, 0xff, 0xff, 0x1f]),
            Err(BatchError::VarintOverlong)
        );
        let mut long = vec![0xff; 9];
        long.push(0x02);
        assert_eq!(decode_varlong(&long), Err(BatchError::VarintOverlong));
        // A varlong-sized value is too long for a varint.
        let mut out = Vec::new();
        put_varlong(&mut out, i64::from(i32::MAX) + 1);
        assert_eq!(decode_varint(&out), Err(BatchError::VarintOverlong));
    }

    #[test]
    fn non_minimal_padding_is_accepted() {
        assert_eq!(decode_varint(&[0x80, 0x00]), Ok((0, 2)));
        assert_eq!(decode_varint(&[0x81, 0x80, 0x80, 0x80, 0x00]), Ok((-1, 5)));
    }
}
