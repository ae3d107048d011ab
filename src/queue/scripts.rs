//! Placeholder (replaced by the scripts module).
pub struct Script { pub name: &'static str, pub body: &'static str }
pub const POP: Script = Script { name: "pop", body: "" };
pub const ACK: Script = Script { name: "ack", body: "" };
pub const NACK: Script = Script { name: "nack", body: "" };
pub const EXTEND: Script = Script { name: "extend", body: "" };
pub const REAP: Script = Script { name: "reap", body: "" };
pub const EXPIRE_MOVE: Script = Script { name: "expire_move", body: "" };
pub const LREM: Script = Script { name: "lrem", body: "" };
pub const INFO: Script = Script { name: "info", body: "" };
pub const LEASES: Script = Script { name: "leases", body: "" };
