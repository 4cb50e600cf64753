//! Incremental detokenization (the serving engine's text stream) against full decodes, on the
//! SmolLM2 tokenizer: the streamed pieces must add up to exactly what decoding every token at
//! once gives, for real text (incl. multi-byte characters split over tokens) and random ids.

use dsc_runtime::plan::Plan;
use dsc_runtime::tokenizer::{Detokenizer, Tokenizer};
use rand::{Rng, SeedableRng};

fn tokenizer() -> Tokenizer {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("smollm2.plan");
    let c = dsc_compiler::compile(&dsc_tests::default_model()).expect("compile");
    dsc_compiler::write(&c, &p).expect("write plan");
    let plan = Plan::open(&p).expect("open plan");
    Tokenizer::new(plan.header.tokenizer.as_ref().expect("tokenizer in plan")).unwrap()
}

/// Stream `ids` one token at a time; every partial text must be a prefix of the final one.
fn stream(tk: &Tokenizer, ids: &[u32]) -> String {
    let mut d = Detokenizer::default();
    let mut text = String::new();
    for n in 1..=ids.len() {
        text.push_str(&d.step(tk, &ids[..n]));
    }
    text.push_str(&d.flush(tk, ids));
    text
}

#[test]
fn streamed_text_equals_the_full_decode() {
    let tk = tokenizer();
    let mut texts: Vec<String> = serde_json::from_str::<Vec<serde_json::Value>>(&std::fs::read_to_string(dsc_tests::reference_dir().join("prompts-public.json")).unwrap())
        .unwrap()
        .iter()
        .map(|p| p["text"].as_str().unwrap().to_string())
        .collect();
    texts.extend(
        [
            "naïve café — 東京タワー 🚀🔥 ünïcødé ∑∫√ 한국어 العربية",
            "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n\n  indented\ttabs  and   spaces ",
            " leading space, trailing space ",
            "Mr. Smith's dog isn't here . , ! ?",
            "<|im_start|>user\nhello<|im_end|>",
        ]
        .map(String::from),
    );
    for t in &texts {
        let ids = tk.encode(t).unwrap();
        let full = tk.decode(&ids, true).unwrap();
        let mut d = Detokenizer::default();
        let mut text = String::new();
        for n in 1..=ids.len() {
            text.push_str(&d.step(&tk, &ids[..n]));
            assert!(full.starts_with(&text), "{t:?}: streamed {text:?} is not a prefix of {full:?}");
        }
        text.push_str(&d.flush(&tk, &ids));
        assert_eq!(text, full, "{t:?}");
    }
}

#[test]
fn streamed_random_ids_equal_the_full_decode() {
    let tk = tokenizer();
    let vocab = tk.vocab_size() as u32;
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    for _ in 0..300 {
        let len = rng.random_range(1..40);
        let ids: Vec<u32> = (0..len).map(|_| rng.random_range(0..vocab)).collect();
        assert_eq!(stream(&tk, &ids), tk.decode(&ids, true).unwrap(), "{ids:?}");
    }
}

/// The engine's text path end to end: random token streams (runs of a real text's tokens, whose
/// multi-byte characters split over tokens, and random ids) through the detokenizer and the
/// stop-string scan (`dsc_runtime::stop::scan`), under random stop strings cut from the decoded
/// text itself (1 to 4 characters, some with a byte that never comes after them). Never a
/// panic, nothing sent is taken back, and the text sent equals the plain definition: after
/// each token, the first stop string found in the whole text so far ends it.
#[test]
fn random_token_streams_under_random_stop_strings() {
    let tk = tokenizer();
    let vocab = tk.vocab_size() as u32;
    let mut rng = rand::rngs::StdRng::seed_from_u64(30);
    let real = tk.encode("Le café est très bon — naïve 東京タワー 🚀🔥 ünïcødé, the café is open. French: « é es »").unwrap();
    for case in 0..400 {
        let ids: Vec<u32> = if case % 2 == 0 {
            let a = rng.random_range(0..real.len());
            real[a..].iter().copied().take(rng.random_range(1..40)).collect()
        } else {
            (0..rng.random_range(1..30)).map(|_| rng.random_range(0..vocab)).collect()
        };
        let full = tk.decode(&ids, true).unwrap();
        let chars: Vec<char> = full.chars().collect();
        let mut stops: Vec<String> = (0..rng.random_range(0..4))
            .map(|_| {
                if chars.is_empty() || rng.random_bool(0.2) {
                    "\u{1}".to_string()
                } else {
                    let a = rng.random_range(0..chars.len());
                    let n = rng.random_range(1..=(chars.len() - a).min(4));
                    chars[a..a + n].iter().collect::<String>() + if rng.random_bool(0.3) { "\u{1}" } else { "" }
                }
            })
            .collect();
        stops.retain(|s| !s.is_empty());
        // the engine's way: a growing text, each token's piece appended, then scan
        let mut d = Detokenizer::default();
        let (mut text, mut sent, mut got) = (String::new(), 0usize, None);
        let mut prefixes = vec![];
        for n in 1..=ids.len() {
            let last = n == ids.len();
            let old = text.len();
            text.push_str(&if last { d.flush(&tk, &ids[..n]) } else { d.step(&tk, &ids[..n]) });
            prefixes.push(text.clone());
            let sc = dsc_runtime::stop::scan(&text, old, &stops, last);
            assert!(text.is_char_boundary(sc.safe), "{ids:?} {stops:?}");
            if let Some(at) = sc.stop_at {
                assert!(at >= sent, "a stop inside text already sent: {ids:?} {stops:?}");
                got = Some(text[..at].to_string());
                break;
            }
            assert!(sc.safe >= sent, "sent text taken back: {ids:?} {stops:?}");
            sent = sc.safe;
        }
        let got = got.unwrap_or_else(|| text[..sent].to_string());
        let want = prefixes.iter().find_map(|t| stops.iter().filter_map(|s| t.find(s.as_str())).min().map(|i| t[..i].to_string())).unwrap_or_else(|| prefixes.last().cloned().unwrap_or_default());
        assert_eq!(got, want, "ids {ids:?}, stops {stops:?}");
    }
}
