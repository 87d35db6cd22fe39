//! Which Raft group holds a stream (the rule is the wire contract's).

pub use ursula_wire::placement::group_of;
