//! End to end on the fault server's own bytes (`testdata/`, captured from
//! `retrywise-fault-server` with curl: `fb-stream-cut:k=3` cut after three
//! deltas, its continuation by `fb-ok` through a prefill and by
//! `fb-ok:resend=1` through an instruction, which restates the prefix) for
//! the three stream shapes: the primary's stream through a gate to the
//! caller, the transcript of it, the continuation request, the fallback's
//! stream through its own gate and the splicer. Then the same for every cut
//! point and chunking, with streams from [`super::fake`].

use super::fake::{answer, frames, words, Ctx, Shape, SHAPES};
use super::{continuation_body, Splicer, Transcript, Usage};
use crate::stream::StreamGate;
use crate::types::{ApiFamily, Continuation};
use proptest::prelude::*;
use serde_json::Value;

const PRIMARY: &str = "fb-stream-cut:k=3";
const DELIVERED: &str = "answer from fb-stream-cut:k=3: w1 w2";
const FULL: &str = "answer from fb-stream-cut:k=3: w1 w2 w3 w4 w5 w6";

/// A captured answer: `cut`, `prefill`, `resend`, `no_done`, `error`.
fn captured(shape: Shape, kind: &str) -> &'static [u8] {
    macro_rules! pick {
        ($($s:ident $p:literal: $($k:literal)*;)*) => {
            match (shape, kind) {
                $($((Shape::$s, $k) => include_bytes!(concat!("testdata/", $p, "_", $k, ".sse")),)*)*
                _ => unreachable!("{kind}"),
            }
        };
    }
    pick! {
        Chat "chat": "cut" "prefill" "resend" "no_done" "error";
        Anthropic "msg": "cut" "prefill" "resend" "no_done" "error";
        Responses "resp": "cut" "prefill" "resend" "no_done" "error";
    }
}

/// The sequence number of each capture (the server numbers its requests).
fn seq(shape: Shape, kind: &str) -> u64 {
    let base = match shape {
        Shape::Chat => 1,
        Shape::Anthropic => 7,
        Shape::Responses => 13,
    };
    base + ["cut", "prefill", "resend", "malformed", "no_done", "error"]
        .iter()
        .position(|k| *k == kind)
        .unwrap() as u64
}

fn family(shape: Shape) -> ApiFamily {
    match shape {
        Shape::Anthropic => ApiFamily::Anthropic,
        _ => ApiFamily::OpenAi,
    }
}

/// The request each capture answered (the primary's).
fn request(shape: Shape) -> &'static str {
    match shape {
        Shape::Chat => {
            r#"{"model":"fb-stream-cut:k=3","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Say hi"}]}"#
        }
        Shape::Anthropic => {
            r#"{"model":"fb-stream-cut:k=3","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"Say hi"}]}"#
        }
        Shape::Responses => r#"{"model":"fb-stream-cut:k=3","stream":true,"input":"Say hi"}"#,
    }
}

fn ctx(shape: Shape, model: &str, seq: u64, usage: (u64, u64)) -> Ctx<'_> {
    Ctx {
        shape,
        model,
        seq,
        include_usage: shape == Shape::Chat,
        usage,
    }
}

#[test]
fn the_generator_matches_the_fault_server_byte_for_byte() {
    let all = answer(PRIMARY, 6);
    let quote = "The previous reply was cut off. «answer from fb-stream-cut:k=3: w1 w2»";
    for shape in SHAPES {
        let cut = frames(&ctx(shape, PRIMARY, seq(shape, "cut"), (2, 0)), &all[..3], false, false);
        assert_eq!(cut.concat().as_bytes(), captured(shape, "cut"), "{shape:?}");
        let rest = &all[3..];
        let c = ctx(
            shape,
            "fb-ok",
            seq(shape, "prefill"),
            (words(&["Say hi", DELIVERED]), 4),
        );
        assert_eq!(
            frames(&c, rest, true, true).concat().as_bytes(),
            captured(shape, "prefill")
        );
        let resent: Vec<String> = [DELIVERED.to_owned()].into_iter().chain(rest.iter().cloned()).collect();
        let c = ctx(
            shape,
            "fb-ok:resend=1",
            seq(shape, "resend"),
            (words(&["Say hi", quote]), 9),
        );
        assert_eq!(
            frames(&c, &resent, true, true).concat().as_bytes(),
            captured(shape, "resend")
        );
        let mut c = ctx(shape, "fb-no-done", seq(shape, "no_done"), (2, 9));
        c.include_usage = false;
        let no_done = frames(&c, &answer("fb-no-done", 6), true, false);
        assert_eq!(no_done.concat().as_bytes(), captured(shape, "no_done"), "{shape:?}");
    }
}

