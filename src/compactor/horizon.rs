//! Where a tenant's conversations on a model end, for the cost policy's horizon: the
//! largest request each of its latest conversations reached, as the client sent it. An
//! agent that compacts itself (Claude Code, Codex) or a user who runs `/compact` ends a
//! conversation near the same size every time; a compaction abridge makes just before
//! that point pays for a future the conversation will not have (see [`super::cost`]). A
//! conversation abridge compacted still sends its whole history, so its end is seen too
//! (the caller says how large its requests are as the client sent them); one whose size
//! is not known counts as one that reached the window ([`FAR`]). Compacting never
//! teaches abridge to stop compacting: a compacted conversation that goes on is seen
//! going on. Learned in memory
//! per replica (lost on a restart: the decision's default applies until it is learned
//! again, see `super::decide`), bounded: [`TENANTS`] tenants (the least recent
//! forgotten first), [`MODELS`] models each (a tenant's own least recent forgotten: one
//! tenant naming many models or many tenants' keys cannot make another forget what it
//! is using), [`KEPT`] conversations each, model names cut at 200 characters.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use crate::identity::Fingerprint;

/// Tenants remembered: past it, the one seen least recently is forgotten.
pub const TENANTS: usize = 4096;
/// Models remembered per tenant: past it, the tenant's least recent one is forgotten
/// (so a tenant naming many models forgets only its own).
pub const MODELS: usize = 8;
/// Conversations remembered per tenant and model, the latest.
pub const KEPT: usize = 16;
/// The end of a conversation abridge compacted: past every bound.
pub const FAR: u64 = u64::MAX;
/// Model names longer than this are cut before they are kept.
const MODEL_CHARS: usize = 200;

/// The latest conversations of each tenant and model, with the largest request each
/// reached.
#[derive(Default)]
pub struct Horizons {
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    tenants: HashMap<Fingerprint, Tenant>,
    /// Counts requests seen, to find the tenant seen least recently.
    clock: u64,
}

/// One tenant's models, least recent first, each with its latest conversations.
#[derive(Default)]
struct Tenant {
    models: VecDeque<(String, Latest)>,
    last: u64,
}

/// One tenant and model's latest conversations, oldest first, with their peaks.
type Latest = VecDeque<(Fingerprint, u64)>;

impl Horizons {
    /// `conversation` of `tenant` on `model` sends a request of `tokens` (as the client
    /// sent it; [`FAR`] when abridge compacted it and does not know that size).
    pub fn see(
        &self,
        (tenant, model): (Fingerprint, &str),
        conversation: Fingerprint,
        tokens: u64,
    ) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.clock += 1;
        let clock = seen.clock;
        if !seen.tenants.contains_key(&tenant) && seen.tenants.len() >= TENANTS {
            let least = seen
                .tenants
                .iter()
                .min_by_key(|(_, t)| t.last)
                .map(|(k, _)| *k);
            if let Some(least) = least {
                seen.tenants.remove(&least);
            }
        }
        let entry = seen.tenants.entry(tenant).or_default();
        entry.last = clock;
        let model = bounded(model);
        let latest = match entry.models.iter().position(|(m, _)| m == model) {
            Some(i) => entry.models.remove(i).map_or_else(Latest::new, |(_, l)| l),
            None => Latest::new(),
        };
        entry.models.push_back((model.to_owned(), latest));
        while entry.models.len() > MODELS {
            entry.models.pop_front();
        }
        let Some((_, latest)) = entry.models.back_mut() else {
            return;
        };
        match latest.iter().position(|(c, _)| *c == conversation) {
            Some(i) => {
                let (_, peak) = latest.remove(i).unwrap_or((conversation, 0));
                latest.push_back((conversation, peak.max(tokens)));
            }
            None => latest.push_back((conversation, tokens)),
        }
        while latest.len() > KEPT {
            latest.pop_front();
        }
    }

    /// Where the tenant's other conversations on `model` that grew past `floor` ended:
    /// their largest requests, smallest first (empty: none did yet).
    pub fn ends(
        &self,
        (tenant, model): (Fingerprint, &str),
        conversation: Fingerprint,
        floor: u64,
    ) -> Vec<u64> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let model = bounded(model);
        let Some((_, latest)) = seen
            .tenants
            .get(&tenant)
            .and_then(|t| t.models.iter().find(|(m, _)| m == model))
        else {
            return Vec::new();
        };
        let mut peaks: Vec<u64> = latest
            .iter()
            .filter(|(c, peak)| *c != conversation && *peak > floor)
            .map(|(_, peak)| *peak)
            .collect();
        peaks.sort_unstable();
        peaks
    }
}

/// Where a conversation of `prompt` tokens is expected to end, from where the others
/// ended (`ends`, smallest first): the median end of those that grew past it; `None`
/// when none is known at all; `prompt` itself when every known one ended before it
/// grew this far (it is expected to end now, as they did).
pub fn expected_end(ends: &[u64], prompt: u64) -> Option<u64> {
    if ends.is_empty() {
        return None;
    }
    let beyond = &ends[ends.partition_point(|&end| end <= prompt)..];
    Some(beyond.get(beyond.len() / 2).copied().unwrap_or(prompt))
}

