//! Hash slots, computed as Redis Cluster computes them (`keyHashSlot` in
//! Redis's cluster.c).

use crate::command::keys::{key_positions, KeyPos};
use crate::command::table::Table;
use crate::command::Args;

pub use crate::keyslot::{key_slot, SLOTS};

/// The slot a request has to be served in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandSlot {
    /// No keys: any node serves it.
    Keyless,
    /// Every key is in this slot.
    Slot(u16),
    /// Keys in different slots: Redis refuses it with CROSSSLOT.
    CrossSlot,
    /// See [`KeyPos::Unknown`]: Redis refuses it, wherever it goes.
    Unknown,
}

/// The slot of the request `args`, by its keys (found with `table`, see
/// [`key_positions`]).
pub fn command_slot(args: Args<'_>, table: Option<&Table>) -> CommandSlot {
    match key_positions(args, table) {
        KeyPos::Keyless => CommandSlot::Keyless,
        KeyPos::Unknown => CommandSlot::Unknown,
        KeyPos::At(positions) => {
            let mut slots = positions
                .iter()
                .map(|&i| key_slot(args.get(i).unwrap_or_default()));
            let Some(first) = slots.next() else {
                return CommandSlot::Keyless;
            };
            if slots.all(|s| s == first) {
                CommandSlot::Slot(first)
            } else {
                CommandSlot::CrossSlot
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::with_words;

    #[test]
    fn known_slots() {
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b""), 0);
        // The reference check value of CRC16/XMODEM.
        assert_eq!(
            crc16::State::<crc16::XMODEM>::calculate(b"123456789"),
            0x31C3
        );
        assert_eq!(key_slot(b"123456789"), 0x31C3 & 0x3FFF);
    }

    #[test]
    fn hash_tags() {
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"{user1000}.followers"), key_slot(b"user1000"));
        // An empty first tag: the whole key is hashed.
        assert_eq!(key_slot(b"foo{}{bar}"), 8363);
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
        // The tag runs from the first '{' to the next '}'.
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
        // No closing brace: the whole key.
        assert_eq!(key_slot(b"foo{bar"), 15278);
        assert_eq!(key_slot(b"{bar"), 4015);
        assert_eq!(key_slot(b"{a}"), key_slot(b"a"));
        assert_eq!(key_slot(b"}a{b}"), key_slot(b"b"));
    }

    #[test]
    fn command_slots() {
        let slot = |words: &[&str]| with_words(words, |a| command_slot(a, None));
        assert_eq!(slot(&["GET", "foo"]), CommandSlot::Slot(12182));
        assert_eq!(
            slot(&["MSET", "{t}a", "1", "{t}b", "2"]),
            CommandSlot::Slot(key_slot(b"t"))
        );
        assert_eq!(
            slot(&["MSET", "foo", "1", "bar", "2"]),
            CommandSlot::CrossSlot
        );
        // Values are no keys.
        assert_eq!(
            slot(&["MSET", "{t}a", "foo", "{t}b", "bar"]),
            CommandSlot::Slot(key_slot(b"t"))
        );
        assert_eq!(slot(&["PING"]), CommandSlot::Keyless);
        assert_eq!(slot(&["EVAL", "s", "0"]), CommandSlot::Keyless);
        assert_eq!(slot(&["GET"]), CommandSlot::Unknown);
        assert_eq!(slot(&["NOSUCH", "k"]), CommandSlot::Unknown);
    }
}
