//! What compaction saved and what it cost: the tally of one exchange — a forwarded
//! request, a summary call, a recall round — in tokens as the provider counted them and
//! in money at the price table ([`crate::prices`]); tallies add up per conversation (the
//! store) and in total (the stats). Pure: no I/O.
//!
//! A forwarded request's tally holds what the provider reported for it and what the
//! request would have cost sent as the client sent it ("direct"). Direct is the provider's
//! own figure for a request abridge did not change. For a compacted one it is estimated:
//! abridge's estimate of the client's request, in the provider's units (scaled by the
//! provider's count of the forwarded request over abridge's estimate of it); read from
//! the prompt cache, what the client's previous request of the conversation held, when
//! that request was recent enough to be cached ([`CACHE_LIFETIME_MS`]) and long enough
//! ([`MIN_CACHED`]); written to it (Anthropic, when the client marks breakpoints), the
//! rest. Each request's saving is counted once, for that request.

use crate::outcome::Verdict;
use crate::prices::{Price, Tokens};

/// How long a provider keeps a prompt prefix cached without use: Anthropic's default
/// lifetime, OpenAI's shortest.
pub const CACHE_LIFETIME_MS: u64 = 5 * 60 * 1000;

/// The shortest prompt the providers cache (OpenAI; Anthropic's Sonnet and Opus).
pub const MIN_CACHED: u64 = 1024;

macro_rules! tally {
    ($($(#[$doc:meta])* $field:ident),* $(,)?) => {
        /// Counts of one or more exchanges; every field adds up.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
        pub struct Tally {
            $($(#[$doc])* pub $field: u64,)*
        }

        impl Tally {
            /// Each field with its name, as the store and the admin API name them.
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($field), self.$field)),*]
            }

            /// Sets the field `name` (an unknown name is ignored: a newer replica's).
            pub fn set(&mut self, name: &str, value: u64) {
                match name {
                    $(stringify!($field) => self.$field = value,)*
                    _ => {}
                }
            }

            pub fn add(&mut self, other: &Tally) {
                $(self.$field = self.$field.saturating_add(other.$field);)*
            }
        }
    };
}

tally! {
    /// Forwarded requests whose usage the provider reported.
    requests,
    /// Prompt tokens of those requests as the client sent them, as the provider counts.
    client_tokens,
    /// Prompt tokens the provider reported for them.
    forwarded_tokens,
    /// Of which its prompt cache served, and wrote.
    cached_tokens,
    cache_write_tokens,
    /// Output tokens it reported for them.
    output_tokens,
    /// Summary calls, and their input and output tokens as reported.
    summary_calls,
    summary_input_tokens,
    summary_output_tokens,
    /// `abridge_recall` calls answered, and the follow-up requests' tokens as reported.
    recalls,
    recall_input_tokens,
    recall_output_tokens,
    /// Millionths of a dollar: the requests sent as the client sent them, with the cache
    /// they would have hit; as forwarded; the summaries; the recall follow-ups.
    direct_micros,
    forwarded_micros,
    summary_micros,
    recall_micros,
    /// Exchanges of a model without a price: in the tokens, not in the money.
    unpriced,
}

impl Tally {
    /// Prompt tokens compaction kept from the provider.
    pub fn tokens_saved(&self) -> u64 {
        self.client_tokens.saturating_sub(self.forwarded_tokens)
    }

    /// Millionths of a dollar saved, net of what abridge spent (negative: it cost more).
    pub fn net_micros(&self) -> i64 {
        let spent = self.forwarded_micros + self.summary_micros + self.recall_micros;
        i64::try_from(self.direct_micros).unwrap_or(i64::MAX)
            - i64::try_from(spent).unwrap_or(i64::MAX)
    }
}

/// abridge's estimates of a compacted request's prompt, in the provider's units as its
/// reports taught them: as the client sent it, and as forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Estimates {
    pub client: u64,
    pub forwarded: u64,
}

impl Estimates {
    /// The client's request as the provider counts: what it counted for the forwarded
    /// one (`reported`) plus the difference of the estimates (which are in the
    /// provider's units already, as the history's reports taught).
    pub fn calibrated(self, reported: u64) -> u64 {
        reported.saturating_add(self.client.saturating_sub(self.forwarded))
    }

    /// `tokens` of the forwarded request's kind, as the provider counted this very
    /// request (`reported`) against abridge's estimate of it.
    fn recount(self, tokens: u64, reported: u64) -> u64 {
        if self.forwarded == 0 {
            return tokens;
        }
        (tokens as f64 * reported as f64 / self.forwarded as f64).round() as u64
    }
}

