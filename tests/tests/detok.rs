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
