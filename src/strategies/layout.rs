//! The structure of a conversation that every strategy builds on: where the turn
//! boundaries are, which items never move, and which tool calls and results belong
//! together (see the parent module's *Turn boundaries*).

use crate::conversation::{Item, Opaque, Role, ToolCall};

use super::CannotCompact;

/// Which side of the user/assistant alternation a message is on.
pub(super) fn is_user(message: &Item<'_>) -> bool {
    message.role == Role::User
}

pub(super) fn is_result(message: &Item<'_>) -> bool {
    message.is_result()
}

/// The structure of a conversation that every strategy builds on.
pub(crate) struct Layout<'m, 'a> {
    pub messages: &'m [Item<'a>],
    /// Items that never move: the leading system/developer items (and any within the
    /// first turn, with what precedes them), and everything up to the last of the
    /// provider's own compaction items (only what follows it may be compacted).
    pub sys: usize,
    /// Index of the last ask (a user's own words): the final turn starts here.
    pub last_user: usize,
    /// The final turn's last assistant item (`last_user` when it has none): the tool
    /// results between the ask and it, which the model has already read and acted on,
    /// may be cleared (see `clear`, `recency`); the newest exchange, from here on,
    /// never is.
    pub clear_end: usize,
    /// `cut_ok[k]`: a cut before message `k` is at a turn boundary (`k` in `0..=n`).
    pub cut_ok: Vec<bool>,
    /// For each tool/function result: the assistant message and the position of the
    /// call in it (`0` for a function message).
    pub call_of: Vec<Option<(usize, usize)>>,
    /// Tool call/result pairs as (call message, result message).
    pub pairs: Vec<(usize, usize)>,
}

impl<'m, 'a> Layout<'m, 'a> {
    pub fn new(messages: &'m [Item<'a>]) -> Result<Self, CannotCompact> {
        let n = messages.len();
        let instructions = messages.iter().take_while(|m| m.is_instruction()).count();
        // Instructions within the first turn are head too (Claude Code sends its
        // environment block as a system message right after the first user message).
        let first_reply = messages
            .iter()
            .position(|m| m.role == Role::Assistant)
            .unwrap_or(n);
        let pinned = messages[..first_reply]
            .iter()
            .rposition(Item::is_instruction)
            .map_or(0, |i| i + 1);
        let barrier = messages
            .iter()
            .rposition(|m| m.opaque == Opaque::Barrier)
            .map_or(0, |b| b + 1);
        let sys = instructions.max(barrier).max(pinned);
        let last_user = messages
            .iter()
            .rposition(Item::is_ask)
            .ok_or(CannotCompact::NoFinalTurn)?;
        let clear_end = messages[last_user..]
            .iter()
            .rposition(|m| m.role == Role::Assistant)
            .map_or(last_user, |a| last_user + a);
        let mut open: std::collections::HashMap<&str, (usize, usize)> = Default::default();
        let mut last_assistant = None;
        let mut call_of = vec![None; n];
        let mut pairs = Vec::new();
        for (i, m) in messages.iter().enumerate() {
            if m.role == Role::Assistant {
                last_assistant = Some(i);
            }
            for (pos, call) in m.calls.iter().enumerate() {
                open.insert(call.id.as_ref(), (i, pos));
            }
            for id in &m.results {
                if let Some(&(a, pos)) = open.get(id.as_ref()) {
                    call_of[i].get_or_insert((a, pos));
                    pairs.push((a, i));
                }
            }
            if m.role == Role::Function
                && let Some(a) = last_assistant
            {
                call_of[i] = Some((a, 0));
                pairs.push((a, i));
            }
        }
        // A pair (a, b) forbids cuts before a+1 ..= b.
        let mut diff = vec![0i64; n + 2];
        for &(a, b) in &pairs {
            diff[a + 1] += 1;
            diff[b + 1] -= 1;
        }
        let mut open_spans = 0i64;
        let mut cut_ok = Vec::with_capacity(n + 1);
        for k in 0..=n {
            open_spans += diff[k];
            // An item that travels with the next one is never cut from it.
            let glued = k > 0 && messages[k - 1].opaque == Opaque::WithNext;
            cut_ok.push(k == n || (open_spans == 0 && !glued && !is_result(&messages[k])));
        }
        Ok(Self {
            messages,
            sys,
            last_user,
            clear_end,
            cut_ok,
            call_of,
            pairs,
        })
    }

    /// The call a tool/function result answers, if it was found.
    pub fn call_for(&self, result: usize) -> Option<&ToolCall<'a>> {
        let (a, pos) = self.call_of[result]?;
        self.messages[a].calls.get(pos)
    }

    /// The call the output `id` of result message `result` answers (a Messages result
    /// answers several calls, one per block); `id` `None`: the call found for it.
    pub fn call_answered(&self, result: usize, id: Option<&str>) -> Option<&ToolCall<'a>> {
        let Some(id) = id else {
            return self.call_for(result);
        };
        let (a, _) = self.call_of[result]?;
        self.messages[a].calls.iter().find(|c| c.id == id)
    }

    /// A tool result of the final turn the model has read and acted on since: one a
    /// plan may clear (digest) when it does not fit with the final turn whole.
    pub fn clearable(&self, k: usize) -> bool {
        k > self.last_user && k < self.clear_end && is_result(&self.messages[k])
    }

    pub fn len(&self) -> usize {
        self.messages.len()
    }

    /// Where a plan that only clears inside the final turn may start at the earliest:
    /// the first turn boundary at or after the head's end, when a result it may clear
    /// follows it (`None`: no such plan).
    pub fn clear_only_start(&self) -> Option<usize> {
        let first = (self.sys..self.len()).find(|&k| self.cut_ok[k])?;
        (first..self.clear_end)
            .any(|k| self.clearable(k))
            .then_some(first)
    }

    /// The edges of the smallest plan: the end of the earliest possible head and the
    /// start of the latest possible kept end (the final turn, from a cut at or before the
    /// last ask); `None` when no cut leaves anything between them to replace.
    pub fn smallest(&self) -> Option<(usize, usize)> {
        let h_min = (self.sys..=self.last_user).find(|&k| self.cut_ok[k])?;
        let t_min = (0..=self.last_user).rev().find(|&k| self.cut_ok[k])?;
        (t_min > h_min).then_some((h_min, t_min))
    }
}
