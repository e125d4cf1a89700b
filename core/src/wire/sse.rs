//! An incremental reader of server-sent events, shared by the stream gate,
//! the transcript and the splicer, so every reader of a stream frames it the
//! same way (the SSE rules: lines end in LF, CRLF or CR; an event ends at a
//! blank line; `event:` and `data:` fields, several `data:` lines joined by
//! LF; `:` comments; a leading byte-order mark ignored).
//!
//! The reader owns a buffer of bytes not yet handed back: callers push what
//! arrived, take the complete events, and say how much of the buffer they are
//! done with ([`EventReader::consume`]). An event's position in the buffer
//! ([`Event::raw`]) lets a caller pass its exact bytes on, or cut it out
//! ([`EventReader::excise`]). A single `data:` line is read in place; only
//! several are joined into a copy. Bytes already searched for a line end are
//! not searched again, so a long line fed in small pieces costs its length once.
//!
//! ```
//! use retrywise::wire::sse::EventReader;
//!
//! let mut r = EventReader::new();
//! r.push(b"event: ping\ndata: {}\n\n: comment\n\ndata: a\ndata: b\n\ndata: par");
//! let e = r.next_event().unwrap();
//! assert_eq!((e.name, e.data), (&b"ping"[..], &b"{}"[..]));
//! let e = r.next_event().unwrap();
//! assert_eq!(e.data, b"a\nb"); // the comment block carried no data: no event
//! assert!(r.next_event().is_none()); // "data: par" waits for its blank line
//! assert_eq!(r.pending_start(), r.buffered().len() - b"data: par".len());
//! ```

use serde_json::Value;
use std::ops::Range;

/// A complete event, borrowed from the reader until its next call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event<'a> {
    /// The `event:` field (empty when absent).
    pub name: &'a [u8],
    /// The `data:` lines, joined by LF.
    pub data: &'a [u8],
    /// Where the event's lines sit in [`EventReader::buffered`], up to and
    /// including its blank line.
    pub raw: Range<usize>,
    /// Those bytes.
    pub bytes: &'a [u8],
    /// Some of the event's bytes were dropped ([`EventReader::drop_buffered`]):
    /// its name and data are not available.
    pub truncated: bool,
}

/// The data of the event being read.
#[derive(Debug, Clone, Default)]
enum Data {
    #[default]
    Empty,
    /// One `data:` line, in place in the buffer.
    Line(Range<usize>),
    /// Several lines, joined.
    Joined(Vec<u8>),
}

/// Reads server-sent events from bytes pushed in any chunking.
#[derive(Debug, Clone, Default)]
pub struct EventReader {
    buf: Vec<u8>,
    /// Offset of the next line to read.
    line: usize,
    /// Offset up to which no line end was found.
    searched: usize,
    /// Offset where the event being read began (after the last blank line).
    start: usize,
    /// The event being read: its `event:` field and data.
    name: Range<usize>,
    data: Data,
    has_data: bool,
    /// Whether a leading byte-order mark was looked for.
    bom_checked: bool,
    /// The event being read lost bytes to `drop_buffered`.
    truncated: bool,
    /// The line being read lost its beginning: ignore it up to its end.
    skip_line: bool,
    /// No more bytes will come: a final CR ends its line.
    closed: bool,
    /// The data of the event last returned, when it was joined.
    joined: Vec<u8>,
}

impl EventReader {
    /// An empty reader at the start of a stream.
    pub fn new() -> EventReader {
        EventReader::default()
    }

    /// Appends bytes that arrived.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The stream ended: a last CR ends its line instead of waiting for a LF.
    /// An event without its blank line is never complete.
    pub fn close(&mut self) {
        self.closed = true;
    }

    /// Bytes pushed and not yet consumed.
    pub fn buffered(&self) -> &[u8] {
        &self.buf
    }

    /// Offset in [`EventReader::buffered`] where the event being read
    /// begins: everything before it is complete events, comments and blank lines.
    pub fn pending_start(&self) -> usize {
        self.start
    }

