//! Okapi BM25 over the condensed passages: which ones a recall query is about. Terms are
//! runs of letters and digits, lower-cased (so `PROJ-1234` is `proj` and `1234`, as in a
//! query that names it); one pass over the passages' text, linear in their size. A
//! passage that holds the whole query (a path, an id, a command) ranks above every
//! passage that holds only its terms, and one that holds it as written, case and all
//! (`Not Found`, not `not found`), above one that holds it in another case.

use std::collections::HashMap;

/// BM25's term-frequency saturation and length normalisation, the usual values.
const K1: f64 = 1.2;
const B: f64 = 0.75;
/// What holding the whole query adds: more than any passage's BM25 score can be; twice
/// that for holding it as written.
const EXACT: f64 = 1.0e6;
/// The shortest query held whole that counts (`$0`, `5%`): two characters.
const SHORTEST_PHRASE: usize = 2;

/// The terms of `text`.
pub fn terms(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|t| !t.is_empty())
        .map(str::to_lowercase)
}

/// The passages' indices by score for `query`, best first; passages that share no term
/// with it are left out. Ties keep the later passage first (the more recent message).
pub fn rank(passages: &[&str], query: &str) -> Vec<usize> {
    let mut wanted: Vec<String> = terms(query).collect();
    wanted.sort_unstable();
    wanted.dedup();
    if wanted.is_empty() || passages.is_empty() {
        return Vec::new();
    }
    // Per passage: its length in terms and the counts of the wanted terms.
    let mut lengths = Vec::with_capacity(passages.len());
    let mut counts: Vec<HashMap<usize, u32>> = Vec::with_capacity(passages.len());
    let mut containing = vec![0u32; wanted.len()];
    for passage in passages {
        let mut length = 0u32;
        let mut found: HashMap<usize, u32> = HashMap::new();
        for term in terms(passage) {
            length += 1;
            if let Ok(i) = wanted.binary_search(&term) {
                *found.entry(i).or_default() += 1;
            }
        }
        for &i in found.keys() {
            containing[i] += 1;
        }
        lengths.push(f64::from(length));
        counts.push(found);
    }
    let n = passages.len() as f64;
    let average = (lengths.iter().sum::<f64>() / n).max(1.0);
    let idf: Vec<f64> = containing.iter().map(|&c| idf(n, f64::from(c))).collect();
    let phrase = Phrase::of(query);
    let exact = |p: usize| phrase.bonus(passages[p], &passages[p].to_lowercase());
    let scored = counts
        .iter()
        .enumerate()
        .filter(|(_, found)| !found.is_empty())
        .map(|(p, found)| {
            let score = found
                .iter()
                .map(|(&i, &tf)| bm25(idf[i], tf, lengths[p] / average))
                .sum::<f64>();
            (p, score + exact(p))
        })
        .collect();
    best_first(scored)
}

/// A query as a whole, for the bonus a passage that holds it gets.
struct Phrase<'q> {
    cased: &'q str,
    lower: String,
}

impl<'q> Phrase<'q> {
    fn of(query: &'q str) -> Self {
        let cased = query.trim();
        Self {
            cased,
            lower: cased.to_lowercase(),
        }
    }

    /// What a passage (`text`, and it lower-cased) gets for holding the query whole:
    /// `2 × EXACT` as written, `EXACT` in another case, nothing otherwise.
    fn bonus(&self, text: &str, lower: &str) -> f64 {
        if self.cased.chars().count() < SHORTEST_PHRASE || !lower.contains(&self.lower) {
            0.0
        } else if text.contains(self.cased) {
            2.0 * EXACT
        } else {
            EXACT
        }
    }
}

/// A term's inverse document frequency among `n` passages, `containing` of which hold it.
fn idf(n: f64, containing: f64) -> f64 {
    ((n - containing + 0.5) / (containing + 0.5) + 1.0).ln()
}

/// A term's share of a passage's score: held `tf` times, the passage `relative` times as
/// long as the average.
fn bm25(idf: f64, tf: u32, relative: f64) -> f64 {
    let tf = f64::from(tf);
    idf * tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * relative))
}

/// Passages by score, best first; ties keep the later passage first.
fn best_first(mut scored: Vec<(usize, f64)>) -> Vec<usize> {
    scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(b.0.cmp(&a.0)));
    scored.into_iter().map(|(p, _)| p).collect()
}