/// What abridge knows of a compacted request as the client sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compacted {
    /// abridge's estimates of it as sent and as forwarded (the fallback when no
    /// previous request of its history is known).
    pub estimates: Estimates,
    /// The client's previous request of this history.
    pub previous: Option<Previous>,
    /// The provider caches at the client's breakpoints (Anthropic), and the client marks
    /// them: what the cache did not serve up to them is written.
    pub writes_at_breakpoints: bool,
}

/// The client's previous request of a history, as the provider counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Previous {
    /// What it held (the provider's count, or the tally that estimated it).
    pub tokens: u64,
    /// What the client appended since (abridge's estimate, scaled by the ratio the
    /// provider's reports taught for appended messages).
    pub appended: u64,
    /// What the provider counted for it as forwarded, when the same checkpoint (or none)
    /// applied to it and to this request: the forwarded requests then differ by exactly
    /// what the client appended, so the provider's own counts say how much that was.
    pub forwarded: Option<u64>,
    /// Recent enough to be in the provider's cache ([`CACHE_LIFETIME_MS`]).
    pub cached: bool,
}

impl Compacted {
    /// The client's request as the provider would have billed it, sent as sent: its
    /// previous request's count plus what was appended since — the growth of the
    /// forwarded requests where the same checkpoint applied to both (the provider's own
    /// count, so no estimate's error adds up request after request), else the estimate
    /// — (the estimates' when no previous request is known), never less than what was
    /// forwarded.
    fn direct(self, reported: Tokens) -> Tokens {
        let input = match self.previous {
            Some(p) => {
                let appended = p.forwarded.map_or_else(
                    || self.estimates.recount(p.appended, reported.input),
                    |f| reported.input.saturating_sub(f),
                );
                p.tokens.saturating_add(appended).max(reported.input)
            }
            None => self.estimates.calibrated(reported.input),
        };
        let cached = self
            .previous
            .filter(|p| p.cached && p.tokens >= MIN_CACHED)
            .map_or(0, |p| p.tokens.min(input));
        Tokens {
            input,
            cached,
            cache_write: if self.writes_at_breakpoints {
                input - cached
            } else {
                0
            },
            output: reported.output,
        }
    }
}

/// The tally of one forwarded request the provider reported `reported` for;
/// `compacted` when abridge changed it.
pub fn request(reported: Tokens, compacted: Option<Compacted>, price: Option<Price>) -> Tally {
    let direct = compacted.map_or(reported, |c| c.direct(reported));
    let mut tally = Tally {
        requests: 1,
        client_tokens: direct.input,
        forwarded_tokens: reported.input,
        cached_tokens: reported.cached,
        cache_write_tokens: reported.cache_write,
        output_tokens: reported.output,
        ..Tally::default()
    };
    match price {
        Some(price) => {
            tally.direct_micros = micros(price, direct);
            tally.forwarded_micros = micros(price, reported);
        }
        None => tally.unpriced = 1,
    }
    tally
}

/// The tally of one summary call its provider reported `spent` for.
pub fn summary(spent: Tokens, price: Option<Price>) -> Tally {
    Tally {
        summary_calls: 1,
        summary_input_tokens: spent.input,
        summary_output_tokens: spent.output,
        summary_micros: price.map_or(0, |p| micros(p, spent)),
        unpriced: u64::from(price.is_none()),
        ..Tally::default()
    }
}

/// The tally of recall: `calls` answered, and follow-up requests the provider reported
/// `spent` for in all.
pub fn recall(calls: u64, spent: Tokens, price: Option<Price>) -> Tally {
    Tally {
        recalls: calls,
        recall_input_tokens: spent.input,
        recall_output_tokens: spent.output,
        recall_micros: price.map_or(0, |p| micros(p, spent)),
        unpriced: u64::from(price.is_none() && spent.input > 0),
        ..Tally::default()
    }
}

/// A provider's report as billed tokens.
pub fn reported(usage: &crate::relay::Usage) -> Tokens {
    Tokens {
        input: usage.prompt_tokens,
        cached: usage.cached_tokens.unwrap_or(0),
        cache_write: usage.cache_write_tokens.unwrap_or(0),
        output: usage.completion_tokens.unwrap_or(0),
    }
}

fn micros(price: Price, tokens: Tokens) -> u64 {
    price.micros(tokens).round() as u64
}

/// One request of a conversation, for its plot: when, the prompt as the client sent it
/// and as forwarded (the provider's count), and the checkpoint in force (a change marks
/// a compaction taking effect).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Point {
    pub at_ms: u64,
    pub client: u64,
    pub forwarded: u64,
    pub applied: Option<u32>,
}