    /// How far the search for line ends got (bytes from the start of the buffer).
    pub fn searched(&self) -> usize {
        self.searched
    }

    /// Forgets the first `n` buffered bytes, which must lie before the event
    /// being read (`n <= pending_start()`).
    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.start);
        if n == 0 {
            return;
        }
        self.buf.drain(..n);
        self.line -= n;
        self.start -= n;
        self.searched = self.searched.saturating_sub(n);
        self.name = shift(&self.name, n);
        if let Data::Line(r) = &self.data {
            self.data = Data::Line(shift(r, n));
        }
    }

    /// Removes the bytes of the event just returned (its `raw` range), as if
    /// it never came.
    pub fn excise(&mut self, raw: Range<usize>) {
        debug_assert!(raw.end == self.line && raw.end == self.start);
        let len = raw.len();
        self.buf.drain(raw);
        self.line -= len;
        self.start -= len;
        self.searched = self.searched.saturating_sub(len);
    }

    /// Drops every buffered byte (a caller that passed them on and will not
    /// hold more). The event being read, if any, comes out `truncated`; the
    /// line being read is ignored up to its end.
    pub fn drop_buffered(&mut self) {
        let mid_line = self.line < self.buf.len();
        if self.start < self.buf.len() {
            self.truncated = true;
        }
        self.skip_line |= mid_line;
        self.buf.clear();
        (self.line, self.searched, self.start) = (0, 0, 0);
        self.name = 0..0;
        self.data = Data::Empty;
    }

    /// The next complete event, if one arrived. Blocks of only comments or
    /// fields without data complete no event (SSE dispatches none for them).
    pub fn next_event(&mut self) -> Option<Event<'_>> {
        if !self.bom_checked {
            const BOM: &[u8] = b"\xef\xbb\xbf";
            if self.buf.len() < BOM.len() && BOM.starts_with(&self.buf) && !self.closed {
                return None;
            }
            self.bom_checked = true;
            if self.buf.starts_with(BOM) {
                (self.line, self.searched, self.start) = (BOM.len(), BOM.len(), BOM.len());
            }
        }
        let raw = loop {
            let rest = &self.buf[self.line..];
            // Bytes already searched hold no line end.
            let from = self.searched.saturating_sub(self.line);
            let Some(end) = memchr::memchr2(b'\n', b'\r', &rest[from..]).map(|i| from + i) else {
                self.searched = self.buf.len();
                return None;
            };
            // A CR at the end may be the first half of a CRLF: wait for the next byte.
            let next = match rest[end] {
                b'\r' if end + 1 == rest.len() && !self.closed => {
                    self.searched = self.line + end;
                    return None;
                }
                b'\r' if rest.get(end + 1) == Some(&b'\n') => end + 2,
                _ => end + 1,
            };
            let (at, len) = (self.line, end);
            self.line += next;
            if std::mem::take(&mut self.skip_line) {
                continue;
            }
            if len == 0 {
                let raw = self.start..self.line;
                self.start = self.line;
                if std::mem::take(&mut self.has_data) {
                    break raw;
                }
                self.name = 0..0;
                self.truncated = false;
                continue;
            }
            self.field(at, len);
        };
        let truncated = std::mem::take(&mut self.truncated);
        let name = std::mem::replace(&mut self.name, 0..0);
        let data = match std::mem::take(&mut self.data) {
            Data::Empty => {
                self.joined.clear();
                None
            }
            Data::Line(r) => Some(r),
            Data::Joined(v) => {
                self.joined = v;
                None
            }
        };
        let this = &*self;
        let data = match data {
            Some(r) => &this.buf[r],
            None => &this.joined[..],
        };
        Some(Event {
            name: if truncated { &[] } else { &this.buf[name] },
            data: if truncated { &[] } else { data },
            bytes: &this.buf[raw.clone()],
            raw,
            truncated,
        })
    }

    /// Reads one non-empty line at `at`, `len` bytes long.
    fn field(&mut self, at: usize, len: usize) {
        let line = &self.buf[at..at + len];
        let (field, value) = match memchr::memchr(b':', line) {
            Some(0) => return, // a comment
            Some(i) => {
                let v = at + i + 1;
                (&line[..i], if self.buf.get(v) == Some(&b' ') { v + 1 } else { v })
            }
            None => (line, at + len),
        };
        let value = value..at + len;
        match field {
            b"event" => self.name = value,
            b"data" => {
                self.data = match std::mem::take(&mut self.data) {
                    // The first line, or the first after a truncation (whose data is gone).
                    Data::Empty => Data::Line(value),
                    Data::Line(first) => {
                        let mut v = self.buf[first].to_vec();
                        v.push(b'\n');
                        v.extend_from_slice(&self.buf[value]);
                        Data::Joined(v)
                    }
                    Data::Joined(mut v) => {
                        v.push(b'\n');
                        v.extend_from_slice(&self.buf[value]);
                        Data::Joined(v)
                    }
                };
                self.has_data = true;
            }
            _ => {} // id, retry, unknown fields: nothing for a reader
        }
    }
}

