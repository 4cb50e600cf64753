//! Reasoning output split from the answer (`dsc serve --reasoning-parser deepseek_r1`), as
//! vLLM's `deepseek_r1` reasoning parser splits DeepSeek-R1's output: the text up to `</think>`
//! is `reasoning_content`, the text after it `content`; a leading `<think>` (R1 writes it, or
//! its chat template already opened it) is dropped; a completion that never closes the
//! thought is all reasoning. Streaming: [`ReasoningSplit`] holds back only what may still turn
//! into a marker, so the deltas concatenate to exactly what [`split`] gives for the whole text.

const START: &str = "<think>";
const END: &str = "</think>";

/// The parsers `--reasoning-parser` takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningParser {
    DeepseekR1,
}

impl ReasoningParser {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "deepseek_r1" => Some(ReasoningParser::DeepseekR1),
            _ => None,
        }
    }
}

/// A whole completion as (reasoning, content): None where a part is absent.
pub fn split(text: &str) -> (Option<String>, Option<String>) {
    let body = text.strip_prefix(START).unwrap_or(text);
    match body.find(END) {
        Some(i) => (Some(body[..i].to_string()), Some(body[i + END.len()..].to_string()).filter(|c| !c.is_empty())),
        None => (Some(body.to_string()), None),
    }
}

/// The incremental form of [`split`] for a stream of text deltas.
#[derive(Debug, Default)]
pub struct ReasoningSplit {
    /// text not yet emitted: it may still be (the start of) a marker
    held: String,
    /// past the leading `<think>` (or sure there is none)
    started: bool,
    /// past `</think>`: everything is content
    answering: bool,
}

impl ReasoningSplit {
    /// The (reasoning, content) a delta adds; either may be empty.
    pub fn feed(&mut self, delta: &str) -> (String, String) {
        if self.answering {
            return (String::new(), delta.to_string());
        }
        self.held.push_str(delta);
        if !self.started {
            if let Some(rest) = self.held.strip_prefix(START) {
                self.held = rest.to_string();
            } else if START.starts_with(self.held.as_str()) {
                return Default::default();
            }
            self.started = true;
        }
        if let Some(i) = self.held.find(END) {
            let reasoning = self.held[..i].to_string();
            let content = self.held[i + END.len()..].to_string();
            self.held.clear();
            self.answering = true;
            return (reasoning, content);
        }
        // keep the longest suffix that could begin `</think>`
        let keep = crate::stop::partial_suffix(&self.held, END);
        let out = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        (out, String::new())
    }

    /// What is still held at the end of the stream (reasoning: no marker came after all).
    pub fn finish(&mut self) -> (String, String) {
        let held = std::mem::take(&mut self.held);
        if self.answering {
            (String::new(), held)
        } else {
            (held, String::new())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streamed(parts: &[&str]) -> (String, String) {
        let mut s = ReasoningSplit::default();
        let (mut r, mut c) = (String::new(), String::new());
        for p in parts {
            let (a, b) = s.feed(p);
            r.push_str(&a);
            c.push_str(&b);
        }
        let (a, b) = s.finish();
        (r + &a, c + &b)
    }

    #[test]
    fn the_stream_splits_as_the_whole_text_does_at_every_cut() {
        let texts = [
            "<think>\nLet me see: 2 + 2.</think>\n\nIt is 4.",
            "First, <think> is only a word here</think>answer",
            "thinking without an end",
            "<thi",
            "no think at all</think>",
            "a </thi nk> b </think> ü </think> c",
            "<think></think>",
        ];
        for t in texts {
            let (r, c) = split(t);
            let want = (r.unwrap_or_default(), c.unwrap_or_default());
            // every way of cutting the text in two or three pieces (at char boundaries)
            let cuts: Vec<usize> = (0..=t.len()).filter(|&i| t.is_char_boundary(i)).collect();
            for &i in &cuts {
                assert_eq!(streamed(&[&t[..i], &t[i..]]), want, "{t:?} cut at {i}");
                for &j in cuts.iter().filter(|&&j| j >= i) {
                    assert_eq!(streamed(&[&t[..i], &t[i..j], &t[j..]]), want, "{t:?} cut at {i}, {j}");
                }
            }
        }
        assert_eq!(split("<think>\nx</think>\n\ny"), (Some("\nx".into()), Some("\n\ny".into())));
        assert_eq!(split("still thinking"), (Some("still thinking".into()), None));
        // a delta that could begin the marker waits; one that cannot goes out at once
        let mut s = ReasoningSplit::default();
        assert_eq!(s.feed("<think>abc</th"), ("abc".into(), String::new()));
        assert_eq!(s.feed("ink>def"), (String::new(), "def".into()));
        assert_eq!(s.feed("</think>"), (String::new(), "</think>".into()), "after the answer began, all is content");
    }
}
