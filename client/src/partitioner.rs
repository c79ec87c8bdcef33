//! Kafka's default key partitioner: `toPositive(murmur2(key)) % partitions`,
//! so a keyed record lands on the same partition as with the Java client
//! and librdkafka (`murmur2_random`).

/// Kafka's murmur2 (seed `0x9747b28c`), as `org.apache.kafka.common.utils.Utils.murmur2`.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h: u32 = SEED ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition of a keyed record among `partitions` (Kafka's
/// `toPositive(murmur2(key)) % partitions`). `partitions` must be positive.
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    (murmur2(key) as u32 & 0x7fff_ffff) % partitions.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Apache Kafka's `UtilsTest.testMurmur2` vectors.
    #[test]
    fn murmur2_matches_kafka() {
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ];
        for (key, want) in cases {
            assert_eq!(murmur2(key), want, "{}", String::from_utf8_lossy(key));
        }
    }

    #[test]
    fn partition_uses_the_positive_hash() {
        // toPositive(-790332482) = 1357151166; % 50 = 16.
        assert_eq!(partition_for_key(b"foobar", 50), 16);
        for k in [&b""[..], b"x", b"key-1"] {
            assert!(partition_for_key(k, 7) < 7);
        }
    }
}
