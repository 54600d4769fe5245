//! Speculation parameters and the two modes.

use serde::Serialize;

/// Which algorithm to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SpecMode {
    /// The paper's algorithm, as the reference implementation runs it.
    Paper,
    /// Longer context and reading past the depth limit (see the module docs).
    Extended,
}

/// Speculation parameters; the defaults are vLLM's for `method: "suffix"`.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct SpecParams {
    /// Depth limit of the trees, and the context window in paper mode.
    pub max_depth: usize,
    /// Upper bound on draft tokens.
    pub max_spec: usize,
    /// α: draft tokens allowed per matched token.
    pub spec_factor: f32,
    /// Draft tokens allowed on top of α·p.
    pub spec_offset: f32,
    /// Stop a branch once its estimated probability falls below this.
    pub min_prob: f32,
    /// Draft trees (true) or single paths (false).
    pub tree: bool,
    /// The algorithm.
    pub mode: SpecMode,
}

impl Default for SpecParams {
    fn default() -> Self {
        Self {
            max_depth: crate::tree::DEFAULT_MAX_DEPTH,
            max_spec: 24,
            spec_factor: 1.0,
            spec_offset: 0.0,
            min_prob: 0.1,
            tree: false,
            mode: SpecMode::Extended,
        }
    }
}

impl SpecParams {
    /// The depth limit a [`RequestTree`](crate::tree::RequestTree) should be built with
    /// for these parameters.
    pub fn request_depth(&self) -> usize {
        match self.mode {
            SpecMode::Paper => self.max_depth,
            SpecMode::Extended => usize::MAX,
        }
    }

    /// MAX_SPEC for a match of `p` tokens.
    pub(super) fn budget(&self, p: usize) -> usize {
        let b = (p as f32 * self.spec_factor + self.spec_offset + 1e-6) as i64;
        b.clamp(0, self.max_spec as i64) as usize
    }
}
