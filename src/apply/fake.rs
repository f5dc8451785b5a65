//! The in-memory backend for unit tests (knftables' `Fake`, in Rust): applies a whole
//! transaction or nothing, refuses jumps to missing chains and lookups of missing sets like
//! the kernel does, counts transactions, and dumps a canonical listing.

use super::{ApplyError, Backend, ObjectInfo};
use crate::nft::parse::Kind;
use crate::nft::{NftRuleset, Table};
use crate::render::names::{FAMILY, TABLE};

/// An in-memory nftables.
#[derive(Debug, Default, Clone)]
pub struct FakeNft {
    state: NftRuleset,
    /// Committed transactions.
    pub(crate) transactions: usize,
    /// The last script passed to `run` (committed or not).
    pub(crate) last_script: Option<String>,
    /// While set, every `run` fails with this message (tests of failure handling).
    pub(crate) fail_with: Option<String>,
}

impl FakeNft {
    pub fn new() -> Self {
        Self::default()
    }

    /// flock's table, if it exists.
    pub fn table(&self) -> Option<&Table> {
        self.state.table(FAMILY, TABLE)
    }

    /// The whole state (every table).
    #[cfg(feature = "testkit")]
    pub(crate) fn state(&self) -> &NftRuleset {
        &self.state
    }

    /// The whole state (every table), for tests that edit it behind flock's back.
    #[cfg(test)]
    pub(crate) fn state_mut(&mut self) -> &mut NftRuleset {
        &mut self.state
    }

    /// Canonical dump of every table.
    #[cfg(test)]
    pub(crate) fn dump(&self) -> String {
        self.state.dump()
    }
}

fn rejected(context: &str, e: impl std::fmt::Display) -> ApplyError {
    ApplyError::Rejected { context: context.into(), message: e.to_string() }
}

impl Backend for FakeNft {
    fn run(&mut self, script: &str) -> Result<(), ApplyError> {
        self.last_script = Some(script.to_string());
        if let Some(m) = &self.fail_with {
            return Err(rejected("fake nft", m));
        }
        self.state.apply_script(script).map_err(|e| rejected("fake nft", e))?;
        self.transactions += 1;
        Ok(())
    }

    fn check(&mut self, script: &str) -> Result<(), ApplyError> {
        self.state.clone().apply_script(script).map_err(|e| rejected("fake nft --check", e))
    }

    fn list_table(&mut self) -> Result<Option<String>, ApplyError> {
        Ok(self.table().map(Table::dump))
    }

    fn read_state(&mut self) -> Result<Option<super::state::TableState>, ApplyError> {
        Ok(self.table().map(|t| super::state::TableState::Canonical(t.dump())))
    }

    fn list_objects(&mut self) -> Result<Vec<ObjectInfo>, ApplyError> {
        let Some(t) = self.table() else { return Ok(Vec::new()) };
        Ok(t.objects()
            .into_iter()
            .map(|(kind, name)| {
                let handle = match kind {
                    Kind::Chain => t.chains[&name].handle,
                    Kind::Set | Kind::Map => t.sets[&name].handle,
                };
                ObjectInfo { kind, name, handle }
            })
            .collect())
    }
}