impl Point {
    /// As stored: numbers separated by `:` (`-1`: no checkpoint).
    pub fn encode(&self) -> String {
        let applied = self.applied.map_or(-1, i64::from);
        format!(
            "{}:{}:{}:{applied}",
            self.at_ms, self.client, self.forwarded
        )
    }

    pub fn decode(text: &str) -> Option<Self> {
        let mut parts = text.split(':');
        let mut next = || parts.next()?.parse::<i64>().ok();
        let (at_ms, client, forwarded, applied) = (next()?, next()?, next()?, next()?);
        Some(Self {
            at_ms: u64::try_from(at_ms).ok()?,
            client: u64::try_from(client).ok()?,
            forwarded: u64::try_from(forwarded).ok()?,
            applied: u32::try_from(applied).ok(),
        })
    }
}

/// The most points a conversation keeps (its latest requests).
pub const MAX_POINTS: usize = 200;

/// What a conversation's requests saved and cost, its format, and its latest requests.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Account {
    pub tally: Tally,
    /// `chat`, `responses` or `messages`, once a request was tallied.
    pub format: Option<String>,
    /// Oldest first, at most [`MAX_POINTS`].
    pub series: Vec<Point>,
    /// What was decided for its latest request (`None`: not recorded, a conversation
    /// recorded before it was kept).
    pub verdict: Option<Verdict>,
}

impl Account {
    /// Adds one exchange; whether its series grew (it keeps the latest [`MAX_POINTS`]).
    pub fn add(&mut self, entry: &Entry) -> bool {
        self.tally.add(&entry.tally);
        if entry.verdict.is_some() {
            self.verdict = entry.verdict;
        }
        if let Some(format) = entry.format
            && self.format.as_deref() != Some(format)
        {
            self.format = Some(format.to_owned());
        }
        let Some(point) = entry.point else {
            return false;
        };
        self.series.push(point);
        if self.series.len() > MAX_POINTS {
            self.series.remove(0);
            return false;
        }
        true
    }
}