impl Horizons {
    /// Everything learned here, learned by `other` too (`abridge replay` carries what
    /// one conversation of a session taught to the next one's proxy, as one proxy would
    /// have learned it).
    pub fn carry_into(&self, other: &Horizons) {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        for (tenant, t) in &seen.tenants {
            for (model, latest) in &t.models {
                for &(conversation, peak) in latest {
                    other.see((*tenant, model), conversation, peak);
                }
            }
        }
    }
}

fn bounded(model: &str) -> &str {
    match model.char_indices().nth(MODEL_CHARS) {
        Some((i, _)) => &model[..i],
        None => model,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> Fingerprint {
        Fingerprint::from_hex(&format!("{n:02x}").repeat(32)).unwrap()
    }

    #[test]
    fn the_ends_are_the_peaks_of_the_other_large_conversations() {
        let h = Horizons::default();
        let key = (id(1), "m");
        assert!(h.ends(key, id(10), 100).is_empty());
        for (conversation, sizes) in [
            (10, [50, 150, 154]),
            (11, [60, 149, 120]),
            (12, [20, 30, 40]),
        ] {
            for size in sizes {
                h.see(key, id(conversation), size);
            }
        }
        // 12 never grew past the floor (a subagent's); 10 peaked at 154, 11 at 149.
        assert_eq!(h.ends(key, id(13), 100), [149, 154]);
        // A conversation's own peak is not its horizon.
        assert_eq!(h.ends(key, id(10), 100), [149]);
        // Another tenant, another model: nothing learned.
        assert!(h.ends((id(2), "m"), id(13), 100).is_empty());
        assert!(h.ends((id(1), "n"), id(13), 100).is_empty());
    }

    #[test]
    fn a_conversation_ends_where_those_that_grew_as_far_ended() {
        assert_eq!(expected_end(&[], 150), None);
        let ends = [120, 149, 154, 160, 172];
        // Of those that grew past 150 (154, 160, 172), the median.
        assert_eq!(expected_end(&ends, 150), Some(160));
        assert_eq!(expected_end(&ends, 100), Some(154));
        assert_eq!(expected_end(&ends, 165), Some(172));
        // Past every one of them: expected to end now.
        assert_eq!(expected_end(&ends, 180), Some(180));
        assert_eq!(expected_end(&ends, 172), Some(172));
        // One abridge compacted went on: past the others, the horizon is far.
        assert_eq!(expected_end(&[149, 154, FAR], 160), Some(FAR));
    }

    #[test]
    fn only_the_latest_conversations_are_kept() {
        let h = Horizons::default();
        let key = (id(1), "m");
        h.see(key, id(0), 500);
        for n in 1..=KEPT as u8 {
            h.see(key, id(n), 200);
        }
        assert_eq!(
            h.ends(key, id(99), 100),
            [200; KEPT],
            "the oldest was dropped"
        );
    }

    #[test]
    fn a_tenant_naming_many_models_forgets_only_its_own() {
        let h = Horizons::default();
        h.see((id(1), "m"), id(10), 150);
        h.see((id(2), "m"), id(20), 160);
        for n in 0..=MODELS {
            h.see((id(1), &format!("spray-{n}")), id(11), 100);
        }
        assert!(
            h.ends((id(1), "m"), id(99), 0).is_empty(),
            "its own oldest model"
        );
        assert_eq!(h.ends((id(2), "m"), id(99), 0), [160], "another tenant's");
    }

    #[test]
    fn the_tenant_seen_least_recently_is_forgotten_first() {
        let h = Horizons::default();
        h.see((id(1), "m"), id(10), 150);
        h.see((id(2), "m"), id(20), 160);
        h.see((id(1), "m"), id(10), 151);
        {
            // Others fill the map, each seen after these two.
            let mut seen = h.seen.lock().unwrap();
            for n in 0..(TENANTS - 2) as u64 {
                let tenant = Fingerprint::from_hex(&format!("{n:064x}")).unwrap();
                let last = 100 + n;
                let t = Tenant {
                    last,
                    ..Tenant::default()
                };
                seen.tenants.insert(tenant, t);
            }
        }
        h.see((id(3), "m"), id(30), 170);
        assert_eq!(h.seen.lock().unwrap().tenants.len(), TENANTS);
        assert!(
            h.ends((id(2), "m"), id(99), 0).is_empty(),
            "seen least recently"
        );
        assert_eq!(h.ends((id(1), "m"), id(99), 0), [151]);
        assert_eq!(h.ends((id(3), "m"), id(99), 0), [170]);
    }

    #[test]
    fn what_is_carried_is_learned_elsewhere() {
        let (h, other) = (Horizons::default(), Horizons::default());
        h.see((id(1), "m"), id(10), 150);
        other.see((id(1), "m"), id(10), 120);
        h.carry_into(&other);
        assert_eq!(other.ends((id(1), "m"), id(11), 100), [150]);
    }
}
