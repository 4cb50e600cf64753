//! Stop strings over a streamed, growing text: where the text ends and how much of it may be
//! sent yet.
//!
//! The engine appends each token's text to a sequence's text and asks [`scan`] what to do. A
//! stop string ends the text where it first occurs (the stop string itself is not sent); until
//! then, any suffix of the text that could still grow into a stop string, and a trailing
//! U+FFFD (an incomplete character), is held back. Every offset this returns is a char boundary
//! of the text, whatever bytes the stop strings and the text hold (property-tested below
//! against the plain definition: the deltas concatenated equal the text cut at the first stop).

/// What the text allows after it grew from `old_len` bytes to `text.len()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scan {
    /// the first stop string's start, where the text ends (None: no stop string yet)
    pub stop_at: Option<usize>,
    /// the text may be sent up to here (a char boundary; `stop_at` when a stop string matched)
    pub safe: usize,
}

/// Bytes of the longest suffix of `text` that is a proper prefix of `marker` (0: none) — what
/// to hold back while `marker` may still be arriving. The cut `text.len() - k` is a char
/// boundary of `text` (its k bytes start at a char boundary of `marker`).
pub fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1)).rev().find(|&k| marker.is_char_boundary(k) && text.ends_with(&marker[..k])).unwrap_or(0)
}

/// Scan `text` (which was `old_len` bytes before the newest piece) for `stops`. A stop string
/// found before would have ended the text then, so only matches that end in the new piece are
/// looked for. `finished`: nothing more will be appended, so nothing is held back.
pub fn scan(text: &str, old_len: usize, stops: &[String], finished: bool) -> Scan {
    let mut stop_at: Option<usize> = None;
    for st in stops.iter().filter(|s| !s.is_empty()) {
        let mut from = old_len.min(text.len()).saturating_sub(st.len());
        while !text.is_char_boundary(from) {
            from -= 1;
        }
        if let Some(i) = text[from..].find(st.as_str()) {
            let i = from + i;
            stop_at = Some(stop_at.map_or(i, |j| j.min(i)));
        }
    }
    if let Some(i) = stop_at {
        return Scan { stop_at, safe: i };
    }
    let mut safe = text.len();
    if finished {
        return Scan { stop_at, safe };
    }
    // a trailing replacement character may still become a real one
    if text.ends_with('\u{FFFD}') {
        safe -= '\u{FFFD}'.len_utf8();
    }
    // any suffix of the whole text that begins a stop string (measured from the text's end:
    // each stop string's longest such prefix; the earliest cut wins)
    for st in stops {
        safe = safe.min(text.len() - partial_suffix(text, st));
    }
    debug_assert!(text.is_char_boundary(safe));
    Scan { stop_at, safe }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Feed `pieces` one by one as the engine does; returns what was sent and where it ended.
    fn stream(pieces: &[String], stops: &[String]) -> (String, bool) {
        let (mut text, mut sent) = (String::new(), 0usize);
        for (i, p) in pieces.iter().enumerate() {
            let old = text.len();
            text.push_str(p);
            let last = i + 1 == pieces.len();
            let sc = scan(&text, old, stops, last);
            assert!(text.is_char_boundary(sc.safe) && sc.safe <= text.len());
            // what is sent is never taken back
            if let Some(at) = sc.stop_at {
                assert!(at >= sent, "a stop at {at} inside text already sent ({sent})");
                return (text[..at].to_string(), true);
            }
            assert!(sc.safe >= sent, "safe {} behind the {sent} bytes sent", sc.safe);
            sent = sc.safe;
        }
        (text[..sent].to_string(), false)
    }

    /// The plain definition: after each piece, search the whole text so far for every stop
    /// string; the first time one is there, the text ends at the earliest match.
    fn reference(pieces: &[String], stops: &[String]) -> (String, bool) {
        let mut text = String::new();
        for p in pieces {
            text.push_str(p);
            if let Some(i) = stops.iter().filter(|s| !s.is_empty()).filter_map(|s| text.find(s.as_str())).min() {
                return (text[..i].to_string(), true);
            }
        }
        (text, false)
    }

    #[test]
    fn the_issue_request_holds_back_inside_multibyte_text() {
        // the request that killed the engine: the second stop string's prefix measured from the
        // text's end, not from the already shortened safe length, cut inside 'é'
        let stops = vec!["t\u{1}".to_string(), "é es\u{1}".to_string()];
        let pieces: Vec<String> = ["Le", " caf", "é", " es", "t", " tr", "ès", " bon", "\u{FFFD}", "."].iter().map(|s| s.to_string()).collect();
        assert_eq!(stream(&pieces, &stops), reference(&pieces, &stops));
        for n in 1..=pieces.len() {
            let text: String = pieces[..n].concat();
            let sc = scan(&text, 0, &stops, false);
            assert!(text.is_char_boundary(sc.safe));
        }
        // "… café es" ends with a prefix of the second stop string: held back from 'é' on
        let text = "Le café es";
        assert_eq!(scan(text, 0, &stops, false).safe, text.find('é').unwrap());
        // a trailing U+FFFD is held back; a stop string's prefix after it too
        assert_eq!(scan("ab\u{FFFD}", 0, &stops, false).safe, 2);
        assert_eq!(scan("ab\u{FFFD}t", 0, &stops, false).safe, 5);
        assert_eq!(scan("abé es", 0, &stops, false).safe, 2);
    }

    fn piece() -> impl Strategy<Value = String> {
        proptest::collection::vec(prop::sample::select(vec!["a", "b", "é", "\u{1}", " ", "t", "日", "\u{FFFD}", "🙂", "ab", "é e"]), 0..3).prop_map(|v| v.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]
        #[test]
        fn streamed_text_equals_the_text_cut_at_the_first_stop(pieces in proptest::collection::vec(piece(), 1..12), stops in proptest::collection::vec(piece(), 0..4)) {
            prop_assert_eq!(stream(&pieces, &stops), reference(&pieces, &stops));
        }
    }
}