/// What one exchange adds to its conversation's account.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Entry {
    pub tally: Tally,
    pub format: Option<&'static str>,
    pub point: Option<Point>,
    /// What was decided for the request (see [`Account::verdict`]).
    pub verdict: Option<Verdict>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const SONNET: Price = Price {
        input: 3.0,
        cached_input: Some(0.3),
        cache_write: Some(3.75),
        output: 15.0,
    };

    #[test]
    fn a_request_abridge_did_not_change_costs_the_same_either_way() {
        let reported = Tokens {
            input: 10_000,
            cached: 8_000,
            cache_write: 1_500,
            output: 200,
        };
        let t = request(reported, None, Some(SONNET));
        assert_eq!((t.client_tokens, t.forwarded_tokens), (10_000, 10_000));
        assert_eq!(t.direct_micros, t.forwarded_micros);
        // 500 × 3 + 8,000 × 0.3 + 1,500 × 3.75 + 200 × 15
        assert_eq!(t.forwarded_micros, 1_500 + 2_400 + 5_625 + 3_000);
        assert_eq!((t.tokens_saved(), t.net_micros()), (0, 0));
    }

    #[test]
    fn a_compacted_request_is_priced_as_sent_with_the_cache_its_previous_request_left() {
        // The client's previous request held 49,400 tokens as the provider counted, and
        // it appended 2,600 since; 13,000 were forwarded (as abridge estimated).
        let compacted = Compacted {
            estimates: Estimates {
                client: 40_000,
                forwarded: 13_000,
            },
            previous: Some(Previous {
                tokens: 49_400,
                appended: 2_600,
                forwarded: None,
                cached: true,
            }),
            writes_at_breakpoints: true,
        };
        let reported = Tokens {
            input: 13_000,
            cached: 12_000,
            cache_write: 900,
            output: 300,
        };
        let t = request(reported, Some(compacted), Some(SONNET));
        assert_eq!(t.client_tokens, 52_000);
        assert_eq!(t.tokens_saved(), 39_000);
        // Direct: 49,400 read from the cache, 2,600 written.
        let direct = 49_400.0 * 0.3 + 2_600.0 * 3.75 + 300.0 * 15.0;
        assert_eq!(t.direct_micros, direct as u64);
        let forwarded = 100.0 * 3.0 + 12_000.0 * 0.3 + 900.0 * 3.75 + 300.0 * 15.0;
        assert_eq!(t.forwarded_micros, forwarded as u64);
        assert_eq!(t.net_micros(), (direct - forwarded) as i64);

        // Its previous request long gone from the cache: all of it is written again.
        let cold = Compacted {
            previous: compacted.previous.map(|p| Previous { cached: false, ..p }),
            ..compacted
        };
        let t = request(reported, Some(cold), Some(SONNET));
        assert_eq!(t.direct_micros, (52_000.0 * 3.75 + 300.0 * 15.0) as u64);
        // OpenAI's automatic cache writes nothing billed.
        let openai = Compacted {
            writes_at_breakpoints: false,
            ..cold
        };
        let t = request(reported, Some(openai), Some(SONNET));
        assert_eq!(t.direct_micros, (52_000.0 * 3.0 + 300.0 * 15.0) as u64);
        // No previous request known: the 13,000 forwarded plus the 27,000 more that
        // abridge's estimates say the client sent.
        let unknown = Compacted {
            previous: None,
            ..openai
        };
        let t = request(reported, Some(unknown), Some(SONNET));
        assert_eq!(t.client_tokens, 40_000);
    }

    #[test]
    fn under_one_checkpoint_what_was_appended_is_the_providers_own_count() {
        // The previous request, forwarded under the same checkpoint, was counted 12,400:
        // this one's 13,000 forwarded grew by exactly what the client appended (600),
        // whatever abridge estimated (2,600).
        let compacted = Compacted {
            estimates: Estimates {
                client: 40_000,
                forwarded: 10_000,
            },
            previous: Some(Previous {
                tokens: 49_400,
                appended: 2_600,
                forwarded: Some(12_400),
                cached: false,
            }),
            writes_at_breakpoints: false,
        };
        let reported = Tokens {
            input: 13_000,
            ..Tokens::default()
        };
        assert_eq!(
            request(reported, Some(compacted), None).client_tokens,
            50_000
        );
        // Where the checkpoint changed, the estimate of what was appended is scaled as
        // the provider counted this very request against abridge's estimate of it:
        // 13,000 for 10,000 estimated, so 2,600 appended count 3,380.
        let changed = Compacted {
            previous: compacted.previous.map(|p| Previous {
                forwarded: None,
                ..p
            }),
            ..compacted
        };
        assert_eq!(request(reported, Some(changed), None).client_tokens, 52_780);
    }

    #[test]
    fn a_short_previous_request_is_not_cached_and_no_price_is_said() {
        let compacted = Compacted {
            estimates: Estimates {
                client: 3_000,
                forwarded: 1_000,
            },
            previous: Some(Previous {
                tokens: 500,
                appended: 2_500,
                forwarded: None,
                cached: true,
            }),
            writes_at_breakpoints: false,
        };
        let reported = Tokens {
            input: 1_000,
            ..Tokens::default()
        };
        let t = request(reported, Some(compacted), Some(SONNET));
        assert_eq!(t.direct_micros, 3_000 * 3);
        let t = request(reported, Some(compacted), None);
        assert_eq!(
            (t.unpriced, t.direct_micros, t.tokens_saved()),
            (1, 0, 2_000)
        );
    }

    #[test]
    fn summaries_and_recalls_are_spent_from_the_saving() {
        let mut total = request(
            Tokens {
                input: 1_000,
                ..Tokens::default()
            },
            Some(Compacted {
                estimates: Estimates {
                    client: 5_000,
                    forwarded: 1_000,
                },
                previous: None,
                writes_at_breakpoints: false,
            }),
            Some(SONNET),
        );
        let spent = Tokens {
            input: 2_000,
            output: 100,
            ..Tokens::default()
        };
        total.add(&summary(spent, Some(SONNET)));
        total.add(&recall(2, spent, Some(SONNET)));
        assert_eq!((total.summary_calls, total.recalls), (1, 2));
        let each = 2_000 * 3 + 100 * 15;
        assert_eq!(total.net_micros(), 5_000 * 3 - 1_000 * 3 - 2 * each);
        let mut read = Tally::default();
        for (name, value) in total.fields() {
            read.set(name, value);
        }
        assert_eq!(read, total);
    }

    #[test]
    fn a_point_reads_back_as_written() {
        for applied in [None, Some(7)] {
            let p = Point {
                at_ms: 1_700_000_000_000,
                client: 52_000,
                forwarded: 13_000,
                applied,
            };
            assert_eq!(Point::decode(&p.encode()), Some(p));
        }
        assert_eq!(Point::decode("1:2"), None);
    }

    #[test]
    fn a_compacted_requests_tokens_are_counted_as_the_provider_counted_the_forwarded_one() {
        let e = Estimates {
            client: 3000,
            forwarded: 1000,
        };
        // The provider counted 1,300 for what was forwarded: the request as sent holds
        // the 2,000 more abridge's estimates (in the provider's units) say.
        assert_eq!(e.calibrated(1300), 3300);
        // Never less than what the provider was sent.
        let odd = Estimates {
            client: 500,
            forwarded: 1000,
        };
        assert_eq!(odd.calibrated(1300), 1300);
    }
}
