//! A deliberately minimal HTTP/1.1 client for the fault server's tests: the point
//! is to see exactly what goes over the wire (a missing chunk terminator, a
//! connection closed or reset before any byte), which a full client library would
//! hide behind its own errors.
#![allow(dead_code)] // each test binary uses its own subset

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use retrywise_fault_server::{spawn_background, ServerHandle};
use serde_json::Value;

/// Upper bound for any single read; no test legitimately waits this long.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug)]
pub struct Reply {
    /// 0 when the server sent nothing at all.
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// Body with chunked framing removed.
    pub body: Vec<u8>,
    /// Whether the body was properly terminated (content-length reached or the
    /// final zero-size chunk seen).
    pub complete: bool,
    pub raw_len: usize,
    /// The connection ended with a reset (RST) rather than a close (FIN).
    pub reset: bool,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("body is JSON")
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Parses whatever arrived before EOF; tolerant of truncation by design.
pub fn parse(raw: &[u8]) -> Reply {
    let Some(head_end) = find(raw, b"\r\n\r\n") else {
        return Reply {
            status: 0,
            headers: vec![],
            body: vec![],
            complete: false,
            raw_len: raw.len(),
            reset: false,
        };
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let rest = &raw[head_end + 4..];
    let mut reply = Reply {
        status,
        headers,
        body: vec![],
        complete: false,
        raw_len: raw.len(),
        reset: false,
    };
    if let Some(len) = reply.header("content-length") {
        let len: usize = len.parse().expect("content-length");
        reply.complete = rest.len() >= len;
        reply.body = rest[..len.min(rest.len())].to_vec();
    } else if reply.header("transfer-encoding") == Some("chunked") {
        let mut at = 0;
        while let Some(line_end) = find(&rest[at..], b"\r\n") {
            let size_text = String::from_utf8_lossy(&rest[at..at + line_end]).into_owned();
            let size = usize::from_str_radix(size_text.trim(), 16).expect("chunk size");
            at += line_end + 2;
            if size == 0 {
                reply.complete = true;
                break;
            }
            if rest.len() < at + size + 2 {
                reply.body.extend_from_slice(&rest[at.min(rest.len())..]);
                break;
            }
            reply.body.extend_from_slice(&rest[at..at + size]);
            at += size + 2;
        }
    } else {
        reply.body = rest.to_vec();
        reply.complete = true;
    }
    reply
}

pub fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(READ_TIMEOUT)).expect("timeout");
    stream
}

pub fn send(stream: &mut TcpStream, method: &str, path: &str, headers: &[(&str, &str)], body: &str) {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        req.push_str(&format!("{name}: {value}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    stream.write_all(req.as_bytes()).expect("write request");
}

/// Sends one request and reads until the server closes the connection.
pub fn call(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let mut stream = connect(addr);
    send(&mut stream, method, path, headers, body);
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    let reset = loop {
        match stream.read(&mut buf) {
            Ok(0) => break false,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            // An abortive close is still "the server went away".
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break true,
            Err(e) => panic!("read failed: {e}"),
        }
    };
    Reply { reset, ..parse(&raw) }
}

pub fn post(addr: SocketAddr, path: &str, body: &str) -> Reply {
    call(addr, "POST", path, &[], body)
}

pub fn post_as(addr: SocketAddr, path: &str, logical_id: &str) -> Reply {
    call(addr, "POST", path, &[("retrywise-request-id", logical_id)], "{}")
}

pub fn get_json(addr: SocketAddr, path: &str) -> Value {
    let reply = call(addr, "GET", path, &[], "");
    assert_eq!(reply.status, 200, "{path}: {}", reply.text());
    reply.json()
}

pub fn server() -> (SocketAddr, ServerHandle) {
    spawn_background().expect("start fault server")
}

/// The values of every SSE line starting with `field` (e.g. `"data: "`).
fn sse_field(reply: &Reply, field: &str) -> Vec<String> {
    reply
        .text()
        .lines()
        .filter_map(|l| l.strip_prefix(field))
        .map(str::to_owned)
        .collect()
}

pub fn sse_data_lines(reply: &Reply) -> Vec<String> {
    sse_field(reply, "data: ")
}

pub fn sse_events(reply: &Reply) -> Vec<String> {
    sse_field(reply, "event: ")
}

/// A request whose response is read piece by piece, to see when bytes arrive and
/// whether the connection stays open.
pub struct Live {
    stream: TcpStream,
    /// Everything received so far (head and body, chunked framing included).
    pub raw: Vec<u8>,
}

impl Live {
    pub fn open(addr: SocketAddr, path: &str, body: &str) -> Self {
        let mut stream = connect(addr);
        send(&mut stream, "POST", path, &[], body);
        Live {
            stream,
            raw: Vec::new(),
        }
    }

    /// Reads until `needle` has arrived; returns when it did. Panics when the
    /// connection ends first or nothing arrives for [`READ_TIMEOUT`].
    pub fn until(&mut self, needle: &str) -> std::time::Instant {
        self.stream.set_read_timeout(Some(READ_TIMEOUT)).expect("timeout");
        let mut buf = [0u8; 8192];
        while find(&self.raw, needle.as_bytes()).is_none() {
            match self.stream.read(&mut buf) {
                Ok(0) => panic!("closed before {needle:?}; got {:?}", String::from_utf8_lossy(&self.raw)),
                Ok(n) => self.raw.extend_from_slice(&buf[..n]),
                Err(e) => panic!("no {needle:?} ({e}); got {:?}", String::from_utf8_lossy(&self.raw)),
            }
        }
        std::time::Instant::now()
    }

    /// Everything received so far, as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.raw).into_owned()
    }

    /// True when nothing arrives for `wait` and the connection stays open.
    pub fn quiet_for(&mut self, wait: Duration) -> bool {
        self.stream.set_read_timeout(Some(wait)).expect("timeout");
        let mut buf = [0u8; 64];
        matches!(self.stream.read(&mut buf), Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut))
    }

    /// Reads to the end of the connection and parses everything received.
    pub fn finish(mut self) -> Reply {
        self.stream.set_read_timeout(Some(READ_TIMEOUT)).expect("timeout");
        let mut buf = [0u8; 8192];
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => self.raw.extend_from_slice(&buf[..n]),
            }
        }
        parse(&self.raw)
    }
}

/// Polls `/control/requests?<query>` until its only record has ended (is no longer
/// `pending`), for at most [`READ_TIMEOUT`]; returns that record.
pub fn ended_record(addr: SocketAddr, query: &str) -> Value {
    let deadline = std::time::Instant::now() + READ_TIMEOUT;
    loop {
        let records = get_json(addr, &format!("/control/requests?{query}"));
        let list = records.as_array().expect("array");
        assert_eq!(list.len(), 1, "{records}");
        if list[0]["end"] != "pending" {
            return list[0].clone();
        }
        assert!(std::time::Instant::now() < deadline, "still pending: {records}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