/// The passages indexed once for many queries (`abridge replay` asks one per
/// identifier): each passage's text (borrowed) and lower-cased and its length in terms,
/// and for each term the passages that hold it and how often. A query then costs the
/// postings of its terms, not a pass over the passages; it ranks as [`rank`] does.
pub struct Index<'t> {
    texts: Vec<&'t str>,
    lower: Vec<String>,
    lengths: Vec<f64>,
    average: f64,
    postings: HashMap<String, Vec<(usize, u32)>>,
}

impl<'t> Index<'t> {
    pub fn new(passages: &[&'t str]) -> Self {
        let mut postings: HashMap<String, Vec<(usize, u32)>> = HashMap::new();
        let mut lengths = Vec::with_capacity(passages.len());
        for (p, passage) in passages.iter().enumerate() {
            let mut length = 0u32;
            for term in terms(passage) {
                length += 1;
                let list = postings.entry(term).or_default();
                match list.last_mut() {
                    Some((q, tf)) if *q == p => *tf += 1,
                    _ => list.push((p, 1)),
                }
            }
            lengths.push(f64::from(length));
        }
        let n = passages.len().max(1) as f64;
        Self {
            texts: passages.to_vec(),
            lower: passages.iter().map(|p| p.to_lowercase()).collect(),
            average: (lengths.iter().sum::<f64>() / n).max(1.0),
            lengths,
            postings,
        }
    }

    pub fn rank(&self, query: &str) -> Vec<usize> {
        let mut wanted: Vec<String> = terms(query).collect();
        wanted.sort_unstable();
        wanted.dedup();
        let n = self.lengths.len() as f64;
        let mut scores: HashMap<usize, f64> = HashMap::new();
        for term in &wanted {
            let Some(list) = self.postings.get(term) else {
                continue;
            };
            let idf = idf(n, list.len() as f64);
            for &(p, tf) in list {
                *scores.entry(p).or_default() += bm25(idf, tf, self.lengths[p] / self.average);
            }
        }
        let phrase = Phrase::of(query);
        let scored = scores
            .into_iter()
            .map(|(p, score)| (p, score + phrase.bonus(self.texts[p], &self.lower[p])))
            .collect();
        best_first(scored)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_ranks_as_one_query_does() {
        let passages = [
            "deploy the billing service to port 6543 on host db-7",
            "the build is green; PROJ-1234 is closed",
            "run cargo test in /srv/app, then deploy",
            "port 6543 again: the billing service listens there",
        ];
        let index = Index::new(&passages);
        for query in [
            "port 6543",
            "PROJ-1234",
            "deploy",
            "/srv/app",
            "nothing here",
            "billing service",
            "Billing Service",
            "$0",
        ] {
            assert_eq!(index.rank(query), rank(&passages, query), "{query}");
        }
    }

    #[test]
    fn the_passage_that_names_the_rare_terms_ranks_first() {
        let passages = [
            "We talked about the weather and the harbour.",
            "The staging database listens on port 6543; ticket PROJ-1234 tracks the migration.",
            "The harbour has an old lighthouse; the harbour master keeps it.",
            "Nothing relevant here at all.",
        ];
        assert_eq!(rank(&passages, "which port does staging use?")[0], 1);
        assert_eq!(rank(&passages, "PROJ-1234")[0], 1);
        let harbour = rank(&passages, "harbour lighthouse");
        assert_eq!(harbour[0], 2, "more of the terms, and more often");
        assert!(!harbour.contains(&3), "no shared term, not ranked");
        assert!(rank(&passages, "?!").is_empty());
        // The whole query as written ranks first, however common its terms.
        let paths = [
            "src/module/parser.rs src/module/parser.rs src/module/parser.rs module parser",
            "the fix is in src/module_7/parser.rs",
        ];
        assert_eq!(rank(&paths, "src/module_7/parser.rs")[0], 1);
    }

    #[test]
    fn the_query_as_written_ranks_above_it_in_another_case() {
        let passages = [
            "The page said Not Found.",
            "not found: not found, not found again, the file was not found",
            "run it as `$0 --help`; the script prints usage",
            "status 0: zero files, 0 errors, 0 warnings",
        ];
        let ranked = rank(&passages, "Not Found");
        assert_eq!(
            ranked[..2],
            [0, 1],
            "as written first, then in another case"
        );
        assert_eq!(rank(&passages, "not found")[0], 1);
        // Two characters held whole count: `$0` is not the `0` of a status line.
        assert_eq!(rank(&passages, "$0")[0], 2);
        assert_eq!(rank(&passages, "0")[0], 3, "one character is only a term");
    }
}
