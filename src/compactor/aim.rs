//! Where a compaction aims, in the provider's count: the size policy's [`target`] (room
//! for a few turns of the history's growth below the threshold), the cost policy's
//! [`deep`] cut below it where the window allows, how far an aim is raised so a summary
//! or index still fits ([`with_room`], [`raised_at_most`]), and the budget that leaves
//! the strategies for the items ([`items_budget`]). Pure.

use crate::config::CompactionConfig;

use super::estimate::{added, beside, essential, scaled, unscaled};
use super::turn::Turn;

/// A compaction's budget for the items (in abridge's estimate) when the request is to
/// come to `budget` (the provider's count): what is left beside the recall tool and what
/// the request carries besides its items.
pub fn items_budget(turn: &Turn<'_, '_>, budget: u64, ratio: f64) -> u64 {
    unscaled(budget.saturating_sub(beside(turn)), ratio).saturating_sub(added(turn))
}

/// Under the cost policy, where a compaction aims: `compaction.target_ratio` of the
/// threshold, far below it, so one checkpoint serves many requests — but never below
/// [`DEEP_FLOOR`], which leaves a summary or index room to keep what matters, nor above
/// where the size policy aims (`growth`: the history's, for [`target`]). So on a small
/// window nothing changes.
pub fn deep(config: &CompactionConfig, threshold: u64, growth: u64) -> u64 {
    let (size, deep) = aims(config, threshold, growth);
    size.min(deep)
}

/// Whether [`deep`] goes deeper than the size policy would (the window is large enough).
pub fn deepens(config: &CompactionConfig, threshold: u64, growth: u64) -> bool {
    let (size, deep) = aims(config, threshold, growth);
    deep < size
}

/// Where the size policy aims, and where the cost policy would aim below it.
fn aims(config: &CompactionConfig, threshold: u64, growth: u64) -> (u64, u64) {
    let soft = ((threshold as f64) * config.soft_ratio) as u64;
    let deep = ((threshold as f64) * config.target_ratio) as u64;
    (
        target(config, threshold, soft, growth),
        deep.max(DEEP_FLOOR),
    )
}

/// The fewest tokens a deep compaction leaves (see [`deep`]).
pub const DEEP_FLOOR: u64 = 16_000;

/// Tokens a compaction leaves, where the threshold allows, for what replaces the
/// middle (a summary, an index) beside the leading system messages and the final turn.
pub const REPLACEMENT_FLOOR: u64 = 600;

/// `budget` (the provider's count, `ratio` converts), raised where it leaves less than
/// [`REPLACEMENT_FLOOR`] beside what every plan keeps, up to `ceiling` (the soft
/// threshold, and [`raised_at_most`]): a fast-growing history on a small window must
/// not aim so low that no summary or index fits.
pub fn with_room(turn: &Turn<'_, '_>, budget: u64, ceiling: u64, ratio: f64) -> u64 {
    let floor = scaled(essential(turn) + added(turn) + REPLACEMENT_FLOOR, ratio) + beside(turn);
    budget.max(floor.min(ceiling))
}

/// How high a compaction's aim may be raised for room ([`with_room`]): a turn's growth
/// (and a fifth of it, for the estimate's error) below the threshold, so the next turn
/// still fits and compactions keep coming in steps.
pub fn raised_at_most(threshold: u64, growth: u64) -> u64 {
    threshold.saturating_sub(growth.saturating_add(growth / 5))
}

/// What a compaction aims for: below the hard threshold by room for a few turns of
/// this history's growth (`compaction.room_turns`), at least the soft threshold's
/// headroom, so compactions come in steps and the forwarded prefix stays put between
/// them. It may be 0: the strategies then go as low as the minimal plan.
pub fn target(config: &CompactionConfig, threshold: u64, soft: u64, growth: u64) -> u64 {
    let room =
        (threshold - soft.min(threshold)).max(growth.saturating_mul(u64::from(config.room_turns)));
    threshold.saturating_sub(room)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_leaves_room_for_the_growth_within_what_is_left() {
        let config = CompactionConfig::default();
        // Slow chat: the soft headroom (30 %) is the room.
        assert_eq!(target(&config, 10_000, 7_000, 100), 7_000);
        // 20 % a turn: room for three turns.
        assert_eq!(target(&config, 10_000, 7_000, 2_000), 4_000);
        // Faster than a third of the threshold a turn: as low as it goes.
        assert_eq!(target(&config, 10_000, 7_000, 5_000), 0);
    }

    /// The cost policy cuts deeper than the size policy only where the window leaves room
    /// for it: at a 4,000- or 16,000-token threshold it aims where the size policy does.
    #[test]
    fn a_deep_cut_needs_a_large_window() {
        let config = CompactionConfig::default();
        assert!(!deepens(&config, 4_000, 300));
        assert!(!deepens(&config, 16_000, 300));
        assert_eq!(
            deep(&config, 16_000, 300),
            target(&config, 16_000, 11_200, 300)
        );
        assert!(deepens(&config, 60_000, 300));
        assert!(deep(&config, 60_000, 300) < target(&config, 60_000, 42_000, 300));
    }
}
