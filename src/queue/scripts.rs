//! The Lua scripts, embedded at build time. Each is `lua/common.lua`
//! followed by its own file, so every operation is one atomic script.

pub struct Script {
    pub name: &'static str,
    pub body: &'static str,
}

macro_rules! script {
    ($name:ident, $file:literal) => {
        pub const $name: Script = Script {
            name: $file,
            body: concat!(
                include_str!("../../lua/common.lua"),
                include_str!(concat!("../../lua/", $file, ".lua"))
            ),
        };
    };
}

script!(POP, "pop");
script!(ACK, "ack");
script!(NACK, "nack");
script!(EXTEND, "extend");
script!(REAP, "reap");
script!(EXPIRE_MOVE, "expire_move");
script!(LREM, "lrem");
script!(INFO, "info");
script!(LEASES, "leases");

pub const ALL: &[&Script] = &[
    &POP,
    &ACK,
    &NACK,
    &EXTEND,
    &REAP,
    &EXPIRE_MOVE,
    &LREM,
    &INFO,
    &LEASES,
];
