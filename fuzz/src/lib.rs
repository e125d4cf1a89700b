//! Helpers shared by the retrywise fuzz targets.

use retrywise_core::Headers;

/// Splits raw bytes into header lines (`\n`-separated, `name: value`; a line
/// without a colon is a value for `default_name`) and builds [`Headers`] the
/// way the bindings do: bytes that are not UTF-8 become U+FFFD.
pub fn headers_from_lines(data: &[u8], default_name: &str) -> Headers {
    let mut h = Headers::new();
    for line in data.split(|b| *b == b'\n') {
        let line = String::from_utf8_lossy(line);
        match line.split_once(':') {
            Some((name, value)) => h.insert(name.trim(), value.trim_start()),
            None => h.insert(default_name, &line),
        }
    }
    h
}
