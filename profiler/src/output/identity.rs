//! Who the processes of a profile say they are (their rank in a distributed job), in a few
//! words for a flame graph's subtitle: a graph of one rank says which, a graph of a whole job
//! which ranks it holds.

use std::collections::{BTreeMap, BTreeSet};

/// `rank 2 · local_rank 2 · world_size 4` when the processes share their labels; else each
/// label's values, numbers as runs (`ranks 0–3 · local_ranks 0–1 · world_size 4`); none when no
/// process has labels.
pub fn describe(process_labels: &BTreeMap<u32, Vec<(String, String)>>) -> Option<String> {
    let mut names: Vec<&str> = Vec::new();
    let mut values: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (name, value) in process_labels.values().flatten() {
        if !names.contains(&name.as_str()) {
            names.push(name);
        }
        values.entry(name).or_default().insert(value);
    }
    let parts: Vec<String> = names
        .iter()
        .map(|name| match &values[name] {
            one if one.len() == 1 => format!("{name} {}", one.iter().next().copied().unwrap_or_default()),
            many => format!("{name}s {}", runs(many)),
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join(" · "))
}

/// Numbers as runs, `0–3, 5, 7–8`; anything else after them, as it is.
fn runs(values: &BTreeSet<&str>) -> String {
    let mut numbers: Vec<u64> = values.iter().filter_map(|v| v.parse().ok()).collect();
    numbers.sort_unstable();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < numbers.len() {
        let start = numbers[i];
        while i + 1 < numbers.len() && numbers[i + 1] == numbers[i] + 1 {
            i += 1;
        }
        out.push(if numbers[i] == start { start.to_string() } else { format!("{start}–{}", numbers[i]) });
        i += 1;
    }
    out.extend(values.iter().filter(|v| v.parse::<u64>().is_err()).map(|v| v.to_string()));
    out.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranks(of: &[(u32, &[(&str, &str)])]) -> BTreeMap<u32, Vec<(String, String)>> {
        of.iter().map(|(pid, l)| (*pid, l.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())).collect()
    }

    #[test]
    fn one_rank_says_which_several_say_their_runs() {
        assert_eq!(describe(&BTreeMap::new()), None);
        let one = ranks(&[(7, &[("rank", "2"), ("local_rank", "2"), ("world_size", "4")])]);
        assert_eq!(describe(&one).as_deref(), Some("rank 2 · local_rank 2 · world_size 4"));
        let job = ranks(&[
            (10, &[("rank", "0"), ("local_rank", "0"), ("world_size", "4")]),
            (11, &[("rank", "1"), ("local_rank", "1"), ("world_size", "4")]),
            (12, &[("rank", "3"), ("local_rank", "1"), ("world_size", "4")]),
            (13, &[("rank", "2"), ("local_rank", "0"), ("world_size", "4")]),
            // The launcher, which has no rank.
            (9, &[]),
        ]);
        assert_eq!(describe(&job).as_deref(), Some("ranks 0–3 · local_ranks 0–1 · world_size 4"));
        let gaps = ranks(&[(1, &[("rank", "10")]), (2, &[("rank", "2")]), (3, &[("rank", "3")]), (4, &[("rank", "5")]), (5, &[("rank", "x")])]);
        assert_eq!(describe(&gaps).as_deref(), Some("ranks 2–3, 5, 10, x"));
    }
}
