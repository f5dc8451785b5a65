//! The subset of nftables flock speaks, modelled in memory: a parser for the scripts flock
//! writes and the listings `nft` prints ([`parse`]), a table that applies them with the
//! kernel's checks and dumps a canonical listing ([`table`]), and a packet tracer over it
//! ([`trace`]). Pure: used by the fake applier, by drift detection (comparing canonical
//! forms) and by tests.

pub mod parse;
pub mod table;
pub mod trace;

pub use table::{Ruleset as NftRuleset, Table, TableError, canonical};