fn shift(r: &Range<usize>, n: usize) -> Range<usize> {
    r.start.saturating_sub(n)..r.end.saturating_sub(n)
}

/// Whether an SSE event (its `event:` name and `data:`) carries output.
/// Only known preamble shapes are not: anything else counts as output.
pub fn meaningful(name: &[u8], data: &[u8]) -> bool {
    if OPENING_EVENTS.iter().any(|e| e.as_bytes() == name) {
        return false;
    }
    match serde_json::from_slice::<Value>(data) {
        Ok(v) => !preamble(&v),
        Err(_) => true,
    }
}

/// Events (by `event:` name or JSON `type`) that only open or keep alive an
/// answer: Anthropic's and the OpenAI Responses API's.
const OPENING_EVENTS: &[&str] = &[
    "ping",
    "message_start",
    "response.created",
    "response.queued",
    "response.in_progress",
];

/// A JSON event payload that only opens the answer: no text, tool call,
/// refusal, log-probabilities or finish reason in it.
fn preamble(v: &Value) -> bool {
    match v.get("type").and_then(Value::as_str) {
        // Anthropic and the OpenAI Responses API.
        Some(t) if OPENING_EVENTS.contains(&t) => true,
        Some("content_block_start") => v.get("content_block").is_some_and(|b| {
            matches!(b.get("type").and_then(Value::as_str), Some("text" | "thinking")) && empty_except(b, &["type"])
        }),
        Some("response.output_item.added") => {
            v.get("item")
                .is_some_and(|i| match i.get("type").and_then(Value::as_str) {
                    Some("message") => empty_except(i, &["type", "id", "role", "status"]),
                    // Reasoning starts; its summary, once it has one, is output.
                    Some("reasoning") => empty_except(i, &["type", "id", "status", "encrypted_content"]),
                    _ => false,
                })
        }
        Some("response.content_part.added") => v.get("part").is_some_and(|p| empty_except(p, &["type"])),
        Some(_) => false,
        // OpenAI chat completion chunks (`choices: []` opens Azure streams). A
        // choice's other members (a legacy completion's `text`, a finish
        // reason, log-probabilities) are output unless empty.
        None => v.get("choices").and_then(Value::as_array).is_some_and(|choices| {
            empty_except(v, CHUNK_META)
                && choices.iter().all(|c| {
                    c.get("delta").is_none_or(|d| empty_except(d, &["role"]))
                        && empty_except(c, &["index", "delta", "content_filter_results"])
                })
        }),
    }
}

/// Members of an OpenAI chat completion chunk that describe it rather than carry output.
const CHUNK_META: &[&str] = &[
    "id",
    "object",
    "created",
    "model",
    "system_fingerprint",
    "service_tier",
    "choices",
    "prompt_filter_results",
    "obfuscation",
    "x_groq",
];

/// `v` is an object whose members other than `keep` are all empty.
fn empty_except(v: &Value, keep: &[&str]) -> bool {
    v.as_object()
        .is_some_and(|o| o.iter().all(|(k, x)| keep.contains(&k.as_str()) || empty(x)))
}

