//! The latest compactions, newest last, for the admin API and the dashboard: a bounded
//! ring in memory (per process).

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::identity::Fingerprint;
use crate::strategies::Strategy;

/// How many compactions the ring remembers.
const CAPACITY: usize = 100;

/// One compaction, as the admin API lists it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CompactionEvent {
    pub at_ms: u64,
    pub conversation: Fingerprint,
    pub strategy: Strategy,
    pub requested: Strategy,
    pub trigger: &'static str,
    pub tokens_before: u64,
    pub tokens_after: u64,
    pub messages_replaced: usize,
    pub fallback: Option<String>,
}

/// A std mutex around plain data; never held across an `.await`.
#[derive(Default)]
pub struct Ring(Mutex<VecDeque<CompactionEvent>>);

impl Ring {
    pub fn push(&self, event: CompactionEvent) {
        let mut ring = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if ring.len() == CAPACITY {
            ring.pop_front();
        }
        ring.push_back(event);
    }

    /// Newest first.
    pub fn latest(&self) -> Vec<CompactionEvent> {
        let ring = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        ring.iter().rev().cloned().collect()
    }
}