/// `body` through a fresh gate in pieces of `size` (and its end when
/// `ended`): what the caller receives.
fn gated(body: &[u8], size: usize, ended: bool) -> (StreamGate, Vec<u8>) {
    let mut g = StreamGate::new(Some("text/event-stream"));
    let mut out = Vec::new();
    for c in body.chunks(size.max(1)) {
        out.extend_from_slice(&g.feed(c));
    }
    if ended {
        out.extend(g.finish());
    }
    (g, out)
}

/// The fallback's `body` through its gate and the splicer, in pieces of
/// `size`; the caller's transcript follows what the caller receives.
fn spliced(shape: Shape, seen: &mut Transcript, body: &[u8], size: usize) -> Vec<u8> {
    let mut gate = StreamGate::new(Some("text/event-stream"));
    let mut splice = Splicer::new(family(shape), seen);
    let mut out = Vec::new();
    for c in body.chunks(size.max(1)) {
        let piece = splice.feed(&gate.feed(c));
        seen.observe(&piece);
        out.extend(piece);
    }
    let mut piece = splice.feed(&gate.finish());
    piece.extend(splice.finish());
    seen.observe(&piece);
    out.extend(piece);
    out
}

/// What the fault server reads as a continuation of `delivered` in a request
/// (its rule: a last assistant message that is exactly the prefix, or a last
/// user message quoting it).
fn continues(shape: Shape, body: &[u8], delivered: &str, how: Continuation) -> bool {
    let v: Value = serde_json::from_slice(body).unwrap();
    let turns = match shape {
        Shape::Responses => &v["input"],
        _ => &v["messages"],
    };
    let last = turns.as_array().and_then(|t| t.last()).cloned().unwrap_or(Value::Null);
    let text = last["content"].as_str().unwrap_or("");
    match how {
        Continuation::Prefill => last["role"] == "assistant" && text == delivered,
        Continuation::Instruction => last["role"] == "user" && text.contains(delivered),
    }
}

