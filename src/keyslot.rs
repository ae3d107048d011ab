//! Redis Cluster's hash slot of a key (`keyHashSlot` in Redis's
//! cluster.c): what both the configuration (a queue's keys must share its
//! slot) and the cluster router need, with no dependency of its own.

/// The number of hash slots of a Redis Cluster.
pub const SLOTS: usize = 16384;

/// The slot of `key`: CRC16 (XMODEM) of the key, or of its hash tag (what
/// lies between the first `{` and the next `}`, when that is not empty),
/// modulo 16384.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(hashed) & (SLOTS as u16 - 1)
}