/// Null, `""`, `[]`, `{}`, or an object of empty members.
fn empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.values().all(empty),
        Value::Bool(_) | Value::Number(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every event of `bytes` fed in pieces of `sizes`: (name, data, raw bytes).
    fn read(bytes: &[u8], sizes: &[usize]) -> Vec<(String, String, String)> {
        let mut r = EventReader::new();
        let mut out = Vec::new();
        let (mut i, mut k) = (0, 0);
        let take = |r: &mut EventReader, out: &mut Vec<_>| {
            while let Some(e) = r.next_event() {
                let s = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
                out.push((s(e.name), s(e.data), s(e.bytes)));
            }
            let n = r.pending_start();
            r.consume(n);
        };
        while i < bytes.len() {
            let n = sizes.get(k % sizes.len().max(1)).copied().unwrap_or(bytes.len()).max(1);
            let n = n.min(bytes.len() - i);
            r.push(&bytes[i..i + n]);
            take(&mut r, &mut out);
            i += n;
            k += 1;
        }
        r.close();
        take(&mut r, &mut out);
        out
    }

    fn ev(name: &str, data: &str, raw: &str) -> (String, String, String) {
        (name.into(), data.into(), raw.into())
    }

    #[test]
    fn fields_comments_and_line_ends() {
        let body =
            "\u{feff}: hi\n\nevent: a\r\ndata: 1\r\n\r\nid: 7\nretry: 10\n\ndata:2\rdata:  3\r\rdata\n\ndata\ndata\n\n";
        assert_eq!(
            read(body.as_bytes(), &[]),
            [
                ev("a", "1", "event: a\r\ndata: 1\r\n\r\n"),
                ev("", "2\n 3", "data:2\rdata:  3\r\r"),
                ev("", "", "data\n\n"),
                ev("", "\n", "data\ndata\n\n"),
            ]
        );
    }

    #[test]
    fn a_final_cr_waits_for_a_possible_lf_until_the_stream_closes() {
        let mut r = EventReader::new();
        r.push(b"data: x\r\r");
        assert!(r.next_event().is_none(), "the last CR may be half a CRLF");
        r.close();
        assert_eq!(r.next_event().map(|e| e.data.to_vec()), Some(b"x".to_vec()));
    }

    #[test]
    fn excise_removes_an_event_in_place() {
        let mut r = EventReader::new();
        r.push(b"data: 1\n\ndata: bad\n\ndata: 3\n\n");
        r.next_event().unwrap();
        let raw = r.next_event().unwrap().raw;
        r.excise(raw);
        assert_eq!(r.next_event().unwrap().data, b"3");
        assert_eq!(r.buffered(), b"data: 1\n\ndata: 3\n\n");
    }

    #[test]
    fn dropped_bytes_truncate_the_event_and_skip_the_rest_of_the_line() {
        let mut r = EventReader::new();
        r.push(b"data: 1\n\nevent: big\ndata: xxxx");
        assert_eq!(r.next_event().unwrap().data, b"1");
        assert!(r.next_event().is_none());
        r.drop_buffered();
        r.push(b"xxx\ndata: more\n\ndata: 2\n\n");
        let e = r.next_event().unwrap();
        assert!(e.truncated && e.name.is_empty() && e.data.is_empty());
        assert_eq!(r.next_event().unwrap().data, b"2");
    }

    proptest! {
        /// Chunking never changes the events read.
        #[test]
        fn chunking_never_changes_the_events(
            pieces in prop::collection::vec(0usize..8, 0..24),
            sizes in prop::collection::vec(1usize..12, 1..20),
        ) {
            const P: [&str; 8] = [
                "data: {\"a\":1}\n\n", "event: e\ndata: x\n\n", ": c\n\n", "data: a\r\ndata: b\r\n\r\n",
                "id: 1\n\n", "data: r\r\r", "data:\n\n", "\n",
            ];
            let body: String = pieces.iter().map(|&i| P[i]).collect();
            prop_assert_eq!(read(body.as_bytes(), &sizes), read(body.as_bytes(), &[]));
        }
    }
}
