//! The fields of a lease record, in the one order `LEASE_FIELDS` in
//! `lua/lease_core.lua` gives them: the scripts pack a record so, and QUEUE
//! LEASES shows each lease by them (after the ms until its deadline). A
//! field's place is taken from [`LEASE_FIELDS`] by name, at compile time,
//! and a test holds the list to the Lua one.

/// `LEASE_FIELDS` of `lua/lease_core.lua`.
pub const LEASE_FIELDS: &[&str] = &[
    "payload",
    "id",
    "deliveries",
    "dest",
    "dest_end",
    "started",
    "nacks",
    "expiries",
    "first",
    "owner",
    "why",
    "delay",
    "dc",
    "indexed",
];

/// The 0-based place of field `name` in [`LEASE_FIELDS`]; a name that is
/// not there does not compile where a constant asks for it.
pub const fn place(name: &str) -> usize {
    let mut i = 0;
    while i < LEASE_FIELDS.len() {
        if same(LEASE_FIELDS[i].as_bytes(), name.as_bytes()) {
            return i;
        }
        i += 1;
    }
    panic!("not a lease record field")
}

const fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fields_are_those_lease_core_lua_lists_in_its_order() {
        let common = include_str!("../../../lua/lease_core.lua");
        let at = common
            .find("local LEASE_FIELDS = {")
            .expect("lease_core.lua defines LEASE_FIELDS");
        let list = &common[at..];
        let list = &list[list.find('{').unwrap() + 1..list.find('}').unwrap()];
        let lua: Vec<&str> = list
            .split(',')
            .map(|f| f.trim().trim_matches('\''))
            .filter(|f| !f.is_empty())
            .collect();
        assert_eq!(lua, LEASE_FIELDS);
        assert_eq!(place("payload"), 0);
        assert_eq!(place("expiries"), 7);
    }
}