/// Checks what an SDK would check of the caller's whole stream (read here
/// without the crate's SSE reader: every event is `\n\n`-terminated) and
/// returns its text: one opening, one terminator at the end, indexes and ids
/// of one answer, Responses summaries holding the whole text.
fn read_as_sdk(shape: Shape, stream: &[u8]) -> String {
    let s = std::str::from_utf8(stream).unwrap();
    assert!(s.ends_with("\n\n"), "framing: {s}");
    let events: Vec<(Option<&str>, Value)> = s
        .trim_end_matches("\n\n")
        .split("\n\n")
        .map(|block| {
            let (mut name, mut data) = (None, None);
            for line in block.split('\n') {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n);
                } else if let Some(d) = line.strip_prefix("data: ") {
                    assert!(data.is_none(), "one data line: {block}");
                    data = Some(d);
                } else {
                    panic!("unexpected line {line:?}");
                }
            }
            let data = data.expect("data");
            let v = if data == "[DONE]" {
                Value::String("[DONE]".into())
            } else {
                serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}"))
            };
            (name, v)
        })
        .collect();
    let count = |f: &dyn Fn(&Value) -> bool| events.iter().filter(|(_, v)| f(v)).count();
    let last = &events.last().unwrap().1;
    let mut text = String::new();
    match shape {
        Shape::Chat => {
            assert_eq!(count(&|v| v["choices"][0]["delta"].get("role").is_some()), 1);
            assert_eq!(count(&|v| v == "[DONE]"), 1);
            assert_eq!(last, "[DONE]");
            for (_, v) in &events {
                text.push_str(v["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
            }
        }
        Shape::Anthropic => {
            for (name, v) in &events {
                assert_eq!(name.unwrap(), v["type"].as_str().unwrap());
                if let Some(i) = v.get("index") {
                    assert_eq!(i, 0, "one content block: {v}");
                }
                text.push_str(v["delta"]["text"].as_str().unwrap_or(""));
            }
            for t in [
                "message_start",
                "content_block_start",
                "content_block_stop",
                "message_stop",
            ] {
                assert_eq!(count(&|v| v["type"] == t), 1, "{t}");
            }
            assert_eq!(last["type"], "message_stop");
        }
        Shape::Responses => {
            let first = &events[0].1;
            let (rid, item) = (&first["response"]["id"], &events[1].1["item"]["id"]);
            for (i, (name, v)) in events.iter().enumerate() {
                assert_eq!(name.unwrap(), v["type"].as_str().unwrap());
                assert_eq!(v["sequence_number"], i, "numbered once: {v}");
                if let Some(id) = v.get("item_id") {
                    assert_eq!(id, item);
                }
                if v["type"] == "response.output_text.delta" {
                    text.push_str(v["delta"].as_str().unwrap());
                }
            }
            assert_eq!(count(&|v| v["type"] == "response.created"), 1);
            assert_eq!(last["type"], "response.completed");
            assert_eq!(&last["response"]["id"], rid);
            let done = &last["response"]["output"][0];
            assert_eq!(&done["id"], item);
            assert_eq!(
                done["content"][0]["text"].as_str().unwrap(),
                text,
                "the summary holds the whole text"
            );
            let text_done = events
                .iter()
                .find(|(_, v)| v["type"] == "response.output_text.done")
                .unwrap();
            assert_eq!(text_done.1["text"].as_str().unwrap(), text);
        }
    }
    text
}

#[test]
fn a_cut_stream_is_continued_by_prefill_and_by_instruction_without_gap_or_repeat() {
    for shape in SHAPES {
        for (how, kind, fallback) in [
            (Continuation::Prefill, "prefill", "fb-ok"),
            (Continuation::Instruction, "resend", "fb-ok:resend=1"),
        ] {
            for (a, b) in [(1, 1), (7, 3), (64, 1000), (100_000, 100_000)] {
                let (gate, delivered) = gated(captured(shape, "cut"), a, false);
                let mut seen = Transcript::new(family(shape));
                for c in delivered.chunks(a) {
                    seen.observe(c);
                }
                assert_eq!(seen.text(), DELIVERED);
                assert!(seen.resumable() && !seen.finished() && gate.is_visible());

                let next = continuation_body(family(shape), request(shape).as_bytes(), &seen, how).unwrap();
                assert!(
                    continues(shape, &next, DELIVERED, how),
                    "{}",
                    String::from_utf8_lossy(&next)
                );
                let next: Value = serde_json::from_slice(&next).unwrap();
                assert_eq!(next["stream"], true);

                let rest = spliced(shape, &mut seen, captured(shape, kind), b);
                let whole = [delivered, rest].concat();
                assert_eq!(read_as_sdk(shape, &whole), FULL, "{shape:?} {kind} {a}/{b}");
                assert_eq!((seen.text(), seen.finished()), (FULL, true));
                // The answer names the model that answered, where the stream names
                // a model after its opening (Anthropic names it in message_start only).
                let model = if shape == Shape::Anthropic { PRIMARY } else { fallback };
                assert_eq!(seen.model(), Some(model), "{shape:?}");
                let output = if kind == "resend" { 9 } else { 4 };
                assert_eq!(seen.usage().and_then(|u| u.output_tokens), Some(output));
            }
        }
    }
}

#[test]
fn a_finish_without_terminator_is_complete_and_an_error_event_is_a_cut() {
    for shape in SHAPES {
        let (g, out) = gated(captured(shape, "no_done"), 13, true);
        let mut seen = Transcript::new(family(shape));
        seen.observe(&out);
        assert_eq!(seen.text(), "answer from fb-no-done: w1 w2 w3 w4 w5 w6");
        assert!(seen.finished() && !seen.resumable(), "{shape:?}");
        assert!(g.stream_error().is_none());
        let (g, out) = gated(captured(shape, "error"), 5, true);
        let mut seen = Transcript::new(family(shape));
        seen.observe(&out);
        assert_eq!(seen.text(), "answer from fb-stream-cut:k=2:end=error: w1");
        assert!(seen.resumable() && !seen.finished(), "{shape:?}");
        assert!(g.stream_error().is_some_and(|e| e.after_output), "{shape:?}");
    }
}

#[test]
fn usage_of_every_shape() {
    let want = [
        (
            Shape::Chat,
            Usage {
                input_tokens: Some(7),
                output_tokens: Some(4),
            },
        ),
        (
            Shape::Anthropic,
            Usage {
                input_tokens: Some(7),
                output_tokens: Some(4),
            },
        ),
        (
            Shape::Responses,
            Usage {
                input_tokens: Some(7),
                output_tokens: Some(4),
            },
        ),
    ];
    for (shape, usage) in want {
        let mut seen = Transcript::new(family(shape));
        seen.observe(captured(shape, "prefill"));
        assert_eq!(seen.usage(), Some(usage), "{shape:?}");
        let mut cut = Transcript::new(family(shape));
        cut.observe(captured(shape, "cut"));
        let expect = (shape == Shape::Anthropic).then_some(Usage {
            input_tokens: Some(2),
            output_tokens: Some(1),
        });
        assert_eq!(cut.usage(), expect, "{shape:?}: usage: null says nothing");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// For any cut point of the primary's stream, any answer length, any
    /// chunking of both streams, with or without a restated prefix: the
    /// caller's text is the primary's whole answer, exactly once.
    #[test]
    fn any_cut_and_chunking_splices_the_whole_answer(
        shape in prop::sample::select(SHAPES.to_vec()),
        n in 1u32..9,
        cut in any::<prop::sample::Index>(),
        resend in any::<bool>(),
        a in 1usize..80,
        b in 1usize..80,
    ) {
        let model = "fb-p";
        let full = answer(model, n);
        let frames_all = frames(&ctx(shape, model, 1, (2, n as u64 + 1)), &full, true, true);
        // Anywhere from the end of the first delta to the finish frame: a cut
        // after output, not a complete answer.
        let first: usize = frames_all[..2].iter().map(String::len).sum();
        let before_finish: usize = frames_all[..frames_all.len() - 1].iter().map(String::len).sum();
        let at = first + cut.index(before_finish - first + 1);
        let primary = frames_all.concat();
        let (_, delivered) = gated(&primary.as_bytes()[..at], a, false);
        let mut seen = Transcript::new(family(shape));
        seen.observe(&delivered);
        prop_assert!(seen.resumable() && !seen.text().is_empty());
        let m = (1..=full.len()).find(|&m| full[..m].concat() == seen.text());
        let m = m.expect("the caller holds whole deltas");
        let mut deltas: Vec<String> = full[m..].to_vec();
        if resend {
            deltas.insert(0, seen.text().to_owned());
        }
        let fallback = frames(&ctx(shape, "fb-ok", 2, (3, 4)), &deltas, true, true).concat();
        let rest = spliced(shape, &mut seen, fallback.as_bytes(), b);
        let whole = [delivered, rest].concat();
        prop_assert_eq!(read_as_sdk(shape, &whole), full.concat());
        prop_assert_eq!(seen.text(), full.concat());
        prop_assert!(seen.finished());
    }
}
